"""The swe environment measured: tasks per project and build time, verification seconds, scripted
agent episodes per second, and GRPO steps on swe tasks from SmolLM2-135M-Instruct and nano.

    python -m bench.sandbox.swe [--verify 60] [--episodes 40] [--grpo-steps 2] [--skip-grpo]

Reads the tasks `gymloop swe build` wrote (and its build_report.json) from the cache; builds
them first when there are none. Verification: the gold patch and the empty patch of `--verify`
tasks (spread over every project), one sandbox slot, wall seconds of each `Harness.verify`
(p50 / p95). Episodes: the gold episode through the tools (read, search, edit, run the failing
tests, submit) and its verification, on the environment's 2 slots. GRPO: a few steps of
`gymloop train` on the train split with the env's tools in the request; the models are not
expected to fix anything (reward ~0): the point is that episode, sandbox, verification, rewards and
trainer run together, and how long a step takes. nano's 512 positions cannot hold a full swe
prompt (the tools' schemas and the whole statement): it trains on the compact prompt.
"""
from __future__ import annotations

BENCH = {"results": "sandbox/swe", "minutes": 15,
         "measures": ("real-repository tasks in SWE-bench's format: built, verified, every way of gaming the tests "
                      "scored 0")}   # found by bench/run_all.py

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict

from bench import common
import torch

from gymloop.envs.base import play
from gymloop.models.toolcalls import format_call
from gymloop.sandbox import Pool
from gymloop.swe.env import SweConfig, SweEnv, default_cache
from gymloop.swe.harness import Harness
from gymloop.swe.instance import load_instances


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def spread(instances, n: int):
    """n instances taken round-robin over projects."""
    by_repo = defaultdict(list)
    for i in instances:
        by_repo[i.repo].append(i)
    out, k = [], 0
    while len(out) < n and any(k < len(v) for v in by_repo.values()):
        out += [v[k] for v in by_repo.values() if k < len(v)]
        k += 1
    return out[:n]


