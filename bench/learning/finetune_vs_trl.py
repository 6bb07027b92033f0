"""SFT and DPO training speed, gymloop's fine-tuning trainer (finetune/methods.py, what API jobs
run) against TRL's `SFTTrainer` / `DPOTrainer`, on the same rows, model, batch size and steps,
in one run: nano with every weight trained, and SmolLM2-135M-Instruct with LoRA (same rank,
alpha and target modules on both sides).

    python -m bench.learning.finetune_vs_trl [--repeats 3] [--nano-steps 30] [--smol-steps 8] [--only nano|smollm2]

Three cases per model: SFT, SFT with a system prompt before every row (the common prefix a real
data set often has, which gymloop runs once per batch), and DPO.

Both sides: float32, one torch thread, no gradient checkpointing, no evaluation or saving
inside the timed steps; DPO's reference log-probs computed before training on both sides (TRL:
precompute_ref_log_probs). Tokens/s = the non-padding tokens of the timed steps (the same rows on
both sides: one epoch) / the seconds from the end of step 1 to the end of the last step (step 1
holds one-time work on both sides). Median of --repeats runs, alternating the two.
"""
from __future__ import annotations

BENCH = {"results": "learning/finetune_vs_trl", "minutes": 20,
         "measures": ("SFT and DPO training tokens/s, the fine-tuning jobs' trainer vs TRL `SFTTrainer` / `DPOTrainer`,"
                      " same rows, model, batch and steps: nano (every weight) and SmolLM2-135M-Instruct with LoRA; "
                      "SFT, SFT with a system prompt, DPO")}   # found by bench/run_all.py

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import common
import torch

from gymloop.bases.registry import resolve_model
from gymloop.finetune import methods as fm
from gymloop.models.checkpoint import load_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# what both sides run with (theirs(): gradient_checkpointing=False, use_cpu, no bf16/fp16)
SETTINGS = ("1 process, {threads} torch thread(s), float32, no gradient checkpointing, no evaluation or saving "
            "in the timed steps, constant lr, DPO reference log-probs precomputed")


