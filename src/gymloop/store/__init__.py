"""The store: everything that must survive a crash, as repositories by domain over one database
(SQLite in WAL mode by default). Every write is a transaction committed before the call
returns, so a response sent after a write is never ahead of the disk.

    store.traces     traces, feedback, production's tasks              traces.py
    store.versions   model versions, a loop's runs and rounds, drift   versions.py
    store.ledger     priced rows (accounting/rows.py makes them)       ledger.py
    store.files      the fine-tuning service's uploaded files          files.py
    store.jobs       fine-tuning jobs, their events and checkpoints    jobs.py

Repositories return typed records (records.py) and raise typed errors (errors.py: NotFound,
Conflict) that the API maps to status codes. db.py holds the connection, transactions and
migrations; SQL lives in this package only.
"""
from __future__ import annotations

from pathlib import Path

from .db import MIGRATIONS, Database
from .errors import Conflict, NotFound, StoreError
from .files import Files
from .jobs import Jobs
from .ledger import Ledger
from .traces import Traces
from .versions import Versions

__all__ = ["MIGRATIONS", "Conflict", "Database", "NotFound", "Store", "StoreError"]


class Store:
    """The repositories of one database; thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.db = Database(path)
        self.path = self.db.path
        self.traces = Traces(self.db)
        self.versions = Versions(self.db)
        self.ledger = Ledger(self.db)
        self.files = Files(self.db)
        self.jobs = Jobs(self.db)

    def count(self, table: str) -> int:
        """Rows of one of the store's tables (tests, the demo's summary)."""
        return self.db.count(table)

    @property
    def schema_version(self) -> int:
        return self.db.schema_version
