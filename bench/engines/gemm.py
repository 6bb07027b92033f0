"""The float32 matrix products of engine/gemm.py: torch's F.linear (MKL on x86) against oneDNN,
on the shapes nano's training step and decoding run; the whole nano SFT step (the native path)
and the GRPO trainer's step (transformers' forward, its layers routed) with each, in one process.

    python -m bench.engines.gemm [--threads 1] [--rounds 30]

Table 1: median microseconds of one product (hot caches), GFLOP/s, and which one `linear` takes
on this CPU (`auto`: oneDNN on a non-Intel CPU with AVX-512, above ONEDNN_MIN_MACS). Table 2:
ms per fine-tuning step of the nano SFT job (finetune_vs_trl's rows, batch 16), the two products
alternating every 5 steps (`--rounds` times each), so that both see the same machine. Table 3:
the GRPO trainer's step on 32 prompts x 8 rollouts, its nn.Linear layers routed
(`route_linears`, with oneDNN as the product) or plain, alternating every 3 steps.
"""
from __future__ import annotations

BENCH = {"results": "engines/gemm", "minutes": 5,
         "measures": ("the native path's float32 matrix products, torch's `F.linear` (MKL) vs oneDNN, on nano's "
                      "training and decoding shapes, which one `engine/gemm.linear` takes on this CPU, and the nano SFT"
                      " step with each (alternating in one process)")}   # found by bench/run_all.py

import argparse
import statistics
import sys
import time
from typing import Callable

from bench import common
import torch
import torch.nn.functional as F

from gymloop.engine import gemm

# (M, K, N): x [M, K] @ w [N, K].T, nano's: a batch of 16 x 12 tokens through q/k/v/o and the
# MLP, 16 x 4 trained positions in the last layer, a decode step at batch 1 / 16 / 64
SHAPES = [(192, 128, 128, "training: q/k/v/o, 16 x 12 tokens"), (192, 128, 512, "training: gate / up"),
          (192, 512, 128, "training: down"), (64, 128, 512, "training: last layer's MLP"),
          (64, 128, 391, "training: vocabulary, 64 positions"), (1, 128, 512, "decode, batch 1"),
          (16, 128, 512, "decode, batch 16"), (64, 128, 128, "decode, batch 64: q/k/v/o"),
          (64, 128, 512, "decode, batch 64: gate / up")]


def products() -> list[dict]:
    out = []
    for m, k, n, what in SHAPES:
        x, w = torch.randn(m, k), torch.randn(n, k)
        a, b = (common.median_time(f, repeats=300, warmup=30) * 1e6 for f in (lambda: F.linear(x, w), lambda: gemm._onednn(x, w)))
        takes = gemm.cpu_gemm() if m * k * n >= gemm.ONEDNN_MIN_MACS else "aten"
        out.append({"shape": f"[{m}, {k}] x [{k}, {n}]", "what": what, "aten_us": a, "onednn_us": b,
                    "aten_gflops": 2 * m * k * n / a / 1e3, "onednn_gflops": 2 * m * k * n / b / 1e3, "takes": takes})
    return out


def alternate(step: Callable[[int], object], rounds: int, per_round: int,
              switch: Callable[[str], None] = lambda name: None) -> dict[str, list[float]]:
    """ms per `step(i)` with each product ("aten", "onednn"), `per_round` steps of one then of the
    other, the order flipped every round, the first two rounds (warm-up) not kept. `switch(name)`
    makes any further change a side needs; this process's product is restored after."""
    chosen = gemm.cpu_gemm
    times: dict[str, list[float]] = {"aten": [], "onednn": []}
    i = 0
    try:
        for r in range(rounds + 2):
            for name in (("aten", "onednn") if r % 2 else ("onednn", "aten")):
                gemm.cpu_gemm = lambda name=name: name
                switch(name)
                t0 = time.perf_counter()
                for _ in range(per_round):
                    step(i)
                    i += 1
                if r >= 2:
                    times[name].append((time.perf_counter() - t0) / per_round * 1e3)
    finally:
        gemm.cpu_gemm = chosen
    return times


def report(title: str, times: dict[str, list[float]]) -> float:
    """Print the medians of `alternate`'s times and the speed-up; returns it."""
    a, b = statistics.median(times["aten"]), statistics.median(times["onednn"])
    print(f"\n{title}")
    print(common.table([["product", "ms / step"], ["aten", f"{a:.2f}"], ["oneDNN", f"{b:.2f}"],
                        ["speed-up", f"{a / b:.2f}x"]]))
    return a / b


