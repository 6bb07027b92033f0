"""GRPO through the ecosystems' environments, unchanged, each in its own runtime: does the held-out
reward rise? One run per (environment, seed), from the committed configs:

- NeMo Gym: `configs/nemo-gym-weather.yaml`, the example_tool_call_multireward resources server
  (its /verify sums correctness, schema_valid and format; reward_range [0, 3]) from smollm2-calls;
- verifiers: `configs/verifiers-reverse.yaml`, a v0 environment (tests/fixtures/vf_reverse, its
  Rubric the LCS ratio of verifiers' reverse-text example) from SmolLM2-135M-Instruct.

    python -m bench.learning.ecosystems [--seeds 0,1] [--only nemo_gym|verifiers]

Held-out scores are greedy, on the same tasks before and after (the seed draws the order of the
training tasks and the rollouts' samples); the components are the peer verifier's own, averaged.
Needs `make nemo-gym verifiers` (what `make test` builds).
"""
from __future__ import annotations

BENCH = {"results": "learning/ecosystems", "minutes": 40,
         "measures": ("GRPO through a NeMo Gym resources server (example_tool_call_multireward, from smollm2-calls) and"
                      " a verifiers environment (vf_reverse, from SmolLM2), each unchanged in its own runtime, 2 seeds:"
                      " held-out reward, pass@1 and each of the peer verifier's components before and after")}

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench import common
import torch

from gymloop.config import load_config
from gymloop.orchestrator.train import train

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"nemo_gym": ("example_tool_call_multireward", "configs/nemo-gym-weather.yaml"),
           "verifiers": ("vf-reverse", "configs/verifiers-reverse.yaml")}


def one_run(config: Path, seed: int, run_dir: str) -> dict:
    cfg = load_config(config, {"seed": seed, "run_dir": run_dir})
    torch.set_num_threads(cfg.threads)
    s = train(cfg, progress=False, echo=lambda m: None)
    return {"seed": seed, "model": cfg.model, "steps": s["steps"], "heldout_tasks": s["heldout_tasks"],
            "base": s["base"], "final": s["final"], "zero_signal_group_fraction": s["zero_signal_group_fraction"],
            "wall_seconds": s["wall_seconds"], "phase_seconds": s["phase_seconds"],
            "gain_reward_points": 100 * (s["final"]["mean_reward"] - s["base"]["mean_reward"]),
            "gain_pass1_points": s["gain_pass1_points"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--only", choices=sorted(CONFIGS))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (example, config) in CONFIGS.items():
            if args.only and name != args.only:
                continue
            for seed in seeds:
                r = {"env": name, "example": example, "config": config,
                     **one_run(ROOT / config, seed, str(Path(tmp) / f"{name}-{seed}"))}
                runs.append(r)
                print(f"{name} seed {seed}: held-out reward {r['base']['mean_reward']:.3f} -> "
                      f"{r['final']['mean_reward']:.3f}, pass@1 {r['base']['pass1']:.3f} -> {r['final']['pass1']:.3f} "
                      f"({r['wall_seconds']:.0f} s)", flush=True)
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    table = [["environment", "model", "seed", "steps", "held-out reward", "held-out pass@1", "components before -> after",
              "no-signal groups", "wall s"]]
    for r in runs:
        comps = ", ".join(f"{k} {r['base']['components'][k]:.2f}->{r['final']['components'][k]:.2f}"
                          for k in r["final"]["components"] if k != "reward" and k in r["base"]["components"])
        table.append([f"{r['env']} ({r['example']})", r["model"], r["seed"], r["steps"],
                      f"{pct(r['base']['mean_reward'])} -> {pct(r['final']['mean_reward'])}",
                      f"{pct(r['base']['pass1'])} -> {pct(r['final']['pass1'])}", comps,
                      pct(r["zero_signal_group_fraction"]), f"{r['wall_seconds']:.0f}"])
    for name in sorted({r["env"] for r in runs}):
        gains = [r["gain_reward_points"] for r in runs if r["env"] == name]
        table.append([f"{name}: median gain", "", "", "", f"{statistics.median(gains):+.1f} pts", "", "", "", ""])
    print(common.table(table, title=f"GRPO through the ecosystems' environments, held-out (greedy) before -> after, "
                                    f"seeds {args.seeds}"))
    common.save("learning/ecosystems", {"seeds": seeds, "runs": runs})


if __name__ == "__main__":
    sys.exit(main())
