"""Why GRPO did not learn from some nano bases, and what fixed it: bases and recipes side by side.

    python bench/recipe_ablation.py [--seeds 0 1 2] [--steps 300] [--quick]

Three tables, every number measured in this run:

1. Pre-training. The old recipe (1,000 steps, cosine decay of lr 3e-3 to 0, loss on every token)
   against the new one (constant lr 1e-3 after warm-up, loss on the answer, stop at the first
   probe >= 30%), for each seed, once with this machine's own CPU kernels and once with PyTorch
   restricted to AVX2 (`ATEN_CPU_CAPABILITY=avx2`, `MKL_ENABLE_INSTRUCTIONS=AVX2`): the same
   seed with other float rounding, as on another CPU.
2. The policy gradient along itself: sampled reward (T=1, 400 tasks x 8) after a step of a given
   normalised length along the batch gradient of the GRPO loss (2,048 rollouts), from an
   annealed base and from a band-stopped one.
3. GRPO from each base with the demo's recipe and the variants tried on the annealed base (lower
   lr, temperature 0.7, a KL penalty, a group of 16): held-out pass@1 (500 tasks) every 100 steps.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import common
import torch

from gymloop.models.checkpoint import load_model
from gymloop.config import load_config
from gymloop.engine import Engine, SamplingParams
from gymloop.envs import make_env
from gymloop.rollout.evaluate import evaluate
from gymloop.bases.nano import ensure_nano, preset
from gymloop.rollout.episodes import collect
from gymloop.orchestrator.train import train

CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "arith-grpo.yaml")
# The shape of the recipe before the probe band (RECIPE_VERSION 3): a fixed budget, lr 3e-3 annealed
# to zero, loss on every token (its warm-up differs slightly, so its bases differ too).
OLD = dict(steps=1000, target_pass1=None, lr=3e-3, lr_schedule="cosine", loss_on="all", warmup_steps=50)
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
VARIANTS = {
    "demo recipe (lr 2e-4, T 1.0)": {},
    "lr 5e-5": {"grpo": {"lr": 5.0e-5}},
    "temperature 0.7": {"sampling": {"temperature": 0.7}},
    "KL to the base, beta 0.05": {"grpo": {"beta": 0.05}},
    "group 16 x 16 prompts": {"grpo": {"group_size": 16, "prompts_per_step": 16}},
}


def base_path(seed: int, old: bool, cache: str, env: dict | None = None) -> tuple[str, dict]:
    """Pre-train (or find) a base, in a subprocess with its own cache when `env` changes the CPU
    kernels (the cache key names the recipe, not the kernels that ran it)."""
    overrides = {"seed": seed, **(OLD if old else {})}
    if env is None:
        path = ensure_nano(preset("nano", **overrides), cache_dir=cache, progress=False)
    else:
        cache = os.path.join(cache, "avx2")
        code = ("import json,sys;from gymloop.bases.nano import ensure_nano,preset;"
                f"print(ensure_nano(preset('nano',**json.loads(sys.argv[1])),cache_dir={cache!r},progress=False))")
        out = subprocess.run([sys.executable, "-c", code, json.dumps(overrides)], check=True, capture_output=True,
                             text=True, env={**os.environ, **env})
        path = out.stdout.strip().splitlines()[-1]
    return str(path), json.loads(open(os.path.join(path, "gymloop.json")).read())["pretrain"]


def heldout(path: str) -> float:
    model, tok = load_model(path)
    env = make_env("arith")
    return evaluate(Engine(model, tok.pad_token_id, decode=tok.decode), tok, env,
                    env.sample_tasks(500, "heldout", seed=0), max_new_tokens=6).pass1


def line_search(path: str, steps: list[float]) -> list[float]:
    """Sampled reward after a step of each normalised length along the GRPO loss's descent direction."""
    from gymloop.algorithms import PolicyLoss, advantages_for
    from gymloop.trainer.logprobs import token_logprobs
    from gymloop.trainer.trainer import rollouts_to_batch

    model, tok = load_model(path)
    env = make_env("arith")
    engine = Engine(model, tok.pad_token_id, decode=tok.decode)
    model.zero_grad()
    for seed in range(100, 108):
        rolls, _ = collect(engine, tok, env, env.sample_tasks(32, "train", seed=seed), 8,
                           SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed))
        adv = advantages_for(rolls, 8, "grpo", True)
        batch = rollouts_to_batch(adv.rollouts, tok.pad_token_id)
        loss, _ = PolicyLoss(clip_high=0.2)(token_logprobs(model, batch), batch.old_logp, adv.advantages,
                                            batch.loss_mask)
        (loss / 8).backward()
    grad = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = torch.sqrt(sum((g ** 2).sum() for g in grad.values()))
    probe = env.sample_tasks(400, "train", seed=999)
    out = []
    for s in steps:
        m = copy.deepcopy(model)
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.sub_(s * grad[n] / norm)
        rolls, _ = collect(Engine(m, tok.pad_token_id, decode=tok.decode), tok, env, probe, 8,
                           SamplingParams(max_new_tokens=6, temperature=1.0, seed=1))
        out.append(sum(r.reward for r in rolls) / len(rolls))
    return out


