"""Asynchronous vs synchronous GRPO on the demo's workloads: `arith` (chapter 1: nano, 2-digit
addition, 32 prompts x 8 samples per step, 6 tokens) or `tools` (chapter 2: nano-tools,
tools@v3 episodes (the API change it recovers from; no schemas in the prompt) of <= 3 turns of <= 40 tokens, 16 prompts x 8).

    python -m bench.training.async_rl [--workload arith|tools] [--steps 300] [--budget 40]

1. Equal rollout budget: the same number of steps (same rollouts) in each mode; wall seconds
   of learning per step and rounds (steps) per hour.
2. Equal wall time: train each mode for `--budget` seconds of learning; held-out pass@1 then.
Goal (issue #7): async >= 1.3x the rounds per hour of sync with no loss of final score.
"""
from __future__ import annotations

BENCH = {"results": "training/async_rl", "minutes": 15,
         "measures": ("asynchronous vs synchronous GRPO on the demo workload: rounds per hour at equal rollouts, held-"
                      "out score after equal learning time")}   # found by bench/run_all.py

import argparse
import sys
import tempfile
from pathlib import Path

from bench import common
import torch

from gymloop.config import EvalConfig, load_config
from gymloop.orchestrator.train import train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def run(workload: str, steps: int, staleness: int, every: int = 0) -> dict:
    if workload == "arith":
        cfg = load_config(CONFIGS / "demo-learn.yaml", {"run_dir": tempfile.mkdtemp()})
        cfg = cfg.model_copy(update={"eval": EvalConfig(tasks=300, every=every, max_new_tokens=6)})
    else:
        cfg = load_config(CONFIGS / "tools-grpo.yaml", {"run_dir": tempfile.mkdtemp()})   # the loop chapter's rounds
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"every": every})})
    cfg = cfg.model_copy(update={
        "name": "async-bench", "grpo": cfg.grpo.model_copy(update={"steps": steps, "max_staleness": staleness})})
    return train(cfg, progress=False, echo=lambda m: None)


def score_at(curve: list[dict], seconds: float) -> float:
    """Held-out pass@1 of the last evaluation within `seconds` of learning."""
    seen = [c for c in curve if c["train_seconds"] <= seconds]
    return seen[-1]["pass1"] if seen else curve[0]["pass1"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=["arith", "tools"], default="arith")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds of learning for the equal-time comparison")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [["mode", "steps", "learning s", "s/step", "steps/hour", f"pass@1 after {args.budget:.0f} s",
             "final pass@1"]]
    out = {}
    for name, staleness in (("sync", 0), ("async (staleness 1)", 1)):
        s = run(args.workload, args.steps, staleness, every=25)
        learn = s["pass1_curve"][-1]["train_seconds"]
        rows.append([name, s["steps"], f"{learn:.1f}", f"{learn / s['steps']:.3f}",
                     f"{3600 * s['steps'] / learn:,.0f}", f"{score_at(s['pass1_curve'], args.budget):.3f}",
                     f"{s['final']['pass1']:.3f}"])
        out[name] = {"learn_seconds": learn, "steps": s["steps"], "curve": s["pass1_curve"],
                     "final": s["final"]["pass1"], "dropped_stale": s.get("dropped_stale_rollouts", 0)}
    sync, asyn = out["sync"], out["async (staleness 1)"]
    ratio = (asyn["steps"] / asyn["learn_seconds"]) / (sync["steps"] / sync["learn_seconds"])
    what = ("nano, 2-digit addition, 32 prompts x 8" if args.workload == "arith"
            else "nano-tools, tools@v3 (<= 3 turns, no schemas), 16 prompts x 8, lr 2e-4")
    print(f"GRPO, {what}, equal rollout budget of {args.steps} steps")
    print(common.table(rows))
    print(f"async / sync steps per hour: {ratio:.2f}x (goal >= 1.3x); "
          f"final pass@1 {asyn['final']:.3f} vs {sync['final']:.3f}")
    common.save("training/async_rl" if args.workload == "arith" else "training/async_rl-tools", out)


if __name__ == "__main__":
    sys.exit(main())
