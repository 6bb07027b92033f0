"""Learning through the fine-tuning API: the official `openai` client against a real
`gymloop serve` of the nano base, jobs run by the server's worker, scores measured through chat
completions on held-out prompts (greedy), base vs the fine-tuned model.

    python -m bench.learning.finetune_api [--model nano [nano:seed=1 ...]] [--sft-rows 4000] [--dpo-rows 2000] [--heldout 300]
                                       [--only sft dpo rft] [--auto]

--auto sends no hyper-parameters at all (every one "auto": what the service picks for the model,
the method and the data size); without it, the flags below set epochs and multipliers.

1. SFT teaches a task the base cannot do: 2-digit subtraction (the base was pre-trained on
   addition only), from gold examples of the arith environment's train split.
2. DPO on addition: the preferred answer is the gold one, the other the base's own wrong sample
   for that prompt (temperature 1), so the pairs are what the base gets wrong.
3. RFT (method reinforcement) on addition: prompts and their answers, a python grader run in
   the sandbox (1 when the reply's last integer is the answer), GRPO in the server's worker.
Also: the job's trained tokens, seconds and cost from the ledger.
"""
from __future__ import annotations

BENCH = {"results": "learning/finetune_api", "minutes": 60,
         "measures": ("learning through the fine-tuning API: SFT, DPO and RFT (reinforcement, python grader in the "
                      "sandbox) jobs from the `openai` client against `gymloop serve`, scored through chat completions")}   # found by bench/run_all.py

import argparse
import sys
import tempfile
from pathlib import Path

from bench import common
import torch
from openai import OpenAI

from gymloop.envs import make_env
from gymloop.serve import ServeConfig
from gymloop.serve.background import serving

KEY = "sk-bench"


def score(client: OpenAI, model: str, env, tasks) -> float:
    """Greedy held-out pass@1 through chat completions, verified by the environment."""
    ok = 0
    for t in tasks:
        r = client.chat.completions.create(model=model, messages=list(t.prompt), max_tokens=8, temperature=0)
        ok += env.verify(t, list(t.prompt) + [{"role": "assistant", "content": r.choices[0].message.content}]).reward == 1
    return ok / len(tasks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", default=["nano"], help="the base(s) served; each gets its own server, "
                    "jobs and table")
    ap.add_argument("--sft-rows", type=int, default=4000)
    ap.add_argument("--dpo-rows", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=1.0, help="SFT learning_rate_multiplier")
    ap.add_argument("--dpo-lr", type=float, default=0.1, help="DPO learning_rate_multiplier")
    ap.add_argument("--dpo-sft-weight", type=float, default=0.0, help="DPO's NLL term on the preferred answer (RPO)")
    ap.add_argument("--dpo-beta", type=float, default=0.1)
    ap.add_argument("--rft-rows", type=int, default=2000)
    ap.add_argument("--rft-epochs", type=int, default=2)
    ap.add_argument("--rft-lr", type=float, default=0.2, help="RFT learning_rate_multiplier (x 1e-3)")
    ap.add_argument("--only", choices=["sft", "dpo", "rft"], nargs="*", help="run only these jobs")
    ap.add_argument("--auto", action="store_true", help="send no hyper-parameters: every one is the service's auto")
    args = ap.parse_args()
    only = set(args.only or ["sft", "dpo", "rft"])
    torch.set_num_threads(1)
    out: dict = {}
    summary = [["base", *(f"{k.upper()}: base -> fine-tuned" for k in ("sft", "dpo", "rft") if k in only)]]
    for model in args.model:
        out[model] = one_base(model, args, only)
        summary.append([model, *(f"{out[model][k]['base']:.1%} -> {out[model][k]['after']:.1%} "
                                 f"({100 * (out[model][k]['after'] - out[model][k]['base']):+.1f})"
                                 for k in ("sft", "dpo", "rft") if k in only)])
    if len(args.model) > 1:
        print(common.table(summary, title="every base" + (" (auto hyper-parameters)" if args.auto else "")))
    # a variant of the default run (one other base, some methods, auto) is saved apart, its name the parts
    parts = ([] if args.model == ["nano"] or len(args.model) > 1 else [args.model[0].replace(":", "_").replace("=", "")])
    parts += ([] if len(only) == 3 else sorted(only)) + (["auto"] if args.auto else [])
    common.save("learning/finetune_api" + ("-" + "_".join(parts) if parts else ""),
                out if len(args.model) > 1 else out[args.model[0]])


def one_base(model: str, args, only: set[str]) -> dict:
    """Serve `model`, run the jobs on it, print its table; what they measured."""
    root = Path(tempfile.mkdtemp())
    cfg = ServeConfig(model=model, model_name="nano", db=str(root / "store.db"), api_keys=[KEY],
                      jobs_dir=str(root / "jobs"), max_tokens_limit=64)
    out: dict = {}
    rows = [["job", "held-out task", "base", "fine-tuned", "change", "trained tokens", "job seconds", "dollars"]]
    with serving(cfg) as (base, _, store):
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        if "sft" in only:
            sft_job(client, store, args, rows, out)
        if "dpo" in only:
            dpo_job(client, store, args, rows, out)
        if "rft" in only:
            rft_job(client, store, args, rows, out)
    title = f"fine-tuning through the API ({model}; {args.heldout} held-out prompts, greedy, via chat completions)"
    print("\n" + title)
    for line in out.get("settings", []):
        print("  " + line)
    print(common.table(rows, title=title))
    return out


