"""Traces (every served answer), the feedback on them, and production's tasks: what the loop
learns from. Traces are group-committed: concurrent requests share one transaction and fsync."""
from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future

from .db import Database, env_key, record
from .errors import NotFound, StoreError
from .records import Feedback, FeedbackTask, GradedTrace, Trace

_INSERT = "INSERT INTO traces VALUES (?,?,?,?,?,?,?,?,?,?)"


class Traces:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue: "queue.Queue[tuple[tuple, Future]]" = queue.Queue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()

    @staticmethod
    def _row(tid: str | None, model: str, model_version: int, request: dict, response: dict, prompt_tokens: int,
             completion_tokens: int, latency_s: float, key_id: str | None) -> tuple:
        return (tid or f"trace-{uuid.uuid4().hex}", time.time(), model, model_version, json.dumps(request),
                json.dumps(response), prompt_tokens, completion_tokens, latency_s, key_id)

    def add(self, *, model: str, model_version: int, request: dict, response: dict, prompt_tokens: int,
            completion_tokens: int, latency_s: float, key_id: str | None = None, trace_id: str | None = None) -> str:
        row = self._row(trace_id, model, model_version, request, response, prompt_tokens, completion_tokens,
                        latency_s, key_id)
        with self.db.tx() as c:
            c.execute(_INSERT, row)
        return row[0]

    def add_committed(self, *, model: str, model_version: int, request: dict, response: dict,
                      prompt_tokens: int, completion_tokens: int, latency_s: float,
                      key_id: str | None = None, trace_id: str | None = None) -> Future:
        """Queue a trace for a group commit; the future resolves (to its id) once it is on disk.

        Concurrent requests share one transaction and one fsync instead of paying one each,
        and each still waits for its own trace to be committed before answering.
        """
        row = self._row(trace_id, model, model_version, request, response, prompt_tokens, completion_tokens,
                        latency_s, key_id)
        fut: Future = Future()
        with self._writer_lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write, name="trace-writer", daemon=True)
                self._writer.start()
        self._queue.put((row, fut))
        return fut

    def _write(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < 512:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                with self.db.tx() as c:
                    c.executemany(_INSERT, [r for r, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - every waiting request learns it failed
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            for row, fut in batch:
                fut.set_result(row[0])

    def get(self, trace_id: str) -> Trace | None:
        return record(self.db.read().execute("SELECT * FROM traces WHERE id = ?", (trace_id,)).fetchone(),
                      ("request", "response"))

    # --- feedback ------------------------------------------------------------------------------
    def existing(self, trace_ids: list[str]) -> set[str]:
        """Which of `trace_ids` the store holds (a fleet's audit: no answered request may lack one)."""
        found: set[str] = set()
        for i in range(0, len(trace_ids), 500):
            chunk = trace_ids[i:i + 500]
            q = f"SELECT id FROM traces WHERE id IN ({', '.join('?' * len(chunk))})"
            found.update(r[0] for r in self.db.read().execute(q, chunk).fetchall())
        return found

    def add_feedback(self, trace_id: str, *, reward: float | None = None, label: str | None = None,
                     env: str | None = None, env_version: int | None = None, task_id: str | None = None) -> int:
        if reward is None and label is None:
            raise StoreError("feedback needs a reward or a label")
        if reward is not None and not 0.0 <= reward <= 1.0:
            raise StoreError(f"reward must be in [0, 1], got {reward}")
        with self.db.tx() as c:
            if c.execute("SELECT 1 FROM traces WHERE id = ?", (trace_id,)).fetchone() is None:
                raise NotFound(f"unknown trace id {trace_id!r}")
            return int(c.execute("INSERT INTO feedback (trace_id, created, reward, label, env, env_version, task_id) "
                                 "VALUES (?,?,?,?,?,?,?) RETURNING id",
                                 (trace_id, time.time(), reward, label, env, env_version, task_id)).fetchone()[0])

    def feedback_for(self, trace_id: str) -> list[Feedback]:
        rows = self.db.read().execute("SELECT * FROM feedback WHERE trace_id = ? ORDER BY id", (trace_id,)).fetchall()
        return [dict(r) for r in rows]

    def failure_rates(self, window: int = 50) -> dict[str, tuple[float, float | None, int, int]]:
        """Per environment: (failure rate of the last `window` rewarded feedback rows, of the
        `window` before them (None if none), rows in the last window, rows in the one before).
        Versions of one environment share a history (a tool API update is the same service
        changing), and the result is keyed by the newest version seen, e.g. `tools@v2` when its
        failures follow `tools@v1` successes."""
        rows = self.db.read().execute(
            "SELECT env, env_version, reward FROM feedback WHERE reward IS NOT NULL AND env IS NOT NULL "
            "ORDER BY id DESC").fetchall()
        by_family: dict[str, tuple[str, list[float]]] = {}
        for r in rows:
            key = env_key(r["env"], r["env_version"])
            newest, fails = by_family.setdefault(key.split("@")[0], (key, []))
            fails.append(float(r["reward"] < 1))
        out = {}
        for newest, fails in by_family.values():
            recent, prior = fails[:window], fails[window:2 * window]
            out[newest] = (sum(recent) / len(recent), sum(prior) / len(prior) if prior else None,
                           len(recent), len(prior))
        return out

    def production_failures(self, limit: int = 1000) -> list[FeedbackTask]:
        """Distinct tasks that production feedback marked as failed (reward < 1), newest first."""
        return self._feedback_tasks("reward < 1", limit)

    def production_successes(self, limit: int = 1000) -> list[FeedbackTask]:
        """Distinct tasks production got right (reward 1): replayed so old skills are kept."""
        return self._feedback_tasks("reward >= 1", limit)

    def _feedback_tasks(self, condition: str, limit: int) -> list[FeedbackTask]:
        rows = self.db.read().execute(
            "SELECT env, env_version, task_id, MAX(created) AS last FROM feedback "
            f"WHERE task_id IS NOT NULL AND env IS NOT NULL AND {condition} "
            "GROUP BY env, env_version, task_id ORDER BY last DESC LIMIT ?", (limit,)).fetchall()
        return [dict(r) for r in rows]

    def graded(self) -> list[GradedTrace]:
        """Every trace with feedback that has a reward: the model version that answered, its request
        and response, and its latest verdict (reward, env, env_version, task_id), oldest first."""
        rows = self.db.read().execute(
            "SELECT t.id, t.model_version, t.request, t.response, f.reward, f.env, f.env_version, f.task_id FROM traces t "
            "JOIN feedback f ON f.trace_id = t.id WHERE f.reward IS NOT NULL AND f.id = "
            "(SELECT MAX(id) FROM feedback WHERE trace_id = t.id AND reward IS NOT NULL) ORDER BY t.created").fetchall()
        return [record(r, ("request", "response")) for r in rows]

    def production_success(self, since: float, until: float) -> dict[str, tuple[int, int]]:
        """Per environment (name@version): (rewarded feedback rows with reward 1, all rewarded rows)
        created in [since, until)."""
        rows = self.db.read().execute(
            "SELECT env, env_version, SUM(CASE WHEN reward >= 1 THEN 1 ELSE 0 END) AS ok, COUNT(*) AS n FROM feedback "
            "WHERE reward IS NOT NULL AND env IS NOT NULL AND created >= ? AND created < ? "
            "GROUP BY env, env_version", (since, until)).fetchall()
        return {env_key(r["env"], r["env_version"]): (int(r["ok"]), int(r["n"])) for r in rows}

    # --- production's tasks ----------------------------------------------------------------------
    def add_task(self, task) -> None:
        with self.db.tx() as c:
            c.execute("INSERT INTO tasks VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                      (task.id, task.env, task.split, task.source, json.dumps(list(task.prompt)),
                       json.dumps(task.answer), json.dumps(task.info, default=str), time.time()))

    def tasks(self, source: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM tasks", ()
        if source is not None:
            q, args = q + " WHERE source = ?", (source,)
        return [record(r, ("prompt", "answer", "info")) for r in self.db.read().execute(q + " ORDER BY created", args)]
