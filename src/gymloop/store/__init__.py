"""The store: everything that must survive a crash, as repositories by domain over one database
(SQLite in WAL mode by default, or PostgreSQL: `Store("postgresql://user@host/db")`). Every write is a transaction committed before the call
returns, so a response sent after a write is never ahead of the disk.

    store.traces     traces, feedback, production's tasks              traces.py
    store.versions   model versions, a loop's runs and rounds, drift   versions.py
    store.ledger     priced rows (accounting/rows.py makes them)       ledger.py
    store.files      the fine-tuning service's uploaded files          files.py
    store.jobs       fine-tuning jobs, their events and checkpoints    jobs.py
    store.replicas   a serving fleet's heartbeats                      replicas.py
    store.sessions   agent programs' sessions: calls as tokens, verdicts sessions.py

Repositories return typed records (records.py) and raise typed errors (errors.py: NotFound,
Conflict) that the API maps to status codes. db.py holds the connection, transactions and
migrations (postgres.py the same on PostgreSQL); SQL lives in this package only.
"""
from __future__ import annotations

from pathlib import Path

from .db import MIGRATIONS, Database
from .errors import Conflict, NotFound, StoreError
from .files import Files
from .jobs import Jobs
from .ledger import Ledger
from .replicas import Replicas
from .sessions import Sessions
from .traces import Traces
from .versions import PROMOTIONS, Versions

__all__ = ["MIGRATIONS", "Conflict", "Database", "NotFound", "Store", "StoreError"]


def open_database(target: str | Path):
    """The database `target` names: a `postgresql://` URL (PostgresDatabase), else a SQLite file."""
    if str(target).startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresDatabase

            return PostgresDatabase(str(target))
        except ModuleNotFoundError as exc:
            raise RuntimeError(f"a PostgreSQL store needs psycopg: pip install 'gymloop[postgres]' ({exc})") from None
    return Database(target)


class Store:
    """The repositories of one database; thread-safe."""

    def __init__(self, target: str | Path) -> None:
        self.db = open_database(target)
        self.url = self.db.url             # the file's path, or the PostgreSQL URL
        self.traces = Traces(self.db)
        self.versions = Versions(self.db)
        self.ledger = Ledger(self.db)
        self.files = Files(self.db)
        self.jobs = Jobs(self.db)
        self.replicas = Replicas(self.db)
        self.sessions = Sessions(self.db)

    def count(self, table: str) -> int:
        """Rows of one of the store's tables (tests, the demo's summary)."""
        return self.db.count(table)

    @property
    def schema_version(self) -> int:
        return self.db.schema_version

    def wait_for_promotion(self, timeout: float) -> bool:
        """Block until a promotion or rollback is announced (PostgreSQL: LISTEN) or `timeout`
        seconds pass (SQLite: always; its followers poll)."""
        return self.db.wait(PROMOTIONS, timeout)

    def close(self) -> None:
        self.db.close()
