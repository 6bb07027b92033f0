"""Data-parallel training memory and speed: whole replicas (DDP) vs sharded (FSDP), 2 ranks.

    python -m bench.training.sharding [--steps 3] [--seq 64] [--rows 4]

A 135M-parameter Llama (SmolLM2-135M's shape, random weights) trained with gymloop's Trainer
on 2 processes over gloo, each rank `rows` sequences of `seq` tokens per step, as the trainer
actors (cluster.trainers: 2, with and without cluster.fsdp) run it. Per rank: the bytes of
parameters, gradients and Adam state it holds (counted from its tensors), its peak RSS, and
its RSS after training and at its peak, and the median step time. FSDP's point is the
training state: 1/N per rank. The ranks run with MALLOC_MMAP_THRESHOLD_=131072: glibc's
default threshold rises as large blocks are freed, after which freed memory (the whole model
each rank builds before sharding it, FSDP's gather buffers) stays in the heap and RSS hides the
difference (measured: 2.8 GiB either way).
"""
from __future__ import annotations

BENCH = {"results": "training/sharding", "minutes": 5,
         "measures": ("data-parallel training of a 135M Llama on 2 ranks, whole replicas (DDP) vs sharded (FSDP): "
                      "training state, RSS and step time per rank")}   # found by bench/run_all.py

import argparse
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time

from bench import common
import torch


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def _rank(rank: int, port: int, fsdp: bool, args, out) -> None:
    from gymloop.algorithms import PolicyLoss
    from gymloop.trainer import sharding
    from gymloop.trainer.logprobs import make_batch
    from gymloop.trainer.trainer import Trainer
    from gymloop.trainer.objectives import PolicyObjective

    from bench.training.weight_sync import smollm_shaped

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = smollm_shaped()
    if fsdp:
        sharding.shard(model, 2)
    trainer = Trainer(model, lr=1e-5)
    g = torch.Generator().manual_seed(rank)
    seqs = [torch.randint(0, 49152, (args.seq,), generator=g).tolist() for _ in range(args.rows)]
    batch = make_batch(seqs, [[0] * 8 + [1] * (args.seq - 8)] * args.rows, None, 0)
    adv = torch.randn(args.rows, generator=g)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        trainer.step(batch, PolicyObjective(PolicyLoss(clip_high=0.2), adv))
        times.append(time.perf_counter() - t0)
    params = list(model.parameters())
    state = {
        "params": _bytes(params),
        "grads": _bytes(p.grad for p in params if p.grad is not None),
        "adam": _bytes(v for s in trainer.opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss": int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize(),
        "step_s": statistics.median(times[1:] or times),
    }
    out.put((rank, state))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run(fsdp: bool, args) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")    # read by glibc as each rank starts
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, fsdp, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(120)
    return [got[r] for r in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rows", type=int, default=4)
    args = ap.parse_args()
    gb = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    rows = [["mode", "rank", "params", "grads", "Adam state", "training state", "RSS after", "peak RSS", "step s"]]
    results = {}
    for name, fsdp in (("DDP (whole replicas)", False), ("FSDP (sharded)", True)):
        ranks = run(fsdp, args)
        results[name] = ranks
        for r, st in enumerate(ranks):
            rows.append([name, str(r), gb(st["params"]), gb(st["grads"]), gb(st["adam"]),
                         gb(st["params"] + st["grads"] + st["adam"]), gb(st["rss"]), gb(st["peak_rss"]), f"{st['step_s']:.2f}"])
    ddp, fs = (sum(s["params"] + s["grads"] + s["adam"] for s in results[k]) / 2 for k in results)
    print(f"Training state per rank, 135M Llama, 2 ranks (gloo), {args.rows} x {args.seq} tokens per rank per step")
    print(common.table(rows))
    print(f"FSDP holds {fs / ddp:.0%} of DDP's training state per rank")
    common.save("training/sharding", {"args": vars(args), **results})


if __name__ == "__main__":
    sys.exit(main())
