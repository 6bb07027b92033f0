"""Generation throughput: gymloop's engine vs Hugging Face `model.generate`, nano model.

    python -m bench.engines.generation [--threads 1]

Two workloads at batch 1, 16 and 64, 16-token prompts:
- fixed: 32 new tokens, no stop token (pure decode speed);
- rl: the GRPO workload, arithmetic prompts sampled at temperature 1 until EOS (<= 8 tokens),
  where rows finish at different steps.
Reports median tokens/s over repeats and the ratio.
"""
from __future__ import annotations

BENCH = {"results": "engines/generation", "minutes": 5,
         "measures": ("generation tokens/s, gymloop engine vs `model.generate`, batch 1/16/64, a fixed-length workload "
                      "and the RL workload (arithmetic, stop at EOS)")}   # found by bench/run_all.py

import argparse
import sys

from bench import common  # noqa: F401  (sets OMP_WAIT_POLICY before torch)
import torch

from gymloop.models.checkpoint import load_model
from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.envs import ArithEnv


def hf_generate(model, prompts, max_new, eos, pad):
    ids = torch.full((len(prompts), max(map(len, prompts))), pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, ids.shape[1] - len(p):] = torch.tensor(p)
        mask[i, ids.shape[1] - len(p):] = 1
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=True,
                             temperature=1.0, top_k=0, pad_token_id=pad, eos_token_id=eos)
    gen = out[:, ids.shape[1]:]
    if eos is None:
        return gen.numel()
    # count tokens up to and including the first EOS of each row
    n = 0
    for row in gen.tolist():
        n += row.index(eos) + 1 if eos in row else len(row)
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(resolve_model("nano"))
    engine = NativeEngine(model, tok.pad_token_id)
    env = ArithEnv()
    rows = [["workload", "batch", "gymloop tok/s", "generate tok/s", "ratio"]]
    results = []
    for workload in ("fixed", "rl"):
        for batch in (1, 16, 64):
            if workload == "fixed":
                g = torch.Generator().manual_seed(0)
                prompts = [torch.randint(7, tok.vocab_size, (16,), generator=g).tolist() for _ in range(batch)]
                max_new, eos, stop = 32, None, ()
            else:
                tasks = env.sample_tasks(batch, "train", seed=batch)
                prompts = [tok.prompt_ids(t.prompt) for t in tasks]
                max_new, eos, stop = 8, tok.hf.eos_token_id, (tok.hf.eos_token_id,)
            counts = {}
            params = SamplingParams(max_new_tokens=max_new, temperature=1.0, stop_token_ids=stop, seed=0)

            def ours():
                counts["ours"] = engine.generate(prompts, params).generated_tokens

            def theirs():
                counts["hf"] = hf_generate(model, prompts, max_new, eos, tok.pad_token_id)

            t_ours, t_hf = common.alternating_medians(ours, theirs, args.repeats)
            a, b = counts["ours"] / t_ours, counts["hf"] / t_hf
            rows.append([workload, batch, f"{a:,.0f}", f"{b:,.0f}", f"{a / b:.2f}x"])
            results.append({"workload": workload, "batch": batch, "gymloop_tok_s": a, "generate_tok_s": b,
                            "ratio": a / b})
    title = (f"Generation throughput, nano ({sum(p.numel() for p in model.parameters()):,} params), gymloop's engine vs "
             f"transformers' generate (KV cache on); both: the same model object in one process, {args.threads} torch "
             f"thread(s), {next(model.parameters()).dtype}, sampling at T=1; median of {args.repeats}, the two alternating")
    print(title)
    print(common.table(rows, title=title))
    common.save("engines/generation", {"threads": args.threads, "results": results})


if __name__ == "__main__":
    sys.exit(main())
