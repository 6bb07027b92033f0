"""Serving replicas' heartbeats: which version each answers with (and since when), how busy it
is. A fleet's status, and a promotion's roll-out time, are read from here, so any machine that
reaches the store sees the whole fleet without reaching the replicas."""
from __future__ import annotations

import time

from .db import Database, record
from .records import Replica


class Replicas:
    def __init__(self, db: Database) -> None:
        self.db = db

    def beat(self, replica: Replica) -> None:
        """Write (or replace) one replica's row; `seen` is set to now."""
        row = {**replica, "seen": time.time()}
        cols = list(Replica.__annotations__)
        with self.db.tx(serial=False) as c:
            c.execute(f"INSERT INTO replicas ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                      "ON CONFLICT (id) DO UPDATE SET " + ", ".join(f"{k} = excluded.{k}" for k in cols[1:]),
                      [row[k] for k in cols])

    def remove(self, replica_id: str) -> None:
        with self.db.tx(serial=False) as c:
            c.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))

    def list(self, fleet: str | None = None, seen_within_s: float | None = None) -> list[Replica]:
        """Replicas (of one fleet), oldest first; only those heard from within `seen_within_s`."""
        q, args = "SELECT * FROM replicas WHERE 1 = 1", []
        if fleet is not None:
            q, args = q + " AND fleet = ?", args + [fleet]
        if seen_within_s is not None:
            q, args = q + " AND seen >= ?", args + [time.time() - seen_within_s]
        return [record(r) for r in self.db.read().execute(q + " ORDER BY started", args).fetchall()]

    def forget(self, fleet: str) -> int:
        """Delete a fleet's rows (when it is taken down); how many."""
        with self.db.tx(serial=False) as c:
            return len(c.execute("DELETE FROM replicas WHERE fleet = ? RETURNING id", (fleet,)).fetchall())
