"""Weight sync: publishing a new version from the trainer to a generation engine.

    python -m bench.training.weight_sync

For the nano model and a 135M-parameter Llama (SmolLM2-135M's shape, random weights):
- in-process: trainer and engine share tensors; publishing is a version bump (0 bytes copied);
- shared memory: `SharedWeights.write` (trainer -> the shared buffer not in use, one copy) and
  `read_into` (the collector's engine re-points its parameters at it, no copy), the path of
  the asynchronous collector process;
- Ray: the driver packs the weights into buckets and puts each in the object store
  (`put_weights`, as `RaySource.publish`), and a rollout-worker actor loads them, end to end,
  on a private local Ray instance; and the same from a trainer actor (`cluster.trainers`):
  rank 0 puts its own weights, the driver passes the references to the worker;
- memcpy: one plain copy of the same bytes, measured in the same run (the ceiling).
Goal (issue #7): cross-process sync >= 50% of memcpy bandwidth.
"""
from __future__ import annotations

BENCH = {"results": "training/weight_sync", "minutes": 3,
         "measures": ("publishing a weight version: in-process, shared memory (the async collector process), Ray object"
                      " store (bucketed), against a same-run memcpy; nano and a 135M Llama")}   # found by bench/run_all.py

import multiprocessing as mp
import sys

from bench import common
import torch

from gymloop.models.checkpoint import load_model
from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine
from gymloop.sync.shared import SharedWeights


def ray_sync(model: torch.nn.Module, tok) -> tuple[float, float]:
    """Median seconds of one version reaching a rollout-worker actor: from the driver
    (put_weights + the worker's load), and from a trainer actor (rank 0 puts its own
    weights; the driver passes only the references on)."""
    import ray

    from gymloop.sync.buckets import pack
    from gymloop.cluster.ray_backend import RolloutWorker, put_weights
    from gymloop.cluster.ray_trainer import TrainerRank

    worker = ray.remote(num_cpus=1)(RolloutWorker).remote(model.config, tok, None)
    buckets, layout = pack(model.state_dict(), 64 << 20)
    trainer = ray.remote(num_cpus=1)(TrainerRank).remote(model.config, {"lr": 1e-4}, 1, layout, *buckets)
    ray.get(trainer.setup.remote(None, 0, 1, 60.0, False))

    def from_driver():
        version, layout, refs = put_weights(model.state_dict(), 3, 64 << 20)
        ray.get(worker.load.remote(version, layout, *refs))

    def from_trainer_actor():
        version, layout, refs = ray.get(trainer.publish.remote(4, 64 << 20))
        ray.get(worker.load.remote(version, layout, *refs))

    from_driver()           # actor start-up is not weight sync
    from_trainer_actor()
    times = common.median_time(from_driver, repeats=5), common.median_time(from_trainer_actor, repeats=5)
    ray.kill(worker)
    ray.kill(trainer)
    return times


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
    rows = [["model", "bytes", "in-process", "shared memory (write+read)", "GB/s", "Ray driver->worker", "GB/s",
             "Ray trainer actor->worker", "GB/s", "memcpy GB/s", "shm / Ray / Ray actor of memcpy"]]
    out = {}
    for name, model in (("nano", nano), ("135M llama", smollm_shaped())):
        # tied tensors (embedding = lm_head) are one tensor: counted, and moved, once
        unique = {t.data_ptr(): t for t in model.state_dict().values()}
        nbytes = sum(t.numel() * t.element_size() for t in unique.values())
        engine = NativeEngine(model, 0)
        t_in = common.median_time(lambda: engine.load_weights(model.state_dict(), version=1), repeats=5)
        shared = SharedWeights(model, mp.get_context("fork"))
        other = NativeEngine(__import__("copy").deepcopy(model), 0)

        def shm():
            shared.write(model, 2)
            shared.read_into(other)

        t_shm = common.median_time(shm, repeats=5)
        flat_src = torch.empty(nbytes // 4)
        flat_dst = torch.empty_like(flat_src)
        t_cpy = common.median_time(lambda: flat_dst.copy_(flat_src), repeats=5)
        t_ray, t_actor = ray_sync(model, tok)
        gbps, rgbps, agbps, cpy = (nbytes / t / 1e9 for t in (t_shm, t_ray, t_actor, t_cpy))
        rows.append([name, f"{nbytes / 1e6:.1f} MB", f"{t_in * 1e3:.2f} ms (0 B copied)", f"{t_shm * 1e3:.1f} ms",
                     f"{gbps:.2f}", f"{t_ray * 1e3:.1f} ms", f"{rgbps:.2f}", f"{t_actor * 1e3:.1f} ms", f"{agbps:.2f}",
                     f"{cpy:.2f}", f"{gbps / cpy:.0%} / {rgbps / cpy:.0%} / {agbps / cpy:.0%}"])
        out[name] = {"bytes": nbytes, "in_process_s": t_in, "shm_s": t_shm, "ray_s": t_ray,
                     "ray_trainer_actor_s": t_actor, "memcpy_s": t_cpy}
    ray.shutdown()
    print("Weight sync, median of 5, 1 thread")
    print(common.table(rows))
    common.save("training/weight_sync", out)


if __name__ == "__main__":
    sys.exit(main())
