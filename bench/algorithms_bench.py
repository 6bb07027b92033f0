"""Every algorithm variant on the same workloads and budget, side by side.

    python bench/algorithms_bench.py [--arith-steps 300] [--tools-steps 40] [--bases nano,nano:seed=1]

1. The demo's arithmetic (2-digit addition, held-out pass@1) from each nano base, and tools@v1
   (multi-turn tool use, held-out success) from nano-tools: each advantage / loss variant with
   the same steps, prompts, lr and seeds. Columns: steps and training seconds to the target
   (first evaluation at or above it), final held-out score.
2. Off-policy corrections: asynchronous runs (max_staleness 2) with no correction, TIS and
   IcePop against two synchronous runs that differ only in their seed (their gap is the noise),
   with the mismatch KL and the masked fraction the trainer logged.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import common
import torch

from gymloop.config import EvalConfig
from gymloop.jobs.recipes import demo_config, tools_config
from gymloop.orchestrator.train import train

# name -> GRPO overrides (the rest is the workload's recipe)
VARIANTS = {
    "grpo": {},
    "dr_grpo": {"advantage": "dr_grpo"},
    "rloo": {"advantage": "rloo"},
    "gspo": {"loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean"},
    "cispo": {"loss": "cispo", "clip_low": 1.0},
    "dapo": {"dynamic_sampling": True, "max_refills": 3, "overlong_cache": 2},
}
CORRECTIONS = {
    "sync (seed 0)": ({}, 0),
    "sync (seed 1)": ({}, 1),
    "sync (seed 2)": ({}, 2),
    "async 2, none": ({"max_staleness": 2}, 0),
    "async 2, tis": ({"max_staleness": 2, "correction": "tis"}, 0),
    "async 2, icepop": ({"max_staleness": 2, "correction": "icepop"}, 0),
}


def run(cfg, grpo: dict, seed: int = 0) -> dict:
    cfg = cfg.model_copy(update={"grpo": cfg.grpo.model_copy(update=grpo), "seed": seed})
    cfg = type(cfg).model_validate(cfg.model_dump())        # validate the overrides
    s = train(cfg, progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "train" and r.get("trained_rollouts")]
    s["mismatch_kl"] = statistics.fmean(r["mismatch_kl"] for r in steps) if steps and "mismatch_kl" in steps[0] else None
    s["masked_frac"] = statistics.fmean(r["masked_frac"] for r in steps) if steps and "masked_frac" in steps[0] else None
    return s


def to_target(s: dict, target: float) -> tuple[str, str]:
    for c in s["pass1_curve"]:
        if c["pass1"] >= target:
            return str(c["step"]), f"{c['train_seconds']:.0f}"
    return "-", "-"


def row(name: str, s: dict, target: float) -> list[str]:
    step, sec = to_target(s, target)
    return [name, f"{s['base']['pass1']:.1%}", f"{s['final']['pass1']:.1%}",
            f"{100 * (s['final']['pass1'] - s['base']['pass1']):+.1f}", step, sec,
            f"{s['phase_seconds'].get('training', 0) + s['phase_seconds'].get('generation', 0) + s['phase_seconds'].get('rollout_wait', 0):.0f}"]


HEAD = ["variant", "base", "final", "gain pts", "steps to target", "train s to target", "train s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arith-steps", type=int, default=300)
    ap.add_argument("--arith-target", type=float, default=0.6)
    ap.add_argument("--tools-steps", type=int, default=40)
    ap.add_argument("--tools-target", type=float, default=0.97)
    ap.add_argument("--bases", default="nano,nano:seed=1", help="comma-separated nano bases for arithmetic")
    ap.add_argument("--only", choices=["variants", "tools", "corrections"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp()
    out: dict = {"arith": {}, "tools": {}, "corrections": {}}

    def arith(base: str):
        cfg = demo_config(tmp, model=base)
        return cfg.model_copy(update={
            "grpo": cfg.grpo.model_copy(update={"steps": args.arith_steps}),
            "eval": EvalConfig(tasks=300, every=25, max_new_tokens=6)})

    def variants(label: str, cfg, target: float, title: str) -> dict:
        """Every variant from one config: their table printed, their results returned."""
        rows, results = [HEAD], {}
        for name, over in VARIANTS.items():
            s = run(cfg, over)
            results[name] = {k: s[k] for k in ("base", "final", "pass1_curve", "phase_seconds")}
            rows.append(row(name, s, target))
            print(f"  {label} {name}: {s['final']['pass1']:.3f}", flush=True)
        print(f"\n{title}, target {target:.0%}")
        print(common.table(rows), flush=True)
        return results

    if args.only in (None, "variants"):
        for base in args.bases.split(","):
            out["arith"][base] = variants(base, arith(base), args.arith_target,
                                          f"arithmetic from {base}: {args.arith_steps} steps x 32 prompts x 8, "
                                          "lr 2e-4, 300 held-out tasks")
    if args.only in (None, "tools"):
        out["tools"] = variants("tools", tools_config(tmp, version=1, steps=args.tools_steps), args.tools_target,
                                f"tools@v1 (no schemas) from nano-tools: {args.tools_steps} steps x 16 prompts x 8, "
                                "lr 2e-4, 64 held-out tasks")
    if args.only in (None, "corrections"):
        rows = [["run", "base", "final", "gain pts", "steps to target", "train s to target", "train s",
                 "mismatch KL", "masked"]]
        base = args.bases.split(",")[0]
        for name, (over, seed) in CORRECTIONS.items():
            s = run(arith(base), over, seed)
            out["corrections"][name] = {k: s[k] for k in ("base", "final", "pass1_curve", "phase_seconds",
                                                          "mismatch_kl", "masked_frac")}
            kl = "-" if s["mismatch_kl"] is None else f"{s['mismatch_kl']:.2e}"
            mf = "-" if s["masked_frac"] is None else f"{s['masked_frac']:.2%}"
            rows.append(row(name, s, args.arith_target) + [kl, mf])
            print(f"  {name}: {s['final']['pass1']:.3f}", flush=True)
        sync = [v["final"]["pass1"] for k, v in out["corrections"].items() if k.startswith("sync")]
        print(f"\nasynchronous corrections, arithmetic from {base}, {args.arith_steps} steps; noise between the "
              f"synchronous runs (seeds 0-2; seeds 1-2 on their own held-out sets): {100 * (max(sync) - min(sync)):.1f} pts")
        print(common.table(rows), flush=True)
    common.save("algorithms_bench" + (f"_{args.only}" if args.only else ""), out)


if __name__ == "__main__":
    sys.exit(main())
