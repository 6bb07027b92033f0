"""The store: everything that must survive a crash, in SQLite (WAL) by default.

One module owns the schema and its migrations. Every write is a transaction that is
committed before the call returns, so a response sent after a write is never ahead of the
disk. Rollout token arrays may live in files next to the database; the tables hold metadata.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import sqlite3
import threading
import time
import uuid
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from .accounting.rows import LedgerRow

# Each migration moves the schema one version up; never edit one that has shipped.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY, env TEXT NOT NULL, split TEXT NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('synthetic', 'dataset', 'production')),
        prompt TEXT NOT NULL, answer TEXT, info TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL);
    CREATE TABLE traces (
        id TEXT PRIMARY KEY, created REAL NOT NULL, model TEXT NOT NULL, model_version INTEGER NOT NULL,
        request TEXT NOT NULL, response TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL, latency_s REAL NOT NULL, key_id TEXT);
    CREATE TABLE feedback (
        id INTEGER PRIMARY KEY AUTOINCREMENT, trace_id TEXT NOT NULL REFERENCES traces(id),
        created REAL NOT NULL, reward REAL CHECK (reward IS NULL OR (reward >= 0 AND reward <= 1)),
        label TEXT, env TEXT, env_version INTEGER, task_id TEXT);
    CREATE TABLE runs (id TEXT PRIMARY KEY, created REAL NOT NULL, config TEXT NOT NULL,
        status TEXT NOT NULL);
    CREATE TABLE rounds (
        run_id TEXT NOT NULL REFERENCES runs(id), round INTEGER NOT NULL, status TEXT NOT NULL,
        started REAL NOT NULL, finished REAL, metrics TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, round));
    CREATE TABLE model_versions (
        version INTEGER PRIMARY KEY, parent INTEGER, path TEXT NOT NULL, created REAL NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('candidate', 'promoted', 'rejected', 'rolled_back')),
        scores TEXT NOT NULL DEFAULT '{}');
    CREATE TABLE rollouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, round INTEGER, task_id TEXT NOT NULL,
        env TEXT NOT NULL, model_version INTEGER NOT NULL, reward REAL, error TEXT,
        generated_tokens INTEGER NOT NULL, tokens_file TEXT);
    CREATE TABLE ledger (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, round INTEGER, phase TEXT NOT NULL,
        seconds REAL NOT NULL, device_seconds REAL NOT NULL, prompt_tokens INTEGER NOT NULL DEFAULT 0,
        generated_tokens INTEGER NOT NULL DEFAULT 0, trained_tokens INTEGER NOT NULL DEFAULT 0,
        served_tokens INTEGER NOT NULL DEFAULT 0, flops REAL NOT NULL DEFAULT 0,
        dollars REAL NOT NULL DEFAULT 0, created REAL NOT NULL);
    CREATE INDEX traces_created ON traces(created);
    CREATE INDEX feedback_trace ON feedback(trace_id);
    """,
    """
    CREATE TABLE drift_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, run_id TEXT, round INTEGER,
        env TEXT NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('eval', 'production')),
        before REAL NOT NULL, after REAL NOT NULL, detail TEXT NOT NULL DEFAULT '');
    """,
    # the fine-tuning service: uploaded files (their bytes too: a job never loses its data), jobs,
    # their events and checkpoints; `seq` orders pages (`after=<id>`), newest first
    """
    CREATE TABLE files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL,
        created REAL NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('uploaded', 'processed', 'error')), status_details TEXT,
        kind TEXT, examples INTEGER, content BLOB NOT NULL);
    CREATE TABLE ft_jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL,
        created REAL NOT NULL, status TEXT NOT NULL CHECK (status IN ('validating_files', 'queued', 'running',
        'succeeded', 'failed', 'cancelled', 'paused')), model TEXT NOT NULL, training_file TEXT NOT NULL,
        validation_file TEXT, suffix TEXT, seed INTEGER NOT NULL, metadata TEXT NOT NULL DEFAULT '{}',
        method TEXT NOT NULL, hyperparameters TEXT NOT NULL DEFAULT '{}', fine_tuned_model TEXT UNIQUE,
        final_path TEXT, started REAL, worker TEXT, heartbeat REAL, finished_at REAL, trained_tokens INTEGER, error TEXT,
        result_files TEXT NOT NULL DEFAULT '[]', progress TEXT NOT NULL DEFAULT '{}');
    CREATE TABLE ft_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, job_id TEXT NOT NULL REFERENCES ft_jobs(id),
        created REAL NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL, type TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}');
    CREATE TABLE ft_checkpoints (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, job_id TEXT NOT NULL REFERENCES ft_jobs(id),
        created REAL NOT NULL, step INTEGER NOT NULL, path TEXT NOT NULL, model_id TEXT NOT NULL UNIQUE,
        metrics TEXT NOT NULL DEFAULT '{}');
    CREATE INDEX files_tenant ON files(tenant);
    CREATE INDEX ft_jobs_tenant ON ft_jobs(tenant);
    CREATE INDEX ft_events_job ON ft_events(job_id);
    CREATE INDEX ft_checkpoints_job ON ft_checkpoints(job_id);
    """,
]


