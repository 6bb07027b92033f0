"""Learning through the fine-tuning API: the official `openai` client against a real
`gymloop serve` of the nano base, jobs run by the server's worker, scores measured through chat
completions on held-out prompts (greedy), base vs the fine-tuned model.

    python bench/finetune_api_bench.py [--model nano] [--sft-rows 4000] [--dpo-rows 2000] [--heldout 300]

1. SFT teaches a task the base cannot do: 2-digit subtraction (the base was pre-trained on
   addition only), from gold examples of the arith environment's train split.
2. DPO on addition: the preferred answer is the gold one, the other the base's own wrong sample
   for that prompt (temperature 1), so the pairs are what the base gets wrong.
Also: the job's trained tokens, seconds and cost from the ledger.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import common
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


def run_job(client: OpenAI, rows: list[dict], method: dict, suffix: str) -> tuple:
    data = "\n".join(json.dumps(r) for r in rows).encode()
    f = client.files.create(file=(f"{suffix}.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert f.status == "processed", f.status_details
    job = client.fine_tuning.jobs.create(model="nano", training_file=f.id, suffix=suffix, seed=0, method=method)
    t0 = time.perf_counter()
    while job.status not in ("succeeded", "failed", "cancelled"):
        time.sleep(1.0)
        job = client.fine_tuning.jobs.retrieve(job.id)
    if job.status != "succeeded":
        raise SystemExit(f"job {job.id} {job.status}: {job.error}")
    return job, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nano")
    ap.add_argument("--sft-rows", type=int, default=4000)
    ap.add_argument("--dpo-rows", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=1.0, help="SFT learning_rate_multiplier")
    ap.add_argument("--dpo-lr", type=float, default=0.1, help="DPO learning_rate_multiplier")
    ap.add_argument("--dpo-sft-weight", type=float, default=0.0, help="DPO's NLL term on the preferred answer (RPO)")
    ap.add_argument("--dpo-beta", type=float, default=0.1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    cfg = ServeConfig(model=args.model, model_name="nano", db=str(root / "store.db"), api_keys=[KEY],
                      jobs_dir=str(root / "jobs"), max_tokens_limit=64)
    out: dict = {}
    rows = [["job", "held-out task", "base", "fine-tuned", "change", "trained tokens", "job seconds", "dollars"]]
    with serving(cfg) as (base, _, store):
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        # 1. SFT: subtraction
        sub = make_env("arith", ops="-")
        train = sub.sample_tasks(args.sft_rows, "train", seed=0)
        sft = [{"messages": list(t.prompt) + [{"role": "assistant", "content": sub.gold_reply(t)}]} for t in train]
        held = sub.sample_tasks(args.heldout, "heldout", seed=0)
        before = score(client, "nano", sub, held)
        job, sec = run_job(client, sft, {"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": args.epochs, "batch_size": 32, "learning_rate_multiplier": args.sft_lr}}}, "sub")
        after = score(client, job.fine_tuned_model, sub, held)
        ledger = {r["run_id"]: r for r in store.ledger_rows("fine_tuning")}[job.id]
        rows.append(["SFT", "2-digit subtraction", f"{before:.1%}", f"{after:.1%}", f"{100 * (after - before):+.1f} pts",
                     f"{job.trained_tokens:,}", f"{sec:.0f}", f"${ledger['dollars']:.4f}"])
        out["sft"] = {"base": before, "after": after, "trained_tokens": job.trained_tokens, "seconds": sec,
                      "dollars": ledger["dollars"], "model": job.fine_tuned_model}
        print(f"  SFT: {before:.3f} -> {after:.3f}", flush=True)
        # 2. DPO: addition, against the base's own mistakes
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
        job, sec = run_job(client, pairs, {"type": "dpo", "dpo": {"hyperparameters": {
            "n_epochs": 2, "batch_size": 16, "beta": args.dpo_beta, "learning_rate_multiplier": args.dpo_lr,
            "sft_weight": args.dpo_sft_weight}}}, "dpo")
        after = score(client, job.fine_tuned_model, add, held)
        ledger = {r["run_id"]: r for r in store.ledger_rows("fine_tuning")}[job.id]
        rows.append(["DPO", "2-digit addition", f"{before:.1%}", f"{after:.1%}", f"{100 * (after - before):+.1f} pts",
                     f"{job.trained_tokens:,}", f"{sec:.0f}", f"${ledger['dollars']:.4f}"])
        out["dpo"] = {"base": before, "after": after, "pairs": len(pairs), "trained_tokens": job.trained_tokens,
                      "seconds": sec, "dollars": ledger["dollars"]}
        print(f"  DPO: {before:.3f} -> {after:.3f}", flush=True)
    print(f"\nfine-tuning through the API ({args.model}; {args.heldout} held-out prompts, greedy, via chat completions; "
          f"SFT {args.sft_rows} examples x {args.epochs} epochs, lr x{args.sft_lr}; DPO {out['dpo']['pairs']} pairs x 2 "
          f"epochs, beta {args.dpo_beta}, lr x{args.dpo_lr}, sft_weight {args.dpo_sft_weight})")
    print(common.table(rows))
    common.save("finetune_api_bench", out)


if __name__ == "__main__":
    sys.exit(main())
