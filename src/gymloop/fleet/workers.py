"""The fleet's fine-tuning job workers: each a Ray actor running what `gymloop worker` runs (the
store's queued jobs, one at a time). Ray restarts a worker that dies; the job it was running has
no heartbeat any more and is resumed from its newest checkpoint by the next worker to claim it."""
from __future__ import annotations

import os


class JobWorker:
    def __init__(self, serve_config: str) -> None:
        import torch

        from ..serve import ServeConfig, build

        cfg = ServeConfig.model_validate_json(serve_config)
        torch.set_num_threads(cfg.threads)
        self.app, _, _ = build(cfg.model_copy(update={"fine_tuning": True, "job_worker": True}))

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        """Stop taking jobs (a running one stays `running`; the next worker resumes it)."""
        from ..serve import shutdown

        shutdown(self.app)


def start(cfg, n: int) -> list[str]:
    """Start `n` detached job-worker actors named `<fleet>-job-worker-<i>`; their names."""
    import ray

    names = [f"{cfg.name}-job-worker-{i}" for i in range(n)]
    actor = ray.remote(JobWorker)
    for name in names:
        actor.options(name=name, namespace="gymloop", lifetime="detached", max_restarts=-1,
                      num_cpus=cfg.worker_cpus).remote(cfg.serve.model_dump_json())
    return names


def stop(names: list[str]) -> None:
    """Stop the named workers (politely, then for good)."""
    import ray

    for name in names:
        try:
            handle = ray.get_actor(name, namespace="gymloop")
        except ValueError:
            continue        # not running
        try:
            ray.get(handle.stop.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - killed below anyway
            pass
        ray.kill(handle, no_restart=True)
