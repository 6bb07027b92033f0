"""Training throughput: GRPO optimizer steps on a fixed rollout batch, nano model.

    python -m bench.training.throughput [--threads 1]

Reports trained tokens/s (all forward tokens, prompt included) and achieved FLOP/s
(6 x parameters x tokens) against a 512x512 float32 matmul measured in the same run.
"""
from __future__ import annotations

BENCH = {"results": "training/throughput", "minutes": 2,
         "measures": ("GRPO training tokens/s and achieved FLOP/s against a 512x512 matmul measured in the same run")}   # found by bench/run_all.py

import argparse
import sys

from bench import common
import torch

from gymloop.models.checkpoint import load_model
from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.envs import ArithEnv
from gymloop.rollout.episodes import collect
from gymloop.algorithms import PolicyLoss, advantages_for
from gymloop.trainer.trainer import Trainer, rollouts_to_batch
from gymloop.trainer.objectives import PolicyObjective


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(resolve_model("nano"))
    n_params = sum(p.numel() for p in model.parameters())
    env = ArithEnv()
    rows = [["prompts x G", "tokens/step", "s/step", "tokens/s", "GFLOP/s", "of matmul"]]
    ceiling = common.matmul_gflops()
    results = []
    for prompts in (16, 32, 64):
        rolls, _ = collect(NativeEngine(model, tok.pad_token_id), tok, env, env.sample_tasks(prompts, "train", 0), 8,
                           SamplingParams(max_new_tokens=6, seed=0))
        adv = advantages_for(rolls, 8, "grpo", drop_zero_signal=False)
        batch = rollouts_to_batch(adv.rollouts, tok.pad_token_id)
        tokens = int(batch.attention_mask.sum())
        trainer = Trainer(model, lr=1e-9)  # tiny lr: measure speed without drifting far

        def step():
            trainer.step(batch, PolicyObjective(PolicyLoss(), adv.advantages))

        sec = common.median_time(step, args.repeats)
        gflops = 6 * n_params * tokens / sec / 1e9
        rows.append([f"{prompts} x 8", tokens, f"{sec:.3f}", f"{tokens / sec:,.0f}", f"{gflops:.1f}",
                     f"{gflops / ceiling:.0%}"])
        results.append({"prompts": prompts, "tokens": tokens, "seconds": sec, "gflops": gflops})
    print(f"GRPO training throughput, nano ({n_params:,} params), {args.threads} thread(s); "
          f"matmul ceiling {ceiling:.1f} GFLOP/s (512x512 fp32, same run)")
    print(common.table(rows))
    common.save("training/throughput", {"threads": args.threads, "matmul_gflops": ceiling, "results": results})


if __name__ == "__main__":
    sys.exit(main())
