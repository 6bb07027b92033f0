"""The store's database: one SQLite file in WAL mode (a connection per thread, transactions), or
a PostgreSQL server (postgres.py) chosen by URL; the schema and its migrations, and the row
helpers the repositories share. The repositories' SQL is the dialect both speak (`?` parameters,
`INSERT ... ON CONFLICT`, `RETURNING`). SQL lives in this package only (tests/unit/test_layout.py checks it)."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

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
    # `rollouts` was never written (rollouts live in run directories)
    """
    DROP TABLE rollouts;
    """,
    # a fleet: each serving replica's heartbeat (what it serves, since when, how busy), and when a
    # version was promoted (a roll-out's time is measured from it)
    """
    ALTER TABLE model_versions ADD COLUMN promoted_at REAL;
    CREATE TABLE replicas (
        id TEXT PRIMARY KEY, fleet TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
        started REAL NOT NULL, seen REAL NOT NULL, version INTEGER NOT NULL, version_since REAL NOT NULL,
        in_flight INTEGER NOT NULL, answered INTEGER NOT NULL);
    """,
    # an agent program's production sessions: the task it named, every call's exact tokens (a
    # capture of rollout/capture.py's Call, as JSON), and the verdicts on the whole session
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY, created REAL NOT NULL, key_id TEXT, task TEXT NOT NULL);
    CREATE TABLE session_calls (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
        trace_id TEXT NOT NULL, created REAL NOT NULL, call TEXT NOT NULL);
    CREATE TABLE session_feedback (
        id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
        created REAL NOT NULL, reward REAL NOT NULL CHECK (reward >= 0 AND reward <= 1));
    CREATE INDEX session_calls_session ON session_calls(session_id);
    CREATE INDEX session_feedback_session ON session_feedback(session_id);
    """,
]


Conn = Any        # a transaction's connection: sqlite3.Connection, or postgres.Connection


class Schema:
    """What both databases do alike over their own `read()` and `tx()`: migrate (each migration's
    DDL through `ddl`, the back-end's types), the schema's version, row counts."""

    url: str

    def _migrate(self, ddl: Callable[[str], str] = lambda sql: sql) -> None:
        with self.tx() as c:
            c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            have = int(row["value"]) if row else 0
            if have > len(MIGRATIONS):
                raise RuntimeError(f"{self.url} has schema version {have}; this gymloop knows {len(MIGRATIONS)}")
            for sql in MIGRATIONS[have:]:
                # statement by statement: SQLite's executescript would commit the open transaction
                for statement in split_statements(ddl(sql)):
                    c.execute(statement)
            c.execute("INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT (key) DO UPDATE SET value = "
                      "excluded.value", (str(len(MIGRATIONS)),))

    @property
    def schema_version(self) -> int:
        return int(self.read().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    def count(self, table: str) -> int:
        if table not in COUNTED:
            raise ValueError(f"unknown table {table!r}")
        return self.read().execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


class Database(Schema):
    """Thread-safe access to one SQLite database in WAL mode: `tx()` for writes, `read()` for reads."""

    dialect = "sqlite"
    LOCK_ROW = ""     # SQLite serializes write transactions: a row read in one is already the writer's

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.url = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._migrate()

    def read(self) -> sqlite3.Connection:
        """This thread's connection (reads see every committed transaction)."""
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
    def tx(self, serial: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction: committed on success, rolled back on any error. SQLite serializes
        every write transaction (`serial` matters on PostgreSQL only)."""
        conn = self.read()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def notify(self, c: sqlite3.Connection, channel: str) -> None:
        """Nothing is announced on SQLite: followers poll."""

    def wait(self, channel: str, timeout: float) -> bool:
        """SQLite announces nothing: sleep one poll interval (False: no notification)."""
        time.sleep(timeout)
        return False

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


COUNTED = frozenset({"tasks", "traces", "feedback", "runs", "rounds", "model_versions", "ledger", "replicas",
                     "sessions", "session_calls", "session_feedback"})


def split_statements(sql: str) -> list[str]:
    return [s.strip() for s in sql.split(";") if s.strip()]


def record(row: sqlite3.Row | None, json_cols: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A row as a dict, its JSON columns decoded; None for no row."""
    if row is None:
        return None
    d = dict(row)
    for k in json_cols:
        if d.get(k) is not None:
            d[k] = json.loads(d[k])
    return d


def env_key(env: str, version: int | None) -> str:
    """Feedback names an environment either as `tools@v2` or as `tools` plus a version."""
    return env if version is None or "@v" in env else f"{env}@v{version}"


def page(db: Database, table: str, cols: str, tenant: str, after: str | None, limit: int | None,
         where: tuple[str, Any] | None) -> tuple[list[dict], bool]:
    """A tenant's rows of `table`, newest first (by `seq`), below the row `after` when given:
    (at most `limit` rows, whether more follow)."""
    q, args = f"SELECT {cols} FROM {table} WHERE tenant = ?", [tenant]
    if where and where[1] is not None:
        q, args = q + f" AND {where[0]} = ?", args + [where[1]]
    if after:
        q, args = q + f" AND seq < (SELECT seq FROM {table} WHERE id = ?)", args + [after]
    q += " ORDER BY seq DESC"
    if limit is not None:
        q, args = q + " LIMIT ?", args + [limit + 1]
    rows = [dict(r) for r in db.read().execute(q, args).fetchall()]
    if limit is None:
        return rows, False
    return rows[:limit], len(rows) > limit
