"""Time to a held-out accuracy: gymloop GRPO vs TRL's GRPOTrainer, same base, same task.

    python bench/grpo_vs_trl.py [--model nano] [--gain 0.15 | --target 0.6] [--budget 300] [--lr 2e-4]

The target is the base's own held-out pass@1 plus `--gain` (15 points by default), measured on
the same held-out tasks both systems are scored on, so the climb is the same whatever base the
machine's pre-training produced (`--target` fixes it instead).

Both start from the cached nano base, train on the 2-digit-addition train split with 8 samples
per task and 16 tasks per step, the same learning rate, Adam betas, warm-up, clip range and
token-level loss, and are evaluated greedily on the same held-out tasks every `--every` steps.
The clock counts training only (evaluation is paused out of both). TRL runs on CPU without vLLM.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import common
import torch

from gymloop.models.checkpoint import load_model
from gymloop.bases.registry import resolve_model
from gymloop.config import EvalConfig, GRPOConfig, SamplingConfig, TrainConfig
from gymloop.engine import Engine
from gymloop.envs import ArithEnv
from gymloop.envs.arith import parse_answer
from gymloop.rollout.evaluate import evaluate
from gymloop.orchestrator.train import train


def run_gymloop(args, max_staleness: int = 0) -> dict:
    cfg = TrainConfig(
        model=args.model, name="bench-gymloop", run_dir=tempfile.mkdtemp(), threads=args.threads,
        sampling=SamplingConfig(max_new_tokens=6),
        grpo=GRPOConfig(steps=args.max_steps, prompts_per_step=16, group_size=8, lr=args.lr,
                        warmup_steps=20, betas=(0.9, 0.999), clip_low=0.2, clip_high=0.28,
                        max_staleness=max_staleness),
        eval=EvalConfig(tasks=args.tasks, every=args.every, max_new_tokens=6),
        stop_at_pass1=args.target,
    )
    s = train(cfg, progress=False, echo=lambda m: None)
    hit = next((c for c in s["pass1_curve"] if c["pass1"] >= args.target), None)
    return {"curve": s["pass1_curve"], "seconds_to_target": hit and hit["train_seconds"],
            "steps_to_target": hit and hit["step"], "base": s["base"]["pass1"]}


def run_trl(args) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    model, tok = load_model(resolve_model(args.model))
    env = ArithEnv()
    held = env.sample_tasks(args.tasks, "heldout", seed=0)
    train_tasks = env.sample_tasks(8000, "train", seed=0)   # TRL cycles through it
    ds = Dataset.from_list([{"prompt": list(t.prompt), "answer": t.answer} for t in train_tasks])

    def reward(prompts, completions, answer, **kw):
        return [float(parse_answer(c[0]["content"]) == a) for c, a in zip(completions, answer)]

    curve, clock = [], {"paused": 0.0, "t0": 0.0}

    def held_out() -> float:
        return evaluate(Engine(model, tok.pad_token_id), tok, env, held, max_new_tokens=6).pass1

    class Eval(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            clock["t0"] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if state.global_step % args.every:
                return
            t_pause = time.perf_counter()
            acc = held_out()
            model.train()
            elapsed = t_pause - clock["t0"] - clock["paused"]
            clock["paused"] += time.perf_counter() - t_pause
            curve.append({"step": state.global_step, "pass1": acc, "train_seconds": elapsed})
            if acc >= args.target or elapsed > args.budget:
                control.should_training_stop = True

    curve.append({"step": 0, "pass1": held_out(), "train_seconds": 0.0})
    cfg = TRLConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, learning_rate=args.lr,
        adam_beta1=0.9, adam_beta2=0.999, warmup_steps=20, lr_scheduler_type="constant_with_warmup",
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        per_device_train_batch_size=16 * 8, num_generations=8, max_completion_length=6,
        max_steps=args.max_steps, temperature=1.0, logging_steps=10_000, save_strategy="no",
        report_to=[], seed=0, disable_tqdm=True,
    )
    GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                processing_class=tok.hf, callbacks=[Eval()]).train()
    hit = next((c for c in curve if c["pass1"] >= args.target), None)
    return {"curve": curve, "seconds_to_target": hit and hit["train_seconds"],
            "steps_to_target": hit and hit["step"], "base": curve[0]["pass1"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nano", help="model spec (nano, nano:seed=1, a directory)")
    ap.add_argument("--gain", type=float, default=0.15, help="target = base held-out pass@1 + this")
    ap.add_argument("--target", type=float, default=None, help="a fixed target instead of base + gain")
    ap.add_argument("--budget", type=float, default=300, help="training seconds before giving up")
    ap.add_argument("--max-steps", type=int, default=1500)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-trl", action="store_true", help="only gymloop (sync and async)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(resolve_model(args.model))
    env = ArithEnv()
    base = evaluate(Engine(model, tok.pad_token_id), tok, env, env.sample_tasks(args.tasks, "heldout", seed=0),
                    max_new_tokens=6).pass1
    if args.target is None:
        args.target = round(base + args.gain, 4)
    print(f"base held-out pass@1 {base:.3f} on {args.tasks} tasks; target {args.target:.3f}", flush=True)
    ours = run_gymloop(args)
    ours_async = run_gymloop(args, max_staleness=1)
    theirs = run_trl(args) if not args.skip_trl else None

    def fmt(r):
        return f"{r['seconds_to_target']:.1f}" if r["seconds_to_target"] is not None else f"> {r['curve'][-1]['train_seconds']:.0f} (not reached)"

    def per_step(r):
        c = r["curve"][-1]
        return f"{c['train_seconds'] / max(c['step'], 1):.3f}"

    rows = [["system", "base pass@1", f"steps to {args.target:.0%}", f"seconds to {args.target:.0%}",
             "s/step", "last pass@1"]]
    systems = [("gymloop (sync)", ours), ("gymloop (async, staleness 1)", ours_async)]
    systems += [("TRL GRPOTrainer", theirs)] if theirs else []
    for name, r in systems:
        rows.append([name, f"{r['base']:.3f}", str(r["steps_to_target"] or "-"), fmt(r), per_step(r),
                     f"{r['curve'][-1]['pass1']:.3f}"])
    print(f"GRPO to {args.target:.0%} held-out pass@1 on 2-digit addition ({args.tasks} held-out tasks), "
          f"G=8, 16 prompts/step, lr {args.lr}, {args.threads} thread(s)")
    print(common.table(rows))
    for name, r in systems[:2]:
        if not theirs:
            break
        if r["seconds_to_target"] and theirs["seconds_to_target"]:
            print(f"speed-up of {name} (TRL seconds / gymloop seconds): "
                  f"{theirs['seconds_to_target'] / r['seconds_to_target']:.2f}x")
        elif r["seconds_to_target"]:
            print(f"speed-up of {name}: > {theirs['curve'][-1]['train_seconds'] / r['seconds_to_target']:.2f}x "
                  "(TRL did not reach the target)")
    common.save("grpo_vs_trl", {"args": vars(args), "gymloop": ours, "gymloop_async": ours_async, "trl": theirs})


if __name__ == "__main__":
    sys.exit(main())