class StoreError(ValueError):
    """A request the store refuses (unknown reference, value out of range); nothing changed."""


class Store:
    """Thread-safe access to one SQLite database in WAL mode."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._migrate()
        self._trace_queue: "queue.Queue[tuple[tuple, Future]]" = queue.Queue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed transaction survives power loss, not only a process crash.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed on success, rolled back on any error."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _migrate(self) -> None:
        with self.tx() as c:
            c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            have = int(row["value"]) if row else 0
            if have > len(MIGRATIONS):
                raise RuntimeError(f"{self.path} has schema version {have}; this gymloop knows {len(MIGRATIONS)}")
            for sql in MIGRATIONS[have:]:
                # statement by statement: executescript would commit the open transaction
                for statement in _split(sql):
                    c.execute(statement)
            c.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(len(MIGRATIONS)),))

    @property
    def schema_version(self) -> int:
        return int(self._conn().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    # --- traces and feedback -------------------------------------------------------------
    def add_trace(self, *, model: str, model_version: int, request: dict, response: dict,
                  prompt_tokens: int, completion_tokens: int, latency_s: float,
                  key_id: str | None = None, trace_id: str | None = None) -> str:
        tid = trace_id or f"trace-{uuid.uuid4().hex}"
        with self.tx() as c:
            c.execute("INSERT INTO traces VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (tid, time.time(), model, model_version, json.dumps(request), json.dumps(response),
                       prompt_tokens, completion_tokens, latency_s, key_id))
        return tid

    def add_trace_committed(self, *, model: str, model_version: int, request: dict, response: dict,
                            prompt_tokens: int, completion_tokens: int, latency_s: float,
                            key_id: str | None = None, trace_id: str | None = None) -> Future:
        """Queue a trace for a group commit; the future resolves (to its id) once it is on disk.

        Concurrent requests share one transaction and one fsync instead of paying one each,
        and each still waits for its own trace to be committed before answering.
        """
        tid = trace_id or f"trace-{uuid.uuid4().hex}"
        row = (tid, time.time(), model, model_version, json.dumps(request), json.dumps(response),
               prompt_tokens, completion_tokens, latency_s, key_id)
        fut: Future = Future()
        with self._writer_lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_traces, name="trace-writer", daemon=True)
                self._writer.start()
        self._trace_queue.put((row, fut))
        return fut

    def _write_traces(self) -> None:
        while True:
            batch = [self._trace_queue.get()]
            while len(batch) < 512:
                try:
                    batch.append(self._trace_queue.get_nowait())
                except queue.Empty:
                    break
            try:
                with self.tx() as c:
                    c.executemany("INSERT INTO traces VALUES (?,?,?,?,?,?,?,?,?,?)", [r for r, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - every waiting request learns it failed
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            for row, fut in batch:
                fut.set_result(row[0])

    def get_trace(self, trace_id: str) -> dict | None:
        row = self._conn().execute("SELECT * FROM traces WHERE id = ?", (trace_id,)).fetchone()
        return None if row is None else _row(row, ("request", "response"))

    def count(self, table: str) -> int:
        if table not in {"tasks", "traces", "feedback", "runs", "rounds", "model_versions", "rollouts", "ledger"}:
            raise ValueError(f"unknown table {table!r}")
        return self._conn().execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]

    def add_feedback(self, trace_id: str, *, reward: float | None = None, label: str | None = None,
                     env: str | None = None, env_version: int | None = None, task_id: str | None = None) -> int:
        if reward is None and label is None:
            raise StoreError("feedback needs a reward or a label")
        if reward is not None and not 0.0 <= reward <= 1.0:
            raise StoreError(f"reward must be in [0, 1], got {reward}")
        with self.tx() as c:
            if c.execute("SELECT 1 FROM traces WHERE id = ?", (trace_id,)).fetchone() is None:
                raise StoreError(f"unknown trace id {trace_id!r}")
            cur = c.execute("INSERT INTO feedback (trace_id, created, reward, label, env, env_version, task_id) "
                            "VALUES (?,?,?,?,?,?,?)", (trace_id, time.time(), reward, label, env, env_version, task_id))
            return int(cur.lastrowid)

    def feedback_for(self, trace_id: str) -> list[dict]:
        rows = self._conn().execute("SELECT * FROM feedback WHERE trace_id = ? ORDER BY id", (trace_id,)).fetchall()
        return [dict(r) for r in rows]

    def add_drift_event(self, *, env: str, kind: str, before: float, after: float, detail: str = "",
                        run_id: str | None = None, round: int | None = None) -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO drift_events (created, run_id, round, env, kind, before, after, detail) "
                            "VALUES (?,?,?,?,?,?,?,?)", (time.time(), run_id, round, env, kind, before, after, detail))
            return int(cur.lastrowid)

    def drift_events(self) -> list[dict]:
        return [dict(r) for r in self._conn().execute("SELECT * FROM drift_events ORDER BY id")]

    def failure_rates(self, window: int = 50) -> dict[str, tuple[float, float | None, int, int]]:
        """Per environment: (failure rate of the last `window` rewarded feedback rows, of the
        `window` before them (None if none), rows in the last window, rows in the one before).
        Versions of one environment share a
        history (a tool API update is the same service changing), and the result is keyed by
        the newest version seen, e.g. `tools@v2` when its failures follow `tools@v1` successes."""
        rows = self._conn().execute(
            "SELECT env, env_version, reward FROM feedback WHERE reward IS NOT NULL AND env IS NOT NULL "
            "ORDER BY id DESC").fetchall()
        by_family: dict[str, tuple[str, list[float]]] = {}
        for r in rows:
            key = _env_key(r["env"], r["env_version"])
            newest, fails = by_family.setdefault(key.split("@")[0], (key, []))
            fails.append(float(r["reward"] < 1))
        out = {}
        for newest, fails in by_family.values():
            recent, prior = fails[:window], fails[window:2 * window]
            out[newest] = (sum(recent) / len(recent), sum(prior) / len(prior) if prior else None,
                           len(recent), len(prior))
        return out

    def production_failures(self, limit: int = 1000) -> list[dict]:
        """Distinct tasks that production feedback marked as failed (reward < 1), newest first."""
        return self._feedback_tasks("reward < 1", limit)

    def production_successes(self, limit: int = 1000) -> list[dict]:
        """Distinct tasks production got right (reward 1): replayed so old skills are kept."""
        return self._feedback_tasks("reward >= 1", limit)

    def graded_traces(self) -> list[dict]:
        """Every trace with feedback that has a reward: its request and response, and its latest
        verdict (reward, env, env_version, task_id), oldest first."""
        rows = self._conn().execute(
            "SELECT t.id, t.request, t.response, f.reward, f.env, f.env_version, f.task_id FROM traces t "
            "JOIN feedback f ON f.trace_id = t.id WHERE f.reward IS NOT NULL AND f.id = "
            "(SELECT MAX(id) FROM feedback WHERE trace_id = t.id AND reward IS NOT NULL) ORDER BY t.created").fetchall()
        return [_row(r, ("request", "response")) for r in rows]

    def _feedback_tasks(self, condition: str, limit: int) -> list[dict]:
        rows = self._conn().execute(
            "SELECT env, env_version, task_id, MAX(created) AS last FROM feedback "
            f"WHERE task_id IS NOT NULL AND env IS NOT NULL AND {condition} "
            "GROUP BY env, env_version, task_id ORDER BY last DESC LIMIT ?", (limit,)).fetchall()
        return [dict(r) for r in rows]

    def tasks(self, source: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM tasks", ()
        if source is not None:
            q, args = q + " WHERE source = ?", (source,)
        return [_row(r, ("prompt", "answer", "info")) for r in self._conn().execute(q + " ORDER BY created", args)]

    # --- tasks -----------------------------------------------------------------------------
    def add_task(self, task) -> None:
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO tasks VALUES (?,?,?,?,?,?,?,?)",
                      (task.id, task.env, task.split, task.source, json.dumps(list(task.prompt)),
                       json.dumps(task.answer), json.dumps(task.info, default=str), time.time()))

    # --- model versions ----------------------------------------------------------------------
    def add_model_version(self, path: str, parent: int | None, status: str = "candidate",
                          scores: dict | None = None) -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO model_versions (parent, path, created, status, scores) VALUES (?,?,?,?,?)",
                            (parent, path, time.time(), status, json.dumps(scores or {})))
            return int(cur.lastrowid)

    def set_model_status(self, version: int, status: str, scores: dict | None = None) -> None:
        with self.tx() as c:
            if c.execute("SELECT 1 FROM model_versions WHERE version = ?", (version,)).fetchone() is None:
                raise StoreError(f"unknown model version {version}")
            c.execute("UPDATE model_versions SET status = ? WHERE version = ?", (status, version))
            if scores is not None:
                c.execute("UPDATE model_versions SET scores = ? WHERE version = ?", (json.dumps(scores), version))

    def model_version(self, version: int) -> dict | None:
        row = self._conn().execute("SELECT * FROM model_versions WHERE version = ?", (version,)).fetchone()
        return None if row is None else _row(row, ("scores",))

    def rollback_to(self, version: int) -> None:
        """Serve `version` again: every promoted version after it becomes rolled_back."""
        with self.tx() as c:
            row = c.execute("SELECT status FROM model_versions WHERE version = ?", (version,)).fetchone()
            if row is None:
                raise StoreError(f"unknown model version {version}")
            if row["status"] not in ("promoted", "rolled_back"):
                raise StoreError(f"version {version} was never promoted (status {row['status']}); "
                                 "only a version that passed the gate can be served again")
            c.execute("UPDATE model_versions SET status = 'rolled_back' WHERE version > ? AND status = 'promoted'",
                      (version,))
            c.execute("UPDATE model_versions SET status = 'promoted' WHERE version = ?", (version,))

    def ensure_run(self, run_id: str, config: dict) -> None:
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO runs VALUES (?,?,?,?)", (run_id, time.time(), json.dumps(config), "running"))

    def last_round(self, run_id: str) -> int:
        row = self._conn().execute("SELECT MAX(round) FROM rounds WHERE run_id = ?", (run_id,)).fetchone()
        return row[0] or 0

    def rounds(self, run_id: str) -> list[dict]:
        rows = self._conn().execute("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,)).fetchall()
        return [_row(r, ("metrics",)) for r in rows]

    def commit_round(self, run_id: str, round: int, *, path: str, parent: int | None, status: str,
                     scores: dict, metrics: dict, started: float, ledger: Sequence[LedgerRow] = (),
                     finished: float | None = None) -> int:
        """Register the round's candidate, the round and its ledger rows in one transaction.

        A crash before this call loses nothing committed (the round is redone, and its costs are
        counted once, with it); after it, the round exists exactly once (the primary key refuses a
        second commit). `ledger`: the round's rows (accounting/rows.py), filed under this round.
        """
        with self.tx() as c:
            cur = c.execute("INSERT INTO model_versions (parent, path, created, status, scores) VALUES (?,?,?,?,?)",
                            (parent, path, time.time(), status, json.dumps(scores)))
            version = int(cur.lastrowid)
            c.execute("INSERT INTO rounds VALUES (?,?,?,?,?,?)",
                      (run_id, round, status, started, time.time() if finished is None else finished,
                       json.dumps({**metrics, "version": version})))
            for row in ledger:
                self._insert_ledger(c, dataclasses.replace(row, run_id=run_id, round=round))
        return version

    def stats(self) -> dict:
        """Aggregates for the dashboard (no trace contents)."""
        c = self._conn()
        t = c.execute("SELECT COUNT(*), COALESCE(SUM(completion_tokens), 0), MAX(created) FROM traces").fetchone()
        f = c.execute("SELECT COUNT(*), COALESCE(SUM(reward < 1), 0) FROM feedback WHERE reward IS NOT NULL").fetchone()
        d = c.execute("SELECT COALESCE(SUM(dollars), 0), COALESCE(SUM(seconds), 0) FROM ledger").fetchone()
        sv = c.execute("SELECT COALESCE(SUM(dollars), 0), COALESCE(SUM(served_tokens), 0) FROM ledger "
                       "WHERE phase = 'serving'").fetchone()
        return {"traces": t[0], "served_tokens": t[1], "last_trace": t[2], "feedback": f[0], "failures": f[1],
                "ledger_dollars": d[0], "ledger_seconds": d[1], "serving_dollars": sv[0],
                "cost_per_1m_served_tokens": sv[0] / sv[1] * 1e6 if sv[1] else None}

    def ledger_rows(self, phase: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM ledger", ()
        if phase is not None:
            q, args = q + " WHERE phase = ?", (phase,)
        return [dict(r) for r in self._conn().execute(q + " ORDER BY id", args)]

    def recent_rounds(self, limit: int = 20) -> list[dict]:
        rows = self._conn().execute("SELECT * FROM rounds ORDER BY finished DESC LIMIT ?", (limit,)).fetchall()
        return [_row(r, ("metrics",)) for r in reversed(rows)]

    def model_versions(self) -> list[dict]:
        rows = self._conn().execute("SELECT * FROM model_versions ORDER BY version").fetchall()
        return [_row(r, ("scores",)) for r in rows]

    def promoted(self) -> dict | None:
        """The most recently promoted version still in service."""
        row = self._conn().execute("SELECT * FROM model_versions WHERE status = 'promoted' "
                                   "ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else _row(row, ("scores",))

    # --- ledger --------------------------------------------------------------------------------
    def add_ledger(self, row: LedgerRow) -> None:
        with self.tx() as c:
            self._insert_ledger(c, row)

    @staticmethod
    def _insert_ledger(c: sqlite3.Connection, row: LedgerRow) -> None:
        # accounting/rows.py prices every row; a dict here would be a second writer's
        if not isinstance(row, LedgerRow):
            raise TypeError(f"ledger rows are accounting.rows.LedgerRow, made by gymloop.accounting; got {type(row).__name__}")
        c.execute("INSERT INTO ledger (run_id, round, phase, seconds, device_seconds, prompt_tokens, "
                  "generated_tokens, trained_tokens, served_tokens, flops, dollars, created) "
                  "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                  (row.run_id, row.round, row.phase, row.seconds,
                   row.seconds if row.device_seconds is None else row.device_seconds, row.prompt_tokens,
                   row.generated_tokens, row.trained_tokens, row.served_tokens, row.flops, row.dollars, time.time()))

    def round_costs(self, run_id: str) -> dict[int, dict[str, dict]]:
        """{round: {phase: {seconds, dollars, flops, *_tokens}}} of a loop's committed rounds."""
        rows = self._conn().execute(
            "SELECT round, phase, SUM(seconds) AS seconds, SUM(dollars) AS dollars, SUM(flops) AS flops, "
            "SUM(prompt_tokens) AS prompt_tokens, SUM(generated_tokens) AS generated_tokens, "
            "SUM(trained_tokens) AS trained_tokens FROM ledger WHERE run_id = ? AND round IS NOT NULL "
            "GROUP BY round, phase ORDER BY round", (run_id,)).fetchall()
        out: dict[int, dict[str, dict]] = {}
        for r in rows:
            out.setdefault(r["round"], {})[r["phase"]] = {k: r[k] for k in r.keys() if k not in ("round", "phase")}
        return out

    def production_success(self, since: float, until: float) -> dict[str, tuple[int, int]]:
        """Per environment (name@version): (rewarded feedback rows with reward 1, all rewarded rows)
        created in [since, until)."""
        rows = self._conn().execute(
            "SELECT env, env_version, SUM(reward >= 1) AS ok, COUNT(*) AS n FROM feedback "
            "WHERE reward IS NOT NULL AND env IS NOT NULL AND created >= ? AND created < ? "
            "GROUP BY env, env_version", (since, until)).fetchall()
        return {_env_key(r["env"], r["env_version"]): (int(r["ok"]), int(r["n"])) for r in rows}

    # --- the fine-tuning service: files, jobs, their events and checkpoints -------------------
    # Every row names its tenant (the API key's id); a lookup with another tenant finds nothing.
    def add_file(self, *, tenant: str, filename: str, purpose: str, content: bytes, status: str,
                 status_details: str | None, kind: str | None, examples: int | None = None) -> dict:
        fid = f"file-{uuid.uuid4().hex[:24]}"
        with self.tx() as c:
            c.execute("INSERT INTO files (id, tenant, created, filename, purpose, bytes, status, status_details, "
                      "kind, examples, content) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                      (fid, tenant, time.time(), filename, purpose, len(content), status, status_details, kind,
                       examples, content))
        return self.get_file(tenant, fid)

    def get_file(self, tenant: str, file_id: str) -> dict | None:
        row = self._conn().execute("SELECT id, seq, tenant, created, filename, purpose, bytes, status, "
                                   "status_details, kind, examples FROM files WHERE id = ? AND tenant = ?",
                                   (file_id, tenant)).fetchone()
        return None if row is None else dict(row)

    def file_content(self, tenant: str, file_id: str) -> bytes | None:
        row = self._conn().execute("SELECT content FROM files WHERE id = ? AND tenant = ?",
                                   (file_id, tenant)).fetchone()
        return None if row is None else bytes(row["content"])

    def list_files(self, tenant: str, *, after: str | None = None, limit: int = 20,
                   purpose: str | None = None) -> tuple[list[dict], bool]:
        return self._page("files", "id, seq, tenant, created, filename, purpose, bytes, status, status_details, kind, examples",
                          tenant, after, limit, ("purpose", purpose))

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self.tx() as c:
            return c.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount == 1

    def add_job(self, *, tenant: str, model: str, training_file: str, validation_file: str | None,
                suffix: str | None, seed: int, metadata: dict, method: dict, hyperparameters: dict) -> dict:
        jid = f"ftjob-{uuid.uuid4().hex[:24]}"
        with self.tx() as c:
            c.execute("INSERT INTO ft_jobs (id, tenant, created, status, model, training_file, validation_file, "
                      "suffix, seed, metadata, method, hyperparameters) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                      (jid, tenant, time.time(), "queued", model, training_file, validation_file, suffix, seed,
                       json.dumps(metadata), json.dumps(method), json.dumps(hyperparameters)))
            self._insert_event(c, jid, "info", "Created fine-tuning job", "message", {})
        return self.get_job(tenant, jid)

    def get_job(self, tenant: str | None, job_id: str) -> dict | None:
        """The job (`tenant` None: whoever owns it, for the worker)."""
        q, args = "SELECT * FROM ft_jobs WHERE id = ?", [job_id]
        if tenant is not None:
            q, args = q + " AND tenant = ?", args + [tenant]
        row = self._conn().execute(q, args).fetchone()
        return None if row is None else _row(row, _JOB_JSON)

    def list_jobs(self, tenant: str, *, after: str | None = None, limit: int = 20,
                  metadata: dict[str, str] | None = None) -> tuple[list[dict], bool]:
        rows, more = self._page("ft_jobs", "*", tenant, after, None if metadata else limit, None)
        rows = [_row(r, _JOB_JSON) for r in rows]
        if metadata:
            rows = [r for r in rows if all(r["metadata"].get(k) == v for k, v in metadata.items())]
            rows, more = rows[:limit], len(rows) > limit
        return rows, more

    def update_job(self, job_id: str, *, event: tuple[str, str, str, dict] | None = None,
                   when_status: tuple[str, ...] | None = None, ledger: LedgerRow | None = None, **fields: Any) -> bool:
        """Set fields of a job (and add an event: level, message, type, data, and a ledger row) in
        one transaction; with `when_status`, only if the job's status is one of those. Returns
        whether it changed (a ledger row is written only then: a job's cost is counted once)."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        vals = [json.dumps(v) if k in _JOB_JSON else v for k, v in fields.items()]
        q = f"UPDATE ft_jobs SET {sets} WHERE id = ?"
        args = vals + [job_id]
        if when_status:
            q += f" AND status IN ({','.join('?' * len(when_status))})"
            args += list(when_status)
        with self.tx() as c:
            changed = c.execute(q, args).rowcount == 1
            if changed and event is not None:
                self._insert_event(c, job_id, *event)
            if changed and ledger is not None:
                self._insert_ledger(c, ledger)
        return changed

    def fine_tuned_model(self, tenant: str, model_id: str) -> str | None:
        """The weights directory of a tenant's fine-tuned model or checkpoint id, or None."""
        row = self._conn().execute("SELECT final_path FROM ft_jobs WHERE fine_tuned_model = ? AND tenant = ? "
                                   "AND status = 'succeeded'", (model_id, tenant)).fetchone()
        if row is not None:
            return row["final_path"]
        row = self._conn().execute("SELECT c.path FROM ft_checkpoints c JOIN ft_jobs j ON j.id = c.job_id "
                                   "WHERE c.model_id = ? AND j.tenant = ?", (model_id, tenant)).fetchone()
        return None if row is None else row["path"]

    def fine_tuned_path(self, model_id: str) -> str | None:
        """The weights directory of any tenant's fine-tuned model or checkpoint id (the store's
        owner: `gymloop models add`), or None."""
        row = self._conn().execute("SELECT tenant FROM ft_jobs WHERE fine_tuned_model = ? UNION "
                                   "SELECT j.tenant FROM ft_checkpoints c JOIN ft_jobs j ON j.id = c.job_id "
                                   "WHERE c.model_id = ?", (model_id, model_id)).fetchone()
        return None if row is None else self.fine_tuned_model(row["tenant"], model_id)

    def fine_tuned_models(self, tenant: str) -> list[dict]:
        """A tenant's succeeded jobs' models: [{id, created, job}]."""
        rows = self._conn().execute("SELECT fine_tuned_model, finished_at, id FROM ft_jobs WHERE tenant = ? AND "
                                    "status = 'succeeded' ORDER BY seq", (tenant,)).fetchall()
        return [{"id": r["fine_tuned_model"], "created": r["finished_at"], "job": r["id"]} for r in rows]

    def fine_tuning_rate(self) -> dict | None:
        """Trained tokens per second and dollars per trained token over finished jobs (ledger)."""
        row = self._conn().execute("SELECT COUNT(*) n, SUM(seconds) s, SUM(trained_tokens) t, SUM(dollars) d "
                                   "FROM ledger WHERE phase = 'fine_tuning'").fetchone()
        if not row["n"] or not row["t"] or not row["s"]:
            return None
        return {"jobs": row["n"], "tokens_per_second": row["t"] / row["s"], "dollars_per_token": row["d"] / row["t"]}

    def next_job(self) -> dict | None:
        """The job a worker should run: one already running (its worker died: resume it), else
        the oldest queued one."""
        row = self._conn().execute(
            "SELECT * FROM ft_jobs WHERE status IN ('running', 'queued') "
            "ORDER BY status = 'running' DESC, seq LIMIT 1").fetchone()
        return None if row is None else _row(row, _JOB_JSON)

    def add_event(self, job_id: str, level: str, message: str, type: str = "message", data: dict | None = None) -> None:
        with self.tx() as c:
            self._insert_event(c, job_id, level, message, type, data or {})

    @staticmethod
    def _insert_event(c: sqlite3.Connection, job_id: str, level: str, message: str, type: str, data: dict) -> None:
        c.execute("INSERT INTO ft_events (id, job_id, created, level, message, type, data) VALUES (?,?,?,?,?,?,?)",
                  (f"ftevent-{uuid.uuid4().hex[:24]}", job_id, time.time(), level, message, type, json.dumps(data)))

    def job_events(self, job_id: str, *, after: str | None = None, limit: int = 20) -> tuple[list[dict], bool]:
        """Newest first; `after`: an event id, the page continues below it."""
        return self._by_job("ft_events", job_id, after, limit, ("data",))

    def add_checkpoint(self, job_id: str, *, step: int, path: str, model_id: str, metrics: dict,
                       state: dict) -> None:
        """A checkpoint and the job's resumable state (`progress`) in one transaction: a job that
        restarts resumes from the newest checkpoint the store knows, never from a half-written one."""
        with self.tx() as c:
            # a step saved twice (paused right after a checkpoint) keeps its first record
            c.execute("INSERT OR IGNORE INTO ft_checkpoints (id, job_id, created, step, path, model_id, metrics) "
                      "VALUES (?,?,?,?,?,?,?)", (f"ftckpt-{uuid.uuid4().hex[:24]}", job_id, time.time(), step, path,
                                                  model_id, json.dumps(metrics)))
            c.execute("UPDATE ft_jobs SET progress = ? WHERE id = ?", (json.dumps(state), job_id))

    def job_checkpoints(self, job_id: str, *, after: str | None = None, limit: int = 20) -> tuple[list[dict], bool]:
        return self._by_job("ft_checkpoints", job_id, after, limit, ("metrics",))

    def get_checkpoint(self, job_id: str, checkpoint_id: str) -> dict | None:
        row = self._conn().execute("SELECT * FROM ft_checkpoints WHERE id = ? AND job_id = ?",
                                   (checkpoint_id, job_id)).fetchone()
        return None if row is None else _row(row, ("metrics",))

    def checkpoint_by_model(self, model_id: str) -> dict | None:
        row = self._conn().execute("SELECT * FROM ft_checkpoints WHERE model_id = ?", (model_id,)).fetchone()
        return None if row is None else _row(row, ("metrics",))

    def _page(self, table: str, cols: str, tenant: str, after: str | None, limit: int | None,
              where: tuple[str, Any] | None) -> tuple[list, bool]:
        q, args = f"SELECT {cols} FROM {table} WHERE tenant = ?", [tenant]
        if where and where[1] is not None:
            q, args = q + f" AND {where[0]} = ?", args + [where[1]]
        if after:
            q, args = q + f" AND seq < (SELECT seq FROM {table} WHERE id = ?)", args + [after]
        q += " ORDER BY seq DESC"
        if limit is not None:
            q, args = q + " LIMIT ?", args + [limit + 1]
        rows = [dict(r) for r in self._conn().execute(q, args).fetchall()]
        if limit is None:
            return rows, False
        return rows[:limit], len(rows) > limit

    def _by_job(self, table: str, job_id: str, after: str | None, limit: int, json_cols: tuple[str, ...]):
        q, args = f"SELECT * FROM {table} WHERE job_id = ?", [job_id]
        if after:
            q, args = q + f" AND seq < (SELECT seq FROM {table} WHERE id = ?)", args + [after]
        rows = self._conn().execute(q + " ORDER BY seq DESC LIMIT ?", args + [limit + 1]).fetchall()
        return [_row(r, json_cols) for r in rows[:limit]], len(rows) > limit


_JOB_JSON = ("metadata", "method", "hyperparameters", "error", "result_files", "progress")


def _env_key(env: str, version: int | None) -> str:
    """Feedback names an environment either as `tools@v2` or as `tools` plus a version."""
    return env if version is None or "@v" in env else f"{env}@v{version}"


def _split(sql: str) -> list[str]:
    return [s.strip() for s in sql.split(";") if s.strip()]


def _row(row: sqlite3.Row, json_cols: tuple[str, ...]) -> dict[str, Any]:
    d = dict(row)
    for k in json_cols:
        if d.get(k) is not None:
            d[k] = json.loads(d[k])
    return d
