"""Peak memory of a supervised step on SmolLM2 in one pass and in micro-batches (the same update).

    python -m bench.training.sft_memory [--micro 0 4] [--rows 20] [--steps 2] [--rank 16]

What a supervised LoRA job on SmolLM2-135M-Instruct runs per optimizer step (finetune/methods.py:
its examples, Trainer, TokenNLL), on `--rows` tool-call demonstrations of the `calls` environment
(OpenAI's function-calling format, ~380 tokens a row), LoRA rank `--rank` on every linear layer.
Each `--micro` setting runs in its own process, so its peak resident memory (ru_maxrss: the model,
the optimizer and that step's activations and logits) is its own: 0 is the whole batch in one
forward/backward, k is parts of k rows, gradients summed (a job's `micro_batch_size`; auto 4 beyond
1M parameters). The loss and gradient norm of each step are printed too: micro-batches must give the
same update (the LoRA adapters start from the same seed in every process).
"""
from __future__ import annotations

BENCH = {"results": "training/sft_memory", "minutes": 5,
         "measures": ("peak memory of a SmolLM2 supervised step, in one pass and in micro-batches")}   # found by bench/run_all.py

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from bench import common


def one(micro: int, rows: int, steps: int, rank: int) -> dict:
    """`steps` supervised steps of `rows` rows at micro-batch `micro`, in this process."""
    import torch

    from gymloop.bases.smollm2 import ensure_smollm2
    from gymloop.envs import make_env
    from gymloop.finetune.examples import sft_examples
    from gymloop.models import lora
    from gymloop.models.checkpoint import load_model
    from gymloop.trainer.logprobs import CompletionLogprobs
    from gymloop.trainer.objectives import TokenNLL
    from gymloop.trainer.trainer import Trainer

    env = make_env("calls")
    demos = [env.demonstration(t) for t in env.sample_tasks(rows, "train", seed=0)]
    model, tok = load_model(ensure_smollm2())
    torch.manual_seed(0)                 # LoRA's A matrices: the same start in every process
    model = lora.wrap(model, {"rank": rank, "alpha": 2.0 * rank})
    model.train()
    examples = sft_examples(tok, demos)
    trainer = Trainer(model, 8.6e-4, betas=(0.9, 0.999), fused=True, micro_batch=micro)
    score = CompletionLogprobs(model)
    batch = examples.batch(torch.arange(rows))
    out = {"micro": micro, "tokens": int(batch.loss_mask.sum()), "length": int(batch.input_ids.shape[1]),
           "seconds": [], "loss": [], "grad_norm": []}
    for _ in range(steps):
        t0 = time.perf_counter()
        m = trainer.step(batch, TokenNLL(score))
        out["seconds"].append(time.perf_counter() - t0)
        out["loss"].append(m["train_loss"])
        out["grad_norm"].append(m["grad_norm"])
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20     # kB on Linux
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro", type=int, nargs="+", default=[0, 4], help="micro-batch sizes (0: one pass)")
    ap.add_argument("--rows", type=int, default=20, help="rows per step (auto batch_size of 200 rows)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(one(args.child, args.rows, args.steps, args.rank)))
        return
    runs = []
    for micro in args.micro:
        print(f"micro_batch {micro}: {args.steps} steps of {args.rows} rows ...", flush=True)
        res = subprocess.run([sys.executable, __file__, "--child", str(micro), "--rows", str(args.rows),
                              "--steps", str(args.steps), "--rank", str(args.rank)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    rows = [["micro_batch_size", "peak RSS (GB)", "s/step (median)", "trained tokens/step", "loss per step",
             "grad norm per step"]]
    for r in runs:
        rows.append([str(r["micro"]) + (" (one pass)" if r["micro"] == 0 else ""), f"{r['peak_rss_gb']:.1f}",
                     f"{statistics.median(r['seconds']):.1f}", f"{r['tokens']:,}",
                     " / ".join(f"{x:.4f}" for x in r["loss"]), " / ".join(f"{x:.4f}" for x in r["grad_norm"])])
    print(f"\nSmolLM2-135M + LoRA r{args.rank}, supervised steps of {args.rows} tool-call rows "
          f"(longest {runs[0]['length']} tokens)")
    print(common.table(rows))
    common.save("training/sft_memory", {"settings": vars(args), "runs": runs})


if __name__ == "__main__":
    sys.exit(main())