def method(args, kind: str, hyper: dict, **fields) -> dict:
    """The job's method: `hyper` as given, or none at all with --auto (fields such as the grader stay)."""
    return {"type": kind, kind: {**fields, **({} if args.auto else {"hyperparameters": hyper})}}


def report(store, rows, out, key, job, sec, task, before, after, extra=None):
    ledger = {r["run_id"]: r for r in store.ledger.rows("fine_tuning")}[job.id]
    rows.append([key.upper(), task, f"{before:.1%}", f"{after:.1%}", f"{100 * (after - before):+.1f} pts",
                 f"{job.trained_tokens:,}", f"{sec:.0f}", f"${ledger['dollars']:.4f}"])
    out[key] = {"base": before, "after": after, "trained_tokens": job.trained_tokens, "seconds": sec,
                "dollars": ledger["dollars"], "model": job.fine_tuned_model, **(extra or {})}
    print(f"  {key.upper()}: {before:.3f} -> {after:.3f}", flush=True)


def sft_job(client, store, args, rows, out):
    """1. SFT: subtraction, which the base was never taught."""
    sub = make_env("arith", ops="-")
    train = sub.sample_tasks(args.sft_rows, "train", seed=0)
    sft = [{"messages": list(t.prompt) + [{"role": "assistant", "content": sub.gold_reply(t)}]} for t in train]
    held = sub.sample_tasks(args.heldout, "heldout", seed=0)
    before = score(client, "nano", sub, held)
    job, sec = common.run_job(client, "nano", sft, method(args, "supervised", {
        "n_epochs": args.epochs, "batch_size": 32, "learning_rate_multiplier": args.sft_lr}), "sub")
    report(store, rows, out, "sft", job, sec, "2-digit subtraction", before, score(client, job.fine_tuned_model, sub, held))
    out.setdefault("settings", []).append(f"SFT: {args.sft_rows} examples, " + (_auto(job) if args.auto else
                                          f"{args.epochs} epochs, lr x{args.sft_lr}"))


def dpo_job(client, store, args, rows, out):
    """2. DPO: addition, against the base's own mistakes."""
    add = make_env("arith")
    pairs = []
    for t in add.sample_tasks(args.dpo_rows * 3, "train", seed=1):
        if len(pairs) >= args.dpo_rows:
            break
        r = client.chat.completions.create(model="nano", messages=list(t.prompt), max_tokens=8, temperature=1.0)
        text = r.choices[0].message.content
        if add.verify(t, list(t.prompt) + [{"role": "assistant", "content": text}]).reward < 1:
            pairs.append({"input": {"messages": list(t.prompt)},
                          "preferred_output": [{"role": "assistant", "content": add.gold_reply(t)}],
                          "non_preferred_output": [{"role": "assistant", "content": text}]})
    held = add.sample_tasks(args.heldout, "heldout", seed=0)
    before = score(client, "nano", add, held)
    job, sec = common.run_job(client, "nano", pairs, method(args, "dpo", {
        "n_epochs": 2, "batch_size": 16, "beta": args.dpo_beta, "learning_rate_multiplier": args.dpo_lr,
        "sft_weight": args.dpo_sft_weight}), "dpo")
    report(store, rows, out, "dpo", job, sec, "2-digit addition", before, score(client, job.fine_tuned_model, add, held),
           {"pairs": len(pairs)})
    out.setdefault("settings", []).append(f"DPO: {len(pairs)} pairs, " + (_auto(job) if args.auto else
                                          f"2 epochs, beta {args.dpo_beta}, lr x{args.dpo_lr}, "
                                          f"sft_weight {args.dpo_sft_weight}"))


GRADER = {"type": "python", "name": "last_integer",
          "source": "import re\n"
                    "def grade(sample, item):\n"
                    "    found = re.findall(r'-?\\d+', sample['output_text'])\n"
                    "    return float(bool(found) and int(found[-1]) == int(item['answer']))\n"}


def rft_job(client, store, args, rows, out):
    """3. RFT: addition prompts with their answers; the python grader (in the sandbox) rewards a
    reply whose last integer is the answer."""
    add = make_env("arith")
    prompts = [{"messages": list(t.prompt), "answer": str(t.answer)}
               for t in add.sample_tasks(args.rft_rows, "train", seed=2)]
    held = add.sample_tasks(args.heldout, "heldout", seed=0)
    before = score(client, "nano", add, held)
    job, sec = common.run_job(client, "nano", prompts, method(args, "reinforcement", {
        "n_epochs": args.rft_epochs, "batch_size": 32, "group_size": 8, "max_new_tokens": 6,
        "learning_rate_multiplier": args.rft_lr, "eval_samples": 100}, grader=GRADER), "rft")
    report(store, rows, out, "rft", job, sec, "2-digit addition", before, score(client, job.fine_tuned_model, add, held))
    out.setdefault("settings", []).append(f"RFT: {args.rft_rows} prompts, " + (_auto(job) if args.auto else
                                          f"{args.rft_epochs} epochs, 32 prompts/step, 8 samples each, lr x{args.rft_lr}")
                                          + ", python grader in the sandbox")


def _auto(job) -> str:
    """What "auto" resolved to, as the job reports it."""
    h = job.method.model_dump()[job.method.type]["hyperparameters"]
    return "auto: " + ", ".join(f"{k} {v}" for k, v in h.items() if v is not None)


if __name__ == "__main__":
    sys.exit(main())
