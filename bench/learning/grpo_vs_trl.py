"""Time to a held-out accuracy: gymloop GRPO vs TRL's GRPOTrainer on equal terms.

    python -m bench.learning.grpo_vs_trl [--bases 0 1 2] [--task-seeds 0 1] [--gain 0.15] [--budget 240]

One *cell* per (base, task seed): the nano base pre-trained from that seed (`nano:seed=N`), the
task seed choosing the held-out tasks, the train stream and the sampling seed of every system.
The target is the base's own held-out pass@1 + `--gain` on those held-out tasks. In every cell
each system trains from the same base until the target or `--budget` training seconds; the
systems run in a different order in each cell (rotated), so none always runs first or last.

The systems (SYSTEMS below; `--systems` picks some):
- `gymloop sync` vs `TRL`: the like-for-like pair. Both: 1 torch thread, float32, no gradient
  checkpointing, 16 prompts x 8 samples per step, <= 6 new tokens at T=1, AdamW(0.9, 0.999), lr
  with 20 linear warm-up steps then constant, grad-norm clip 1.0, no weight decay, no KL, token-level
  clipped ratio (0.2 / 0.28) over *all* completions of the step (gymloop `drop_zero_signal: false`,
  TRL `loss_type: dapo`), one optimizer step per generation batch. Left different: the group's std
  (gymloop population, TRL sample: advantages x 0.935 in TRL, which AdamW's normalisation all but
  cancels) and the train-task stream (gymloop draws fresh tasks each step, TRL cycles a fixed list
  of 8,000 from the same seed; same distribution).
- `gymloop sync, filtered`: gymloop's default, groups whose rewards are all equal left out of the
  token mean (a different loss: labelled, never the like-for-like figure).
- `gymloop async` vs `TRL, 2 threads`: gymloop's collector process (1 thread) generates the next
  batch while the trainer (1 thread) trains, staleness 1: two cores, so against TRL on two
  threads, i.e. the same two cores. Same loss as the like-for-like pair.

The clock counts training only (evaluation every `--every` steps is paused out of both).
Reported per system, over all cells: steps and seconds to the target, seconds per step and
sampled tokens per second (speed, separate from how many steps learning needs), and the paired
ratios against its TRL row (TRL seconds / gymloop seconds, per cell). Raw results of every run go
to bench/results/learning/grpo_vs_trl/.
"""
from __future__ import annotations

BENCH = {"results": "learning/grpo_vs_trl", "minutes": 30,
         "measures": ("GRPO against TRL's `GRPOTrainer` on equal terms (same loss over all groups, no gradient "
                      "checkpointing on either side, equal cores per pair): seconds and steps to the base's held-out "
                      "pass@1 + 15 points on 2-digit addition, seconds per step and sampled tokens/s, on 3 nano bases x"
                      " 2 task seeds, the systems' order rotated; also gymloop's default (filtered groups) and "
                      "asynchronous (2 cores, against TRL on 2 threads) rows")}   # found by bench/run_all.py

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench import common
import torch

from gymloop.bases.registry import resolve_model
from gymloop.config import EvalConfig, GRPOConfig, SamplingConfig, TrainConfig
from gymloop.engine import NativeEngine
from gymloop.envs import ArithEnv
from gymloop.envs.arith import parse_answer
from gymloop.models.checkpoint import load_model
from gymloop.orchestrator.train import train
from gymloop.rollout.evaluate import evaluate

G, PROMPTS, NEW_TOKENS, WARMUP, BETAS, CLIP = 8, 16, 6, 20, (0.9, 0.999), (0.2, 0.28)


@dataclass(frozen=True)
class System:
    kind: str            # "gymloop" or "trl"
    threads: int         # torch threads of the trainer's process
    cores: int           # cores the system keeps busy
    against: str | None  # the TRL system its ratio is taken against (None: it is a TRL row)
    label: str           # how the table names its loss / set-up
    drop_zero_signal: bool = False
    max_staleness: int = 0