def grpo_curve(path: str, overrides: dict, steps: int) -> list[float]:
    cfg = load_config(CONFIG, {**overrides, "model": path, "run_dir": tempfile.mkdtemp(), "name": "ablation",
                               "grpo": {**overrides.get("grpo", {}), "steps": steps},
                               "eval": {"every": 100, "ks": []}})
    summary = train(cfg, progress=False, echo=lambda m: None)
    return [c["pass1"] for c in summary["pass1_curve"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300, help="GRPO steps per run")
    ap.add_argument("--quick", action="store_true", help="the demo recipe only (no variants on the annealed base)")
    ap.add_argument("--cache-dir", default=None, help="model cache (default: a fresh temporary directory)")
    ap.add_argument("--tables", default="pretrain,line,grpo", help="which tables (comma-separated)")
    args = ap.parse_args()
    tables = set(args.tables.split(","))
    torch.set_num_threads(1)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="ablation-")
    results: dict = {"pretrain": [], "line_search": [], "grpo": []}

    rows = [["seed", "recipe", "kernels", "steps", "held-out pass@1"]]
    bases = {}
    for seed in args.seeds:
        for old in (True, False):
            for kernels, env in (("native", None), ("AVX2", AVX2))[:2 if "pretrain" in tables else 1]:
                path, stats = base_path(seed, old, cache, env)
                acc = heldout(path)
                name = "fixed 1000, cosine" if old else "probe band 30%, constant"
                rows.append([str(seed), name, kernels, str(stats["steps"]), f"{100 * acc:.1f}%"])
                results["pretrain"].append({"seed": seed, "recipe": name, "kernels": kernels,
                                            "steps": stats["steps"], "pass1": acc, "path": path})
                if kernels == "native":
                    bases[(seed, old)] = (path, acc)
    print("pre-training: the same seeds, the old recipe and the new, this CPU's kernels and AVX2's")
    print(common.table(rows), flush=True)
    if "line" not in tables:
        steps = []
    else:
        steps = [-0.01, -0.003, 0.001, 0.003, 0.01, 0.03]
    rows = [["seed", "base", "reward at 0", *[f"{s:+g}" for s in steps]]]
    for seed in args.seeds[:1] if steps else []:
        for old in (True, False):
            path, _ = bases[(seed, old)]
            r0 = line_search(path, [0.0])[0]
            got = line_search(path, steps)
            rows.append([str(seed), "annealed" if old else "band", f"{r0:.3f}", *[f"{g - r0:+.3f}" for g in got]])
            results["line_search"].append({"seed": seed, "annealed": old, "reward": r0, "steps": steps, "after": got})
    print("\nsampled reward change after a normalised step along the policy gradient (negative: backwards)")
    print(common.table(rows), flush=True)

    rows = [["seed", "base", "recipe", *[f"step {s}" for s in range(0, args.steps + 1, 100)], "change"]]
    for seed in args.seeds if "grpo" in tables else []:
        for old in (True, False):
            path, _ = bases[(seed, old)]
            variants = VARIANTS if old and not args.quick else {k: VARIANTS[k] for k in list(VARIANTS)[:1]}
            for name, overrides in variants.items():
                curve = grpo_curve(path, overrides, args.steps)
                rows.append([str(seed), "annealed" if old else "band", name, *[f"{100 * c:.1f}" for c in curve],
                             f"{100 * (curve[-1] - curve[0]):+.1f}"])
                results["grpo"].append({"seed": seed, "annealed": old, "recipe": name, "curve": curve})
                print(common.table(rows[:1] + rows[-1:], record=False).splitlines()[-1], flush=True)
    print(f"\nGRPO on 2-digit addition (configs/arith-grpo.yaml, {args.steps} steps): held-out pass@1, 500 tasks")
    print(common.table(rows))
    common.save("recipe_ablation", results)


if __name__ == "__main__":
    sys.exit(main())