def sft_steps(rounds: int) -> dict[str, list[float]]:
    """ms per nano SFT step with each product, alternating every 5 steps in one job's set-up."""
    from bench.learning.finetune_vs_trl import prompt, rows

    from gymloop.algorithms.sft import sft_loss
    from gymloop.bases.registry import resolve_model
    from gymloop.finetune.examples import sft_examples
    from gymloop.models.checkpoint import load_model
    from gymloop.trainer.logprobs import CompletionLogprobs
    from gymloop.trainer.optim import optimizer_step

    model, tok = load_model(resolve_model("nano", progress=False))
    data = [{"messages": prompt(p, None) + [{"role": "assistant", "content": c}]} for p, c, _ in rows(16 * 40)]
    examples = sft_examples(tok, data)
    score = CompletionLogprobs(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model.train()

    def step(k: int) -> None:
        batch = examples.batch(range(16 * k, 16 * k + 16))
        loss, _ = sft_loss(score(batch), batch.loss_mask)
        optimizer_step(model, opt, sched, loss, 1.0)

    return alternate(lambda i: step(i % 40), rounds, per_round=5)


def grpo_steps(rounds: int) -> dict[str, list[float]]:
    """ms per GRPO trainer step on one rollout batch, the model's layers routed or plain."""
    from gymloop.algorithms import PolicyLoss, advantages_for
    from gymloop.bases.registry import resolve_model
    from gymloop.engine import NativeEngine, SamplingParams
    from gymloop.envs import ArithEnv
    from gymloop.models.checkpoint import load_model
    from gymloop.rollout.episodes import collect
    from gymloop.trainer.trainer import Trainer, rollouts_to_batch
    from gymloop.trainer.objectives import PolicyObjective

    model, tok = load_model(resolve_model("nano", progress=False))
    env = ArithEnv()
    rolls, _ = collect(NativeEngine(model, tok.pad_token_id), tok, env, env.sample_tasks(32, "train", 0), 8,
                       SamplingParams(max_new_tokens=6, seed=0))
    adv = advantages_for(rolls, 8, "grpo", drop_zero_signal=False)
    batch = rollouts_to_batch(adv.rollouts, tok.pad_token_id)
    trainer = Trainer(model, lr=1e-9)                 # routes the layers where oneDNN is this CPU's product
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def switch(name: str) -> None:
        for m in layers:
            m.__class__ = gemm.RoutedLinear if name == "onednn" else torch.nn.Linear

    return alternate(lambda i: trainer.step(batch, PolicyObjective(PolicyLoss(), adv.advantages)), rounds,
                     per_round=3, switch=switch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not torch.backends.mkldnn.is_available():
        print("this torch has no oneDNN: nothing to compare")
        return
    print(f"CPU: {gemm.cpu_vendor() or 'unknown vendor'}, torch capability {torch.backends.cpu.get_cpu_capability()}; "
          f"auto picks {gemm.auto_gemm(gemm.cpu_vendor(), torch.backends.cpu.get_cpu_capability())}")
    prods = products()
    t = [["product", "what", "aten us", "oneDNN us", "aten GFLOP/s", "oneDNN GFLOP/s", "linear takes"]]
    t += [[p["shape"], p["what"], f"{p['aten_us']:.1f}", f"{p['onednn_us']:.1f}", f"{p['aten_gflops']:.0f}",
           f"{p['onednn_gflops']:.0f}", p["takes"]] for p in prods]
    print(common.table(t), flush=True)
    steps = sft_steps(args.rounds)
    sft = report(f"nano SFT step (batch 16), products alternating every 5 steps, median of {args.rounds} rounds", steps)
    grpo = grpo_steps(max(4, args.rounds // 2))
    grpo_up = report("GRPO trainer step (32 prompts x 8, transformers' forward), layers plain (aten) or routed (oneDNN)",
                     grpo)
    common.save("engines/gemm", {"args": vars(args), "products": prods, "sft_step_ms": steps, "speedup": sft,
                               "grpo_step_ms": grpo, "grpo_speedup": grpo_up})


if __name__ == "__main__":
    sys.exit(main())