SYSTEMS: dict[str, System] = {
    "gymloop sync": System("gymloop", 1, 1, "TRL", "all groups (like-for-like)"),
    "gymloop sync, filtered": System("gymloop", 1, 1, "TRL", "zero-signal groups dropped (gymloop default)",
                                     drop_zero_signal=True),
    "gymloop async": System("gymloop", 1, 2, "TRL, 2 threads", "all groups; trainer + collector process, staleness 1",
                            max_staleness=1),
    "TRL": System("trl", 1, 1, None, "loss_type dapo (all completions)"),
    "TRL, 2 threads": System("trl", 2, 2, None, "loss_type dapo (all completions)"),
}


def run_gymloop(sys_: System, model: str, seed: int, target: float, args) -> dict:
    """One gymloop run from `model` until `target` held-out pass@1 or the budget."""
    cfg = TrainConfig(
        model=model, name="bench-gymloop", run_dir=tempfile.mkdtemp(), threads=sys_.threads, seed=seed,
        sampling=SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0),
        grpo=GRPOConfig(steps=args.max_steps, prompts_per_step=PROMPTS, group_size=G, lr=args.lr,
                        warmup_steps=WARMUP, betas=BETAS, clip_low=CLIP[0], clip_high=CLIP[1], weight_decay=0.0,
                        max_grad_norm=1.0, beta=0.0, loss="grpo", loss_agg="token-mean", advantage="grpo",
                        drop_zero_signal=sys_.drop_zero_signal, max_staleness=sys_.max_staleness),
        eval=EvalConfig(tasks=args.tasks, every=args.every, max_new_tokens=NEW_TOKENS),
        stop_at_pass1=target,
    )

    def budget(step, metrics, save):
        return "budget" if "heldout_pass1" in metrics and metrics["train_seconds"] > args.budget else None

    torch.set_num_threads(sys_.threads)
    s = train(cfg, progress=False, echo=lambda m: None, on_step=budget)
    events = [json.loads(line) for line in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    tokens = sum(e["generated_tokens"] for e in events if e["kind"] == "train")
    return {"curve": s["pass1_curve"], "base": s["base"]["pass1"], "sampled_tokens": tokens,
            "zero_signal_group_fraction": s["zero_signal_group_fraction"], "settings": gymloop_settings(cfg, sys_)}


def gymloop_settings(cfg: TrainConfig, sys_: System) -> dict:
    g = cfg.grpo
    return {"torch_threads": sys_.threads, "processes": 2 if g.max_staleness else 1, "cores": sys_.cores,
            "precision": str(torch.get_default_dtype()).removeprefix("torch."), "gradient_checkpointing": False,
            "lr": g.lr, "warmup_steps": g.warmup_steps, "lr_schedule": g.lr_schedule, "betas": list(g.betas),
            "weight_decay": g.weight_decay, "max_grad_norm": g.max_grad_norm, "clip": [g.clip_low, g.clip_high],
            "kl_beta": g.beta, "advantage": f"{g.advantage} (population std)", "loss": g.loss,
            "loss_agg": g.loss_agg, "drop_zero_signal": g.drop_zero_signal, "max_staleness": g.max_staleness,
            "prompts_per_step": g.prompts_per_step, "group_size": g.group_size,
            "max_new_tokens": cfg.sampling.max_new_tokens, "temperature": cfg.sampling.temperature}


def run_trl(sys_: System, model_spec: str, seed: int, target: float, args) -> dict:
    """TRL's GRPOTrainer from the same base, on the same held-out tasks, to the same target."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    torch.set_num_threads(sys_.threads)
    model, tok = load_model(resolve_model(model_spec, progress=False))
    env = ArithEnv()
    held = env.sample_tasks(args.tasks, "heldout", seed=seed)
    train_tasks = env.sample_tasks(8000, "train", seed=seed)   # TRL cycles through it
    ds = Dataset.from_list([{"prompt": list(t.prompt), "answer": t.answer} for t in train_tasks])
    sampled = {"tokens": 0}

    def reward(prompts, completions, answer, completion_ids, **kw):
        sampled["tokens"] += sum(len(c) for c in completion_ids)
        return [float(parse_answer(c[0]["content"]) == a) for c, a in zip(completions, answer)]

    curve, clock = [], {"paused": 0.0, "t0": 0.0}

    def held_out() -> float:
        return evaluate(NativeEngine(model, tok.pad_token_id), tok, env, held, max_new_tokens=NEW_TOKENS).pass1

    class Eval(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            clock["t0"] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if state.global_step % args.every:
                return
            t_pause = time.perf_counter()
            acc = held_out()
            model.train()
            elapsed = t_pause - clock["t0"] - clock["paused"]
            clock["paused"] += time.perf_counter() - t_pause
            curve.append({"step": state.global_step, "pass1": acc, "train_seconds": elapsed})
            if acc >= target or elapsed > args.budget:
                control.should_training_stop = True

    curve.append({"step": 0, "pass1": held_out(), "train_seconds": 0.0})
    cfg = TRLConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        learning_rate=args.lr, adam_beta1=BETAS[0], adam_beta2=BETAS[1], weight_decay=0.0, max_grad_norm=1.0,
        warmup_steps=WARMUP, lr_scheduler_type="constant_with_warmup", beta=0.0, epsilon=CLIP[0],
        epsilon_high=CLIP[1], loss_type="dapo", scale_rewards="group", per_device_train_batch_size=PROMPTS * G,
        num_generations=G, max_completion_length=NEW_TOKENS, max_steps=args.max_steps, temperature=1.0,
        top_p=1.0, logging_steps=10_000, save_strategy="no", report_to=[], seed=seed, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                          processing_class=tok.hf, callbacks=[Eval()])
    settings = trl_settings(cfg, trainer, sys_)
    with contextlib.redirect_stdout(io.StringIO()):    # the Trainer prints its summary dict at the end
        trainer.train()
    return {"curve": curve, "base": curve[0]["pass1"], "sampled_tokens": sampled["tokens"], "settings": settings}


def trl_settings(cfg, trainer, sys_: System) -> dict:
    """What TRL actually ran with, read back from its config and model, not from our intent."""
    import trl

    return {"trl": trl.__version__, "torch_threads": torch.get_num_threads(), "processes": 1, "cores": sys_.cores,
            "precision": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
            "gradient_checkpointing": bool(getattr(trainer.model, "is_gradient_checkpointing", cfg.gradient_checkpointing)),
            "use_vllm": cfg.use_vllm, "lr": cfg.learning_rate, "warmup_steps": cfg.warmup_steps,
            "lr_schedule": getattr(cfg.lr_scheduler_type, "value", str(cfg.lr_scheduler_type)), "betas": [cfg.adam_beta1, cfg.adam_beta2],
            "weight_decay": cfg.weight_decay, "max_grad_norm": cfg.max_grad_norm, "clip": [cfg.epsilon, cfg.epsilon_high],
            "kl_beta": cfg.beta, "advantage": f"scale_rewards={cfg.scale_rewards} (sample std)",
            "loss": cfg.loss_type, "num_iterations": cfg.num_iterations,
            "prompts_per_step": cfg.per_device_train_batch_size // cfg.num_generations,
            "group_size": cfg.num_generations, "max_new_tokens": cfg.max_completion_length,
            "temperature": cfg.temperature}


RUNNERS: dict[str, Callable[..., dict]] = {"gymloop": run_gymloop, "trl": run_trl}


def reached(run: dict, target: float) -> dict | None:
    """The first evaluation at or above the target, or None."""
    return next((c for c in run["curve"] if c["pass1"] >= target), None)


def speed(run: dict) -> tuple[float, float]:
    """(seconds per step, sampled tokens per second) over the whole run."""
    last = run["curve"][-1]
    return last["train_seconds"] / max(last["step"], 1), run["sampled_tokens"] / max(last["train_seconds"], 1e-9)


def _med(xs: list[float], fmt: str) -> str:
    """median [min-max] of xs, '-' when empty."""
    if not xs:
        return "-"
    return f"{format(statistics.median(xs), fmt)} [{format(min(xs), fmt)}-{format(max(xs), fmt)}]"


def summary_tables(cells: list[dict], systems: list[str]) -> list[tuple[str, list[list[str]]]]:
    """The printed tables from the raw cells: per system over all cells, then one row per cell.
    A pure function of the results file (tests/unit/test_bench_results.py recomputes them from it)."""
    n = len(cells)
    head = ["system", "cores", "loss", "reached", "steps to target", "s to target", "s/step", "sampled tok/s",
            "vs TRL: s to target", "vs TRL: s/step"]
    rows = [head]
    for name in systems:
        spec = SYSTEMS[name]
        runs = [(c, c["runs"][name]) for c in cells if name in c["runs"]]
        hits = [(c, r, reached(r, c["target"])) for c, r in runs]
        ok = [(c, r, h) for c, r, h in hits if h]
        ratio_t, ratio_s = [], []
        for c, r, h in hits:
            ref = c["runs"].get(spec.against) if spec.against else None
            if ref is None:
                continue
            ratio_s.append(speed(ref)[0] / speed(r)[0])
            h_ref = reached(ref, c["target"])
            if h and h_ref:
                ratio_t.append(h_ref["train_seconds"] / h["train_seconds"])
        rows.append([name, str(spec.cores), spec.label, f"{len(ok)}/{len(runs)}",
                     _med([h["step"] for _, _, h in ok], ".0f"), _med([h["train_seconds"] for _, _, h in ok], ".1f"),
                     _med([speed(r)[0] for _, r in runs], ".3f"), _med([speed(r)[1] for _, r in runs], ".0f"),
                     _med(ratio_t, ".2f") + (f" (x{len(ratio_t)})" if ratio_t else "") if spec.against else "",
                     _med(ratio_s, ".2f") if spec.against else ""])
    per_cell = [["base", "task seed", "base pass@1", "target",
                 *[f"{s}: steps / s" for s in systems]]]
    for c in cells:
        out = []
        for s in systems:
            r = c["runs"].get(s)
            h = r and reached(r, c["target"])
            out.append("-" if r is None else f"{h['step']} / {h['train_seconds']:.1f}" if h else
                       f"> {r['curve'][-1]['step']} / {r['curve'][-1]['train_seconds']:.1f}")
        per_cell.append([str(c["base_seed"]), str(c["task_seed"]), f"{c['base_pass1']:.3f}", f"{c['target']:.3f}", *out])
    return [(f"GRPO to base + gain held-out pass@1, {n} cells (bases x task seeds): median [range]", rows),
            ("per cell: steps / training seconds to the target (> : not reached, last evaluation)", per_cell)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bases", type=int, nargs="+", default=[0, 1, 2], help="nano pre-training seeds")
    ap.add_argument("--task-seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    ap.add_argument("--gain", type=float, default=0.15, help="target = base held-out pass@1 + this")
    ap.add_argument("--budget", type=float, default=240, help="training seconds before giving up")
    ap.add_argument("--max-steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--lr", type=float, default=2e-4)
    args = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    env = ArithEnv()
    cells = []
    for base_seed in args.bases:
        spec = f"nano:seed={base_seed}"
        model, tok = load_model(resolve_model(spec, progress=False))
        for task_seed in args.task_seeds:
            torch.set_num_threads(1)
            held = env.sample_tasks(args.tasks, "heldout", seed=task_seed)
            base = evaluate(NativeEngine(model, tok.pad_token_id), tok, env, held, max_new_tokens=NEW_TOKENS).pass1
            cell = {"base_seed": base_seed, "task_seed": task_seed, "model": spec, "base_pass1": base,
                    "target": round(base + args.gain, 4), "order": [], "runs": {}}
            k = len(cells) % len(args.systems)
            cell["order"] = args.systems[k:] + args.systems[:k]
            for name in cell["order"]:
                s = SYSTEMS[name]
                r = RUNNERS[s.kind](s, spec, task_seed, cell["target"], args)
                cell["runs"][name] = r
                h = reached(r, cell["target"])
                print(f"base {base_seed} task seed {task_seed} (pass@1 {base:.3f} -> {cell['target']:.3f}) {name}: "
                      + (f"{h['step']} steps, {h['train_seconds']:.1f} s" if h else "not reached")
                      + f", {speed(r)[0]:.3f} s/step", flush=True)
            cells.append(cell)
    torch.set_num_threads(1)
    print("\nsettings, as each side ran:")
    for name in args.systems:
        print(f"  {name}: {json.dumps(cells[0]['runs'][name]['settings'])}")
    for title, rows in summary_tables(cells, args.systems):
        print(f"\n{title}")
        print(common.table(rows, title=title))
    common.save("learning/grpo_vs_trl", {"args": vars(args), "systems": {n: SYSTEMS[n].__dict__ for n in args.systems},
                                "cells": cells})


if __name__ == "__main__":
    sys.exit(main())
