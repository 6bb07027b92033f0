"""Weight sync: publishing a new version from the trainer to a generation engine.

    python bench/weight_sync_bench.py

For the nano model and a 135M-parameter Llama (SmolLM2-135M's shape, random weights):
- in-process: trainer and engine share tensors; publishing is a version bump (0 bytes copied);
- shared memory: `SharedWeights.write` (trainer -> the shared buffer not in use, one copy) and
  `read_into` (the collector's engine re-points its parameters at it, no copy), the path of
  the asynchronous collector process;
- Ray: the trainer packs the weights into buckets (`cluster.buckets.pack`), puts each in the
  object store, and a rollout-worker actor loads them (`RaySource.publish` + the worker's
  `load`), end to end, on a private local Ray instance;
- memcpy: one plain copy of the same bytes, measured in the same run (the ceiling).
Goal (issue #7): cross-process sync >= 50% of memcpy bandwidth.
"""
from __future__ import annotations

import multiprocessing as mp
import sys

import common
import torch

from gymloop.checkpoint import load_model, resolve_model
from gymloop.engine import Engine
from gymloop.sources import SharedWeights


def ray_sync(model: torch.nn.Module, tok) -> float:
    """Median seconds of pack -> put -> actor load for one version."""
    import ray

    from gymloop.cluster.buckets import pack
    from gymloop.cluster.ray_backend import RolloutWorker

    worker = ray.remote(num_cpus=1)(RolloutWorker).remote(model.config, tok, None)

    def once():
        buckets, layout = pack(model.state_dict(), 64 << 20)
        refs = [ray.put(b) for b in buckets]
        ray.get(worker.load.remote(3, layout, *refs))

    once()                  # actor start-up is not weight sync
    t = common.median_time(once, repeats=5)
    ray.kill(worker)
    return t


def smollm_shaped() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def main() -> None:
    torch.set_num_threads(1)
    nano, tok = load_model(resolve_model("nano"))
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    rows = [["model", "bytes", "in-process", "shared memory (write+read)", "GB/s", "Ray (pack+put+load)", "GB/s",
             "memcpy GB/s", "shm / Ray of memcpy"]]
    out = {}
    for name, model in (("nano", nano), ("135M llama", smollm_shaped())):
        # tied tensors (embedding = lm_head) are one tensor: counted, and moved, once
        unique = {t.data_ptr(): t for t in model.state_dict().values()}
        nbytes = sum(t.numel() * t.element_size() for t in unique.values())
        engine = Engine(model, 0)
        t_in = common.median_time(lambda: engine.load_weights(model.state_dict(), version=1), repeats=5)
        shared = SharedWeights(model, mp.get_context("fork"))
        other = Engine(__import__("copy").deepcopy(model), 0)

        def shm():
            shared.write(model, 2)
            shared.read_into(other)

        t_shm = common.median_time(shm, repeats=5)
        flat_src = torch.empty(nbytes // 4)
        flat_dst = torch.empty_like(flat_src)
        t_cpy = common.median_time(lambda: flat_dst.copy_(flat_src), repeats=5)
        t_ray = ray_sync(model, tok)
        gbps, rgbps, cpy = nbytes / t_shm / 1e9, nbytes / t_ray / 1e9, nbytes / t_cpy / 1e9
        rows.append([name, f"{nbytes / 1e6:.1f} MB", f"{t_in * 1e3:.2f} ms (0 B copied)", f"{t_shm * 1e3:.1f} ms",
                     f"{gbps:.2f}", f"{t_ray * 1e3:.1f} ms", f"{rgbps:.2f}", f"{cpy:.2f}",
                     f"{gbps / cpy:.0%} / {rgbps / cpy:.0%}"])
        out[name] = {"bytes": nbytes, "in_process_s": t_in, "shm_s": t_shm, "ray_s": t_ray, "memcpy_s": t_cpy}
    ray.shutdown()
    print("Weight sync, median of 5, 1 thread")
    print(common.table(rows))
    common.save("weight_sync", out)


if __name__ == "__main__":
    sys.exit(main())
