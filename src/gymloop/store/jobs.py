"""Fine-tuning jobs, their events and checkpoints. Every job names its tenant; `tenant` None
(the worker, the store's owner) finds any tenant's."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable

from ..accounting.rows import LedgerRow
from . import ledger
from .db import Conn, Database, page, record
from .records import Checkpoint, Job, JobEvent

JSON_COLS = ("metadata", "method", "hyperparameters", "error", "result_files", "progress")


def _insert_event(c: Conn, job_id: str, level: str, message: str, type: str, data: dict) -> None:
    c.execute("INSERT INTO ft_events (id, job_id, created, level, message, type, data) VALUES (?,?,?,?,?,?,?)",
              (f"ftevent-{uuid.uuid4().hex[:24]}", job_id, time.time(), level, message, type, json.dumps(data)))


class Jobs:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, *, tenant: str, model: str, training_file: str, validation_file: str | None,
            suffix: str | None, seed: int, metadata: dict, method: dict, hyperparameters: dict) -> Job:
        jid = f"ftjob-{uuid.uuid4().hex[:24]}"
        with self.db.tx() as c:
            c.execute("INSERT INTO ft_jobs (id, tenant, created, status, model, training_file, validation_file, "
                      "suffix, seed, metadata, method, hyperparameters) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                      (jid, tenant, time.time(), "queued", model, training_file, validation_file, suffix, seed,
                       json.dumps(metadata), json.dumps(method), json.dumps(hyperparameters)))
            _insert_event(c, jid, "info", "Created fine-tuning job", "message", {})
        return self.get(tenant, jid)

    def get(self, tenant: str | None, job_id: str) -> Job | None:
        q, args = "SELECT * FROM ft_jobs WHERE id = ?", [job_id]
        if tenant is not None:
            q, args = q + " AND tenant = ?", args + [tenant]
        return record(self.db.read().execute(q, args).fetchone(), JSON_COLS)

    def list(self, tenant: str, *, after: str | None = None, limit: int = 20,
             metadata: dict[str, str] | None = None) -> tuple[list[Job], bool]:
        rows, more = page(self.db, "ft_jobs", "*", tenant, after, None if metadata else limit, None)
        rows = [record(r, JSON_COLS) for r in rows]
        if metadata:
            rows = [r for r in rows if all(r["metadata"].get(k) == v for k, v in metadata.items())]
            rows, more = rows[:limit], len(rows) > limit
        return rows, more

    def update(self, job_id: str, *, event: tuple[str, str, str, dict] | None = None,
               when_status: tuple[str, ...] | None = None, ledger_row: LedgerRow | None = None,
               **fields: Any) -> bool:
        """Set fields of a job (and add an event: level, message, type, data, and a ledger row) in
        one transaction; with `when_status`, only if the job's status is one of those. Returns
        whether it changed (a ledger row is written only then: a job's cost is counted once)."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        vals = [json.dumps(v) if k in JSON_COLS else v for k, v in fields.items()]
        q = f"UPDATE ft_jobs SET {sets} WHERE id = ?"
        args = vals + [job_id]
        if when_status:
            q += f" AND status IN ({','.join('?' * len(when_status))})"
            args += list(when_status)
        with self.db.tx() as c:
            changed = c.execute(q, args).rowcount == 1
            if changed and event is not None:
                _insert_event(c, job_id, *event)
            if changed and ledger_row is not None:
                ledger.insert(c, ledger_row)
        return changed

    def claim(self, worker: str, gone: Callable[[str | None, float | None, float], bool]) -> Job | None:
        """Take the job `worker` should run, in one transaction: a running job whose worker is
        `gone(worker, heartbeat, now)` (resumed), else the oldest queued one; None when there is
        none. A job another worker is claiming at that moment is passed over (PostgreSQL: its row
        is locked, `FOR UPDATE SKIP LOCKED`; SQLite runs one claim at a time), so no two workers
        ever take one job."""
        now = time.time()
        with self.db.tx(serial=False) as c:
            ids = c.execute("SELECT id FROM ft_jobs WHERE status IN ('running', 'queued') "
                            "ORDER BY CASE WHEN status = 'running' THEN 0 ELSE 1 END, seq").fetchall()
            for jid in [r["id"] for r in ids]:
                row = c.execute("SELECT status, worker, heartbeat FROM ft_jobs WHERE id = ? AND status IN "
                                "('running', 'queued')" + self.db.LOCK_ROW, (jid,)).fetchone()
                if row is None or (row["status"] == "running" and not gone(row["worker"], row["heartbeat"], now)):
                    continue
                fields = {"heartbeat": now, "worker": worker}
                if row["status"] == "queued":
                    fields |= {"status": "running", "started": now}
                    _insert_event(c, jid, "info", "Fine-tuning job started", "message", {})
                c.execute(f"UPDATE ft_jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                          [*fields.values(), jid])
                break
            else:
                return None
        return self.get(None, jid)

    # --- the models jobs made ------------------------------------------------------------------------
    def fine_tuned_model(self, tenant: str, model_id: str) -> str | None:
        """The weights directory of a tenant's fine-tuned model or checkpoint id, or None."""
        row = self.db.read().execute("SELECT final_path FROM ft_jobs WHERE fine_tuned_model = ? AND tenant = ? "
                                     "AND status = 'succeeded'", (model_id, tenant)).fetchone()
        if row is not None:
            return row["final_path"]
        row = self.db.read().execute("SELECT c.path FROM ft_checkpoints c JOIN ft_jobs j ON j.id = c.job_id "
                                     "WHERE c.model_id = ? AND j.tenant = ?", (model_id, tenant)).fetchone()
        return None if row is None else row["path"]

    def fine_tuned_path(self, model_id: str) -> str | None:
        """The weights directory of any tenant's fine-tuned model or checkpoint id (the store's
        owner: `gymloop models add`), or None."""
        row = self.db.read().execute("SELECT tenant FROM ft_jobs WHERE fine_tuned_model = ? UNION "
                                     "SELECT j.tenant FROM ft_checkpoints c JOIN ft_jobs j ON j.id = c.job_id "
                                     "WHERE c.model_id = ?", (model_id, model_id)).fetchone()
        return None if row is None else self.fine_tuned_model(row["tenant"], model_id)

    def fine_tuned_models(self, tenant: str) -> list[dict]:
        """A tenant's succeeded jobs' models: [{id, created, job}]."""
        rows = self.db.read().execute("SELECT fine_tuned_model, finished_at, id FROM ft_jobs WHERE tenant = ? AND "
                                      "status = 'succeeded' ORDER BY seq", (tenant,)).fetchall()
        return [{"id": r["fine_tuned_model"], "created": r["finished_at"], "job": r["id"]} for r in rows]

    # --- events and checkpoints ---------------------------------------------------------------------
    def add_event(self, job_id: str, level: str, message: str, type: str = "message", data: dict | None = None) -> None:
        with self.db.tx() as c:
            _insert_event(c, job_id, level, message, type, data or {})

    def events(self, job_id: str, *, after: str | None = None, limit: int = 20) -> tuple[list[JobEvent], bool]:
        """Newest first; `after`: an event id, the page continues below it."""
        return self._by_job("ft_events", job_id, after, limit, ("data",))

    def add_checkpoint(self, job_id: str, *, step: int, path: str, model_id: str, metrics: dict,
                       state: dict) -> None:
        """A checkpoint and the job's resumable state (`progress`) in one transaction: a job that
        restarts resumes from the newest checkpoint the store knows, never from a half-written one."""
        with self.db.tx() as c:
            # a step saved twice (paused right after a checkpoint) keeps its first record
            c.execute("INSERT INTO ft_checkpoints (id, job_id, created, step, path, model_id, metrics) "
                      "VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING", (f"ftckpt-{uuid.uuid4().hex[:24]}", job_id, time.time(), step, path,
                                                  model_id, json.dumps(metrics)))
            c.execute("UPDATE ft_jobs SET progress = ? WHERE id = ?", (json.dumps(state), job_id))

    def checkpoints(self, job_id: str, *, after: str | None = None, limit: int = 20) -> tuple[list[Checkpoint], bool]:
        return self._by_job("ft_checkpoints", job_id, after, limit, ("metrics",))

    def get_checkpoint(self, job_id: str, checkpoint_id: str) -> Checkpoint | None:
        return record(self.db.read().execute("SELECT * FROM ft_checkpoints WHERE id = ? AND job_id = ?",
                                             (checkpoint_id, job_id)).fetchone(), ("metrics",))

    def _by_job(self, table: str, job_id: str, after: str | None, limit: int, json_cols: tuple[str, ...]):
        q, args = f"SELECT * FROM {table} WHERE job_id = ?", [job_id]
        if after:
            q, args = q + f" AND seq < (SELECT seq FROM {table} WHERE id = ?)", args + [after]
        rows = self.db.read().execute(q + " ORDER BY seq DESC LIMIT ?", args + [limit + 1]).fetchall()
        return [record(r, json_cols) for r in rows[:limit]], len(rows) > limit
