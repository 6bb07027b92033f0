"""The fine-tuning worker: runs the store's queued jobs one at a time, beside the server (a
thread of `gymloop serve`) or alone. Everything a job needs to resume is in the store and its
directory: a `kill -9` at any moment and a restart continue a running job from its newest
checkpoint (or from the start), and its cost reaches the ledger once, with its success.
"""
from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
import socket
import threading
import time
import traceback
from pathlib import Path

from ..accounting.ledger import Profile
from ..accounting.rows import job_row
from ..store import Store
from .formats import parse
from .job import Hyper, JobRun, Progress
from .methods import METHODS

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0          # a running job whose worker was silent 6x this long is taken over
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def _worker_gone(worker: str | None, heartbeat: float | None, now: float) -> bool:
    """Whether a running job's worker is gone: a process of this host that no longer exists
    (known at once), or any worker silent for 6 heartbeats."""
    host, _, pid = (worker or "").rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return heartbeat is None or now - heartbeat > 6 * HEARTBEAT_S


def model_id(job: dict) -> str:
    """ft:<base>:<tenant>:<suffix>:<job> (OpenAI's shape; the tenant stands for the organisation)."""
    model = job["model"]     # a base name, or an ft: id / checkpoint of one (continued training)
    base = model.split(":")[1] if model.startswith("ft:") else Path(model).name
    return f"ft:{base}:{job['tenant']}:{job['suffix'] or ''}:{job['id'].removeprefix('ftjob-')[:8]}"


class JobWorker:
    """`resolve(tenant, model) -> model directory` turns a job's `model` (a base name, an ft: id
    or a checkpoint id) into weights to start from; `chat(model, messages, sampling_params) ->
    text` answers reinforcement jobs' score_model graders."""

    def __init__(self, store: Store, jobs_dir: str | Path, resolve, profile: Profile, profile_name: str,
                 poll_s: float = 0.5, checkpoint_every: int = 0, chat=None) -> None:
        self.store, self.jobs_dir, self.resolve, self.chat = store, Path(jobs_dir), resolve, chat
        self.profile, self.profile_name = profile, profile_name
        self.poll_s, self.checkpoint_every = poll_s, checkpoint_every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: str | None = None

    def start(self) -> "JobWorker":
        self._thread = threading.Thread(target=self._loop, name="finetune-worker", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            job = self._claim()
            if job is None:
                self._stop.wait(self.poll_s)
                continue
            self.current = job["id"]
            try:
                self.run(job)
            except Exception as exc:  # noqa: BLE001 - a failed job is recorded, the worker goes on
                log.error("fine-tuning job %s failed: %s", job["id"], traceback.format_exc())
                self.store.jobs.update(job["id"], status="failed", finished_at=time.time(),
                                      error={"code": "training_error", "message": f"{type(exc).__name__}: {exc}",
                                             "param": None},
                                      when_status=("running",),
                                      event=("error", f"Fine-tuning job failed: {exc}", "message", {}))
            finally:
                self.current = None

    def _claim(self) -> dict | None:
        """A queued job, or a running one whose worker is gone (kill -9): taken over and resumed."""
        return self.store.jobs.claim(WORKER_ID, _worker_gone)

    def run(self, job: dict) -> None:
        jid, tenant = job["id"], job["tenant"]
        method = job["method"]["type"]
        root = self.jobs_dir / jid
        root.mkdir(parents=True, exist_ok=True)
        state = job["progress"] or {}
        resume = Path(state["checkpoint"]) if state.get("checkpoint") else None
        if resume is not None:
            self.store.jobs.add_event(jid, "info", f"Resumed from the checkpoint at step {state['step']}")
        rows = parse(self.store.files.content(tenant, job["training_file"]) or b"", method).rows
        valid = None
        if job["validation_file"]:
            valid = parse(self.store.files.content(tenant, job["validation_file"]) or b"", method).rows
        ft_id = model_id(job)
        beat = [time.time()]

        def on_metrics(m: dict) -> None:
            msg = f"Step {m['step']}/{m['total_steps']}: training loss={m['train_loss']:.4f}"
            if "mean_reward" in m:
                msg += f", mean reward={m['mean_reward']:.3f}"
            self.store.jobs.add_event(jid, "info", msg, "metrics", m)
            if time.time() - beat[0] > HEARTBEAT_S:
                beat[0] = time.time()
                self.store.jobs.update(jid, heartbeat=beat[0])

        def on_checkpoint(step: int, metrics: dict, write) -> None:
            path = root / f"ckpt-step-{step}"
            write(path)
            self.store.jobs.add_checkpoint(jid, step=step, path=str(path), model_id=f"{ft_id}:ckpt-step-{step}",
                                      metrics=metrics, state={"checkpoint": str(path), "step": step})

        def should_stop() -> str | None:
            if self._stop.is_set():
                return "shutdown"
            status = self.store.jobs.get(None, jid)["status"]
            if status == "queued":
                # paused and resumed between two looks: carry on, and say it is running again
                self.store.jobs.update(jid, status="running", heartbeat=time.time(), when_status=("queued",))
                return None
            return status if status in ("cancelled", "paused") else None

        run = JobRun(start_model=Path(self.resolve(tenant, job["model"])), resume=resume, rows=rows, valid_rows=valid,
                     hp=Hyper(**job["hyperparameters"]["resolved"]), seed=job["seed"], root=root,
                     grader=job["method"].get("grader"),
                     chat=None if self.chat is None else functools.partial(self.chat, tenant))
        out = METHODS.impl(method)(run, Progress(on_metrics, on_checkpoint, should_stop, self.checkpoint_every))
        if out.get("message"):
            self.store.jobs.add_event(jid, "info", out["message"], "message", out.get("data"))
        if out["status"] == "paused":
            self.store.jobs.add_event(jid, "info", f"Paused at step {out['step']}; the checkpoint is saved")
        if out["status"] != "succeeded":
            return               # cancelled / paused (checkpointed) / shutdown: the store says what next
        final = out["final"]
        meta = final / "gymloop.json"
        meta.write_text(json.dumps({**(json.loads(meta.read_text()) if meta.exists() else {}),
                                    "fine_tuning_job": jid, "base_model": job["model"]}, indent=2))
        results = self._results_file(jid, tenant)
        active = out["active_parameters"]
        seconds = out["seconds"]
        self.store.jobs.update(
            jid, status="succeeded", finished_at=time.time(), fine_tuned_model=ft_id, final_path=str(final),
            trained_tokens=out["trained_tokens"], result_files=[results], when_status=("running",),
            event=("info", "The job has successfully completed", "message", {}),
            # the whole job's cost, written with its success: counted once, however many restarts
            ledger_row=job_row(jid, seconds, out["trained_tokens"], active, self.profile))

    def _results_file(self, jid: str, tenant: str) -> str:
        """step, train_loss, ... of every step as a CSV file (purpose fine-tune-results)."""
        events, _ = self.store.jobs.events(jid, limit=1_000_000)
        steps = sorted((e["data"] for e in events if e["type"] == "metrics"), key=lambda d: d["step"])
        cols = ["step"] + sorted({k for d in steps for k in d} - {"step"})
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        w.writerows(steps)
        f = self.store.files.add(tenant=tenant, filename=f"{jid}-results.csv", purpose="fine-tune-results",
                                content=buf.getvalue().encode(), status="processed", status_details=None, kind=None)
        return f["id"]
