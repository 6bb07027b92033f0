"""GRPO through an agent program, unchanged: does the held-out reward rise, and what does running
the program cost against a gymloop environment of the same task?

- Learning: `configs/agent-inventory.yaml`, examples/agents/inventory.py (an OpenAI Agents SDK
  clerk with the renamed inventory tools lookup_item / restock) from nano-tools, which learnt the
  old names; greedy held-out reward before and after, model calls and training sequences
  (segments) per episode, program failures. One run per seed.
- Overhead: the same tasks, group size and sampling through `agent` (the SDK program, HTTP, token
  capture) and through the built-in `tools@v3` environment (gymloop's own episode loop), on the
  same engine: episodes/s, and the share of the wall clock the engine generated.

    python -m bench.learning.agent_program [--seeds 0,1] [--only learning|overhead]
"""
from __future__ import annotations

BENCH = {"results": "learning/agent_program", "minutes": 15,
         "measures": ("GRPO through an agent program, unchanged (examples/agents/inventory.py, an OpenAI Agents SDK "
                      "clerk with renamed tools, from nano-tools), 2 seeds: greedy held-out reward before and after, "
                      "model calls and training sequences per episode, program failures; episodes/s of the same tasks "
                      "through the program and through the built-in `tools@v3` environment on one engine")}

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import common
import torch

from gymloop.config import load_config
from gymloop.orchestrator.train import train
from gymloop.tracking.run_dir import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "agent-inventory.yaml"


def one_run(seed: int, run_dir: str, model: str | None = None) -> dict:
    cfg = load_config(CONFIG, {"seed": seed, "run_dir": run_dir, **({"model": model} if model else {})})
    torch.set_num_threads(cfg.threads)
    s = train(cfg, progress=False, echo=lambda m: None)
    steps = [r for r in read_metrics(s["run_dir"]) if r.get("kind") == "train"]
    mean = lambda k: statistics.fmean(r[k] for r in steps)  # noqa: E731
    return {"seed": seed, "model": cfg.model, "steps": s["steps"], "heldout_tasks": s["heldout_tasks"],
            "base": s["base"], "final": s["final"], "curve": s["pass1_curve"],
            "agent_calls": mean("agent_calls"), "agent_segments": mean("agent_segments"),
            "agent_errors": sum(r["agent_errors"] for r in steps), "episodes": sum(r["trained_rollouts"] for r in steps),
            "train_reward_first_last": [steps[0]["reward"], steps[-1]["reward"]],
            "zero_signal_group_fraction": s["zero_signal_group_fraction"], "wall_seconds": s["wall_seconds"],
            "phase_seconds": s["phase_seconds"],
            "gain_reward_points": 100 * (s["final"]["mean_reward"] - s["base"]["mean_reward"])}


def learning(seeds: list[int], model: str | None = None) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            r = one_run(seed, str(Path(tmp) / f"seed-{seed}"), model)
            runs.append(r)
            print(f"seed {seed}: held-out reward {r['base']['mean_reward']:.3f} -> {r['final']['mean_reward']:.3f} "
                  f"({r['wall_seconds']:.0f} s)", flush=True)
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    rows = [["program", "model", "seed", "steps", "held-out reward (greedy)", "calls / episode",
             "segments / episode", "program errors", "train reward first -> last step", "wall s"]]
    for r in runs:
        first, last = r["train_reward_first_last"]
        rows.append(["inventory.py (Agents SDK, chat completions)", r["model"], r["seed"], r["steps"],
                     f"{pct(r['base']['mean_reward'])} -> {pct(r['final']['mean_reward'])}",
                     f"{r['agent_calls']:.2f}", f"{r['agent_segments']:.2f}", r["agent_errors"],
                     f"{pct(first)} -> {pct(last)}", f"{r['wall_seconds']:.0f}"])
    gains = [r["gain_reward_points"] for r in runs]
    rows.append(["median gain", "", "", "", f"{statistics.median(gains):+.1f} pts", "", "", "", "", ""])
    print(common.table(rows, title=f"GRPO through an agent program, unchanged ({runs[0]['heldout_tasks']} held-out "
                                   f"tasks, the same before and after), seeds {','.join(map(str, seeds))}"))
    return runs