def rows(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        out.append((f"{a}+{b}=", str(a + b), str(a + b + rng.choice([-10, -1, 1, 10]))))
    return out


SYSTEM = "You are a calculator. Add the two numbers and answer with the sum only."
# name -> (method, system prompt or None)
CASES = {"SFT": ("supervised", None), "SFT, system prompt": ("supervised", SYSTEM), "DPO": ("dpo", None)}


def prompt(p: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": p}]


def ours(method: str, model_dir: Path, data, batch: int, lr: float, lora: dict | None,
         system: str | None = None, methods=None, final: list | None = None) -> tuple[float, int]:
    """(steady seconds, steady tokens) of one epoch through train_tokens (of `methods`, another
    commit's finetune.methods module in learning/finetune_ab.py; default this checkout's); the trained
    model's directory is appended to `final` when given."""
    m = methods or fm
    if method == "supervised":
        r = [{"messages": prompt(p, system) + [{"role": "assistant", "content": c}]} for p, c, _ in data]
    else:
        r = [{"input": {"messages": prompt(p, system)},
              "preferred_output": [{"role": "assistant", "content": c}],
              "non_preferred_output": [{"role": "assistant", "content": w}]} for p, c, w in data]
    marks: list[tuple[float, int]] = []
    hp = m.Hyper(n_epochs=1, batch_size=batch, learning_rate=lr, lora=lora)
    progress = m.Progress(on_metrics=lambda x: marks.append((time.perf_counter(), x["trained_tokens"])),
                          on_checkpoint=lambda *a: None, should_stop=lambda: None, checkpoint_every=10**9)
    out = m.train_tokens(method, m.JobRun(model_dir, None, r, None, hp, 0, Path(tempfile.mkdtemp())), progress)
    if final is not None:
        final.append(Path(out["final"]))
    return marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]


def theirs(method: str, model_dir: Path, data, batch: int, lr: float, lora: dict | None,
           system: str | None = None) -> float:
    """Steady seconds of one epoch of TRL on the same rows."""
    from datasets import Dataset
    from transformers import TrainerCallback

    model, tok = load_model(model_dir)
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    common_args = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, num_train_epochs=1,
                       learning_rate=lr, report_to=[], use_cpu=True, bf16=False, fp16=False, save_strategy="no",
                       logging_steps=10**6, disable_tqdm=True, gradient_checkpointing=False, dataloader_num_workers=0,
                       max_length=None, lr_scheduler_type="constant", warmup_steps=0)
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0, target_modules=lora["target_modules"],
                          task_type="CAUSAL_LM")
    # the Trainer prints its summary dict, and DPOTrainer (1.16: when built) a progress bar of the
    # reference pass
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if method == "supervised":
            from trl import SFTConfig, SFTTrainer

            ds = Dataset.from_list([{"prompt": prompt(p, system),
                                     "completion": [{"role": "assistant", "content": c}]} for p, c, _ in data])
            trainer = SFTTrainer(model=model, args=SFTConfig(**common_args), train_dataset=ds, processing_class=tok.hf,
                                 peft_config=peft, callbacks=[Clock()])
        else:
            from trl import DPOConfig, DPOTrainer

            ds = Dataset.from_list([{"prompt": prompt(p, system), "chosen": [{"role": "assistant", "content": c}],
                                     "rejected": [{"role": "assistant", "content": w}]} for p, c, w in data])
            trainer = DPOTrainer(model=model, args=DPOConfig(**common_args, beta=0.1, precompute_ref_log_probs=True),
                                 train_dataset=ds, processing_class=tok.hf, peft_config=peft, callbacks=[Clock()])
        trainer.train()
    return ends[-1] - ends[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nano-steps", type=int, default=30)
    ap.add_argument("--nano-batch", type=int, default=16)
    ap.add_argument("--smol-steps", type=int, default=8)
    ap.add_argument("--smol-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=["nano", "smollm2"], help="one model instead of both")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)       # TrainingArguments' renamed fields
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()
    cases = []
    if args.only != "smollm2":
        cases.append(("nano", resolve_model("nano", progress=False), args.nano_steps, args.nano_batch, None, 1e-3))
    from gymloop.bases.smollm2 import available

    if args.only != "nano" and available() is None:
        cases.append(("SmolLM2-135M + LoRA", resolve_model("smollm2", progress=False), args.smol_steps, args.smol_batch,
                      {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": TARGETS}, 1e-4))
    elif args.only != "nano":
        print(f"SmolLM2 skipped: {available()}")
    table = [["model", "case", "batch", "steps", "gymloop tok/s", "TRL tok/s", "ratio"]]
    out = []
    for name, path, steps, batch, lora, lr in cases:
        data = rows(steps * batch)
        for case, (method, system) in CASES.items():
            ours_s, theirs_s, tokens = [], [], 0
            for i in range(args.repeats):      # alternating which side runs first, as learning/finetune_ab.py does
                for side in (("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")):
                    if side == "ours":
                        sec, tokens = ours(method, path, data, batch, lr, lora, system)
                        ours_s.append(sec)
                    else:
                        theirs_s.append(theirs(method, path, data, batch, lr, lora, system))
            a, b = tokens / statistics.median(ours_s), tokens / statistics.median(theirs_s)
            table.append([name, case, batch, steps, f"{a:,.0f}", f"{b:,.0f}", f"{a / b:.2f}x"])
            out.append({"model": name, "case": case, "method": method, "batch": batch, "steps": steps, "tokens": tokens,
                        "gymloop_seconds": ours_s, "trl_seconds": theirs_s, "ratio": a / b})
            print(common.table(table[:1] + table[-1:], record=False), flush=True)
    title = (f"SFT / DPO training tokens/s vs TRL, median of {args.repeats} (alternating first side); tokens of "
             f"steps 2..N. Both sides: {SETTINGS.format(threads=args.threads)}")
    print(f"\n{title}")
    print(common.table(table, title=title))
    import trl

    common.save("learning/finetune_vs_trl", {"args": vars(args), "results": out, "trl": trl.__version__,
                                    "settings": SETTINGS.format(threads=args.threads)})


if __name__ == "__main__":
    sys.exit(main())