def grpo_row(model: str, steps: int, threads: int, layers: int | None, prompt: str) -> list[str]:
    from gymloop.config import EnvSpec, EvalConfig, GRPOConfig, SamplingConfig, TrainConfig
    from gymloop.orchestrator.train import train

    grpo = dict(steps=steps, prompts_per_step=2, group_size=4, lr=1e-5, warmup_steps=0, betas=(0.9, 0.999))
    if layers:
        top = "|".join(str(i) for i in range(30 - layers, 30))
        grpo["train_only"] = [rf"layers\.({top})\.", r"^model\.norm\."]
    cfg = TrainConfig(model=model, name=f"swe-{model}", run_dir=tempfile.mkdtemp(), threads=threads,
                      env=EnvSpec(name="swe", max_turns=4, options={"slots": 2, "prompt": prompt}),
                      sampling=SamplingConfig(temperature=0.7, max_new_tokens=96),
                      grpo=GRPOConfig(**grpo), eval=EvalConfig(tasks=2, every=0, max_new_tokens=96))
    t0 = time.perf_counter()
    s = train(cfg, progress=True, echo=print)
    wall = time.perf_counter() - t0
    learn = sum(s["phase_seconds"].get(k, 0.0) for k in ("generation", "verification", "training", "weight_sync"))
    return [model, prompt, str(s["steps"]), f"{s['base']['mean_reward']:.2f}", f"{s['final']['mean_reward']:.2f}",
            f"{learn / max(s['steps'], 1):.0f}", f"{s['phase_seconds'].get('verification', 0) / max(s['steps'], 1):.1f}",
            f"{s['tokens_generated']:,}", f"{wall:.0f}", "ran"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--verify", type=int, default=60, help="tasks whose gold and empty patches are verified")
    ap.add_argument("--episodes", type=int, default=40, help="scripted gold episodes")
    ap.add_argument("--grpo-steps", type=int, default=2)
    ap.add_argument("--skip-grpo", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cache = default_cache()
    if not (cache / "tasks.jsonl").exists():
        from gymloop.swe.build import build_all

        build_all(cache)
    instances = load_instances(cache / "tasks.jsonl")
    report = json.loads((cache / "build_report.json").read_text())
    rows = [["project", "kind", "judging tests", "candidates tried", "kept", "train", "held-out", "build s"]]
    for r in report:
        mine = [i for i in instances if i.repo == r["project"]]
        rows.append([r["project"], r["kind"], str(r["judging_tests"]), str(r["candidates"]), str(r["kept"]),
                     str(sum(i.split == "train" for i in mine)), str(sum(i.split == "heldout" for i in mine)),
                     f"{r['seconds']:.0f}"])
    rows.append(["all", "", "", str(sum(r["candidates"] for r in report)), str(len(instances)),
                 str(sum(i.split == "train" for i in instances)), str(sum(i.split == "heldout" for i in instances)),
                 f"{sum(r['seconds'] for r in report):.0f}"])
    title = "tasks built (gymloop swe build; build seconds include each sdist's download and unpacking)"
    print(title)
    print(common.table(rows, title=title))

    chosen = spread(instances, args.verify)
    secs: dict[str, list[float]] = {"gold": [], "empty": []}
    ok = {"gold": 0, "empty": 0}
    with Pool(slots=1) as pool:
        h = Harness(pool, cache / "repos", cache)
        for inst in chosen:
            for name, patch, want in (("gold", inst.patch, 1.0), ("empty", "", 0.0)):
                v = h.verify(inst, patch)
                secs[name].append(v.seconds)
                ok[name] += v.reward == want and v.error is None
    rows = [["patch", "verified", "as expected", "p50 s", "p95 s", "max s"]]
    for name in secs:
        rows.append([name, str(len(secs[name])), str(ok[name]), f"{statistics.median(secs[name]):.2f}",
                     f"{pct(secs[name], 0.95):.2f}", f"{max(secs[name]):.2f}"])
    title = f"verification, one sandbox slot, {len(chosen)} tasks over every project (goal: <= 2 s)"
    print(f"\n{title}")
    print(common.table(rows, title=title))

    env = SweEnv(SweConfig(slots=2))
    try:
        tasks = [env.task(i) for i in spread(instances, args.episodes)]
        t0 = time.perf_counter()
        import concurrent.futures as cf

        def episode(t):
            inst = env.instances[t.id]
            turns = [format_call("read_file", {"path": inst.tests()[0].split("::")[0], "start": 1, "end": 40}),
                     format_call("search", {"pattern": "def ", "path": "."}),
                     *env.gold_turns(t)[:-1],
                     format_call("run_tests", {"tests": inst.FAIL_TO_PASS[:5]}),
                     env.gold_turns(t)[-1]]
            return play(env, t, turns)[1]

        with cf.ThreadPoolExecutor(2) as ex:
            scores = list(ex.map(episode, tasks))
        wall = time.perf_counter() - t0
    finally:
        env.close()
    rows = [["episodes", "tool calls each", "resolved", "errors", "wall s", "episodes/s"],
            [str(len(tasks)), "5 + edits", str(sum(s.reward == 1.0 for s in scores)), str(sum(s.error is not None for s in scores)),
             f"{wall:.1f}", f"{len(tasks) / wall:.2f}"]]
    title = "scripted agent episodes (read, search, the gold edits, run the failing tests, submit; then verified), 2 slots"
    print(f"\n{title}")
    print(common.table(rows, title=title))

    results = {"args": vars(args), "verify_seconds": secs, "episodes_wall": wall}
    if not args.skip_grpo:
        torch.set_num_threads(args.threads)
        from gymloop.bases.registry import resolve_model
        from gymloop.bases.smollm2 import available
        from gymloop.models.checkpoint import load_model

        rows = [["model", "prompt", "steps", "base reward", "final reward", "s/step", "verify s/step",
                 "tokens generated", "wall s", "status"]]
        if available() is None:
            rows.append(grpo_row("smollm2", args.grpo_steps, args.threads, layers=4, prompt="full"))
        else:
            rows.append(["smollm2", "full", *["-"] * 7, f"skipped: {available()}"])
        # nano's 512 positions: the full prompt (tools' schemas, whole statement) does not fit
        model, tok = load_model(resolve_model("nano", progress=False))
        full = SweEnv(SweConfig(prompt="full"))
        lengths = sorted(len(tok.prompt_ids(list(t.prompt), tools=full.tools(t))) for t in full.all_tasks())
        print(f"nano: {model.config.max_position_embeddings} positions; full swe prompts {lengths[0]}-{lengths[-1]} "
              f"tokens (median {lengths[len(lengths) // 2]}): nano trains on compact prompts")
        rows.append(grpo_row("nano", args.grpo_steps, args.threads, layers=None, prompt="compact"))
        results["nano_full_prompt_tokens"] = lengths
        title = (f"GRPO on swe train tasks ({args.grpo_steps} steps, 2 prompts x 4 samples, <= 4 turns of <= 96 tokens, "
                 f"T 0.7, {args.threads} threads; SmolLM2: top 4 of 30 layers trained); reward = resolved")
        print(f"\n{title}")
        print(common.table(rows, title=title))
    common.save("sandbox/swe", results)


if __name__ == "__main__":
    sys.exit(main())