def overhead(repeats: int = 3, tasks: int = 16, group: int = 8) -> dict:
    """Episodes/s of the same tasks through `agent` and through `tools@v3` on one engine."""
    from gymloop.bases.registry import resolve_model
    from gymloop.engine import NativeEngine, SamplingParams
    from gymloop.envs import make_env
    from gymloop.models.checkpoint import load_model
    from gymloop.rollout.episodes import collect

    cfg = load_config(CONFIG)
    torch.set_num_threads(cfg.threads)
    model, tok = load_model(resolve_model(cfg.model, progress=False))
    engine = NativeEngine(model, tok.pad_token_id, decode=tok.decode)
    builtin = make_env("tools", version=3)
    agent = make_env("agent", **{**cfg.env.options, "path": str(ROOT / cfg.env.options["path"]),
                                 "tasks": str(ROOT / cfg.env.options["tasks"])})
    params = SamplingParams(max_new_tokens=cfg.sampling.max_new_tokens, temperature=cfg.sampling.temperature)
    chosen = builtin.sample_tasks(tasks, "train", seed=0)
    same = [agent.task_from_id("-".join(t.id.split(":")[1:])) for t in chosen]     # tools@v3:apple:3:1 -> apple-3-1
    seen: dict[str, list] = {"agent": [], "tools@v3": []}

    def run(name: str, env, ts) -> None:
        t0 = time.perf_counter()
        rollouts, st = collect(engine, tok, env, ts, group, params, max_turns=3)
        seen[name].append({"seconds": time.perf_counter() - t0, "gen_seconds": st.gen_seconds,
                           "episodes": st.episodes, "generated_tokens": st.generated_tokens,
                           "prompt_tokens": st.prompt_tokens, "calls": st.calls or sum(r.turns for r in rollouts),
                           "errors": st.errors, "reward": statistics.fmean(r.reward for r in rollouts if r.ok)})

    try:
        common.alternating_medians(lambda: run("agent", agent, same), lambda: run("tools@v3", builtin, chosen),
                                   repeats=repeats)
    finally:
        agent.close()
    out = {}
    rows = [["environment", "episodes/s", "model calls / episode", "generated tok / episode", "engine share of wall",
             "mean reward (T=0.7)", "errors"]]
    for name, runs in seen.items():
        runs = runs[1:]                          # the first of each is the warm-up
        med = statistics.median(r["seconds"] for r in runs)
        r0 = runs[0]
        eps = r0["episodes"] / med
        out[name] = {"runs": runs, "median_seconds": med, "episodes_per_s": eps}
        rows.append([name, f"{eps:.1f}", f"{r0['calls'] / r0['episodes']:.2f}",
                     f"{statistics.fmean(r['generated_tokens'] / r['episodes'] for r in runs):.1f}",
                     f"{statistics.median(r['gen_seconds'] / r['seconds'] for r in runs):.0%}",
                     f"{statistics.fmean(r['reward'] for r in runs):.2f}", sum(r["errors"] for r in runs)])
    ratio = out["tools@v3"]["episodes_per_s"] / out["agent"]["episodes_per_s"]
    rows.append(["tools@v3 / agent", f"{ratio:.2f}x", "", "", "", "", ""])
    print(common.table(rows, title=f"The same {tasks} tasks x {group} through the agent program and the built-in "
                                   f"environment, {cfg.model}, median of {repeats} (alternating)"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--only", choices=("learning", "overhead"))
    ap.add_argument("--model", help="another base than the config's (e.g. nano-tools:seed=1, pre-trained with seed 1)")
    args = ap.parse_args()
    os.chdir(ROOT)                  # the config's paths are the repository's
    seeds = [int(s) for s in args.seeds.split(",")]
    data: dict = {"seeds": seeds}
    if args.only in (None, "learning"):
        data["runs"] = learning(seeds, args.model)
    if args.only in (None, "overhead"):
        data["overhead"] = overhead()
    common.save("learning/agent_program", data)


if __name__ == "__main__":
    sys.exit(main())
