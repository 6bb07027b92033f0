"""GRPO on multi-turn tool use: the nano-tools base adapting to the tools@v3 API change.

    python bench/tools_grpo.py [--version 3] [--steps 60] [--prompts 16] [--lr 2e-4]

nano-tools calls the v1 tools by default (the prompt lists no tools), so on tools@v3, whose tools
and arguments were renamed, it starts at ~0% held-out; the v3 episodes it samples now and then
are what GRPO learns from. This is chapter 2's recovery without the server and the gate. Also
reports the trained model on the other API versions.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import common
import torch

from gymloop.models.checkpoint import load_model
from gymloop.engine import Engine
from gymloop.envs import make_env
from gymloop.rollout.evaluate import evaluate
from gymloop.jobs.recipes import tools_config
from gymloop.orchestrator.train import train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nano-tools", help="preset name or model directory")
    ap.add_argument("--version", type=int, default=3, choices=[1, 2, 3], help="tool API trained on")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--max-staleness", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine"])
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=40, help="per turn (a tool call is ~15 tokens)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = tools_config(tempfile.mkdtemp(), model=args.model, version=args.version, steps=args.steps, prompts=args.prompts, lr=args.lr,
                       lr_schedule=args.lr_schedule, temperature=args.temperature,
                       max_staleness=args.max_staleness, max_new_tokens=args.max_new_tokens,
                       eval_tasks=args.eval_tasks)
    s = train(cfg, progress=True, echo=print)
    model, tok = load_model(f"{s['run_dir']}/checkpoint")
    engine = Engine(model, tok.pad_token_id, decode=tok.decode)
    drift = {}
    others = [v for v in (1, 2, 3) if v != args.version]
    for v in others:
        env = make_env("tools", version=v, schemas=False)
        name = env.name
        drift[name] = evaluate(engine, tok, env, env.sample_tasks(args.eval_tasks, "heldout", 0),
                               max_new_tokens=args.max_new_tokens, max_turns=3)
    rows = [["suite", "base success", "after GRPO", "change"],
            [f"tools@v{args.version} (trained)", f"{s['base']['pass1']:.1%}", f"{s['final']['pass1']:.1%}",
             f"{100 * (s['final']['pass1'] - s['base']['pass1']):+.1f} pts"]]
    rows += [[f"{name}", "", f"{r.pass1:.1%}", ""] for name, r in drift.items()]
    print(f"GRPO on tools@v{args.version} (no schemas in the prompt), {args.model}, {s['steps']} steps, {args.eval_tasks} held-out tasks (greedy, <= 3 turns)")
    print(common.table(rows))
    print("held-out success curve:", [(c["step"], round(c["pass1"], 3)) for c in s["pass1_curve"]])
    common.save("tools_grpo", {"summary": {k: s[k] for k in ("base", "final", "steps", "pass1_curve", "wall_seconds")},
                               "drifted_after": {k: r.as_dict() for k, r in drift.items()}})


if __name__ == "__main__":
    sys.exit(main())
