"""Model versions (candidates, promotions, rollbacks), the loop's runs and rounds, and drift events."""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Sequence

from ..accounting.rows import LedgerRow
from . import ledger
from .db import Database, record
from .errors import Conflict, NotFound
from .records import DriftEvent, ModelVersion, Round

PROMOTIONS = "gymloop_promotions"      # the channel a change of the served version is announced on


class Versions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, path: str, parent: int | None, status: str = "candidate", scores: dict | None = None) -> int:
        with self.db.tx() as c:
            now = time.time()
            version = c.execute("INSERT INTO model_versions (parent, path, created, status, scores, promoted_at) "
                                "VALUES (?,?,?,?,?,?) RETURNING version",
                                (parent, path, now, status, json.dumps(scores or {}),
                                 now if status == "promoted" else None)).fetchone()[0]
            self.db.notify(c, PROMOTIONS)
            return int(version)

    def set_status(self, version: int, status: str, scores: dict | None = None) -> None:
        with self.db.tx() as c:
            if c.execute("SELECT 1 FROM model_versions WHERE version = ?", (version,)).fetchone() is None:
                raise NotFound(f"unknown model version {version}")
            c.execute("UPDATE model_versions SET status = ? WHERE version = ?", (status, version))
            if status == "promoted":
                c.execute("UPDATE model_versions SET promoted_at = ? WHERE version = ?", (time.time(), version))
            if scores is not None:
                c.execute("UPDATE model_versions SET scores = ? WHERE version = ?", (json.dumps(scores), version))
            self.db.notify(c, PROMOTIONS)

    def get(self, version: int) -> ModelVersion | None:
        return record(self.db.read().execute("SELECT * FROM model_versions WHERE version = ?", (version,)).fetchone(),
                      ("scores",))

    def list(self) -> list[ModelVersion]:
        return [record(r, ("scores",)) for r in self.db.read().execute("SELECT * FROM model_versions ORDER BY version")]

    def promoted(self) -> ModelVersion | None:
        """The most recently promoted version still in service."""
        return record(self.db.read().execute("SELECT * FROM model_versions WHERE status = 'promoted' "
                                             "ORDER BY version DESC LIMIT 1").fetchone(), ("scores",))

    def rollback_to(self, version: int) -> None:
        """Serve `version` again: every promoted version after it becomes rolled_back."""
        with self.db.tx() as c:
            row = c.execute("SELECT status FROM model_versions WHERE version = ?", (version,)).fetchone()
            if row is None:
                raise NotFound(f"unknown model version {version}")
            if row["status"] not in ("promoted", "rolled_back"):
                raise Conflict(f"version {version} was never promoted (status {row['status']}); "
                               "only a version that passed the gate can be served again")
            c.execute("UPDATE model_versions SET status = 'rolled_back' WHERE version > ? AND status = 'promoted'",
                      (version,))
            c.execute("UPDATE model_versions SET status = 'promoted', promoted_at = ? WHERE version = ?",
                      (time.time(), version))
            self.db.notify(c, PROMOTIONS)

    # --- a loop's runs and rounds ------------------------------------------------------------------
    def ensure_run(self, run_id: str, config: dict) -> None:
        with self.db.tx() as c:
            c.execute("INSERT INTO runs VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
                      (run_id, time.time(), json.dumps(config), "running"))

    def last_round(self, run_id: str) -> int:
        return self.db.read().execute("SELECT MAX(round) FROM rounds WHERE run_id = ?", (run_id,)).fetchone()[0] or 0

    def rounds(self, run_id: str) -> list[Round]:
        rows = self.db.read().execute("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,)).fetchall()
        return [record(r, ("metrics",)) for r in rows]

    def recent_rounds(self, limit: int = 20) -> list[Round]:
        rows = self.db.read().execute("SELECT * FROM rounds ORDER BY finished DESC LIMIT ?", (limit,)).fetchall()
        return [record(r, ("metrics",)) for r in reversed(rows)]

    def commit_round(self, run_id: str, round: int, *, path: str, parent: int | None, status: str,
                     scores: dict, metrics: dict, started: float, ledger_rows: Sequence[LedgerRow] = (),
                     finished: float | None = None) -> int:
        """Register the round's candidate, the round and its ledger rows in one transaction.

        A crash before this call loses nothing committed (the round is redone, and its costs are
        counted once, with it); after it, the round exists exactly once (the primary key refuses a
        second commit). `ledger_rows`: the round's rows (accounting/rows.py), filed under this round.
        """
        with self.db.tx() as c:
            version = int(c.execute("INSERT INTO model_versions (parent, path, created, status, scores) "
                                    "VALUES (?,?,?,?,?) RETURNING version",
                                    (parent, path, time.time(), status, json.dumps(scores))).fetchone()[0])
            c.execute("INSERT INTO rounds VALUES (?,?,?,?,?,?)",
                      (run_id, round, status, started, time.time() if finished is None else finished,
                       json.dumps({**metrics, "version": version})))
            for row in ledger_rows:
                ledger.insert(c, dataclasses.replace(row, run_id=run_id, round=round))
            self.db.notify(c, PROMOTIONS)
        return version

    # --- drift ---------------------------------------------------------------------------------------
    def add_drift_event(self, *, env: str, kind: str, before: float, after: float, detail: str = "",
                        run_id: str | None = None, round: int | None = None) -> int:
        with self.db.tx() as c:
            return int(c.execute("INSERT INTO drift_events (created, run_id, round, env, kind, before, after, detail) "
                                 "VALUES (?,?,?,?,?,?,?,?) RETURNING id",
                                 (time.time(), run_id, round, env, kind, before, after, detail)).fetchone()[0])

    def drift_events(self) -> list[DriftEvent]:
        return [dict(r) for r in self.db.read().execute("SELECT * FROM drift_events ORDER BY id")]
