"""An agent program's production sessions: the calls one session made (each with its exact prompt
ids, sampled ids and behaviour log-probs), the task the program named for it, and the verdicts on
the whole session. A failed session's task is what the loop re-runs the program on."""
from __future__ import annotations

import json
import time

from .db import Database, record
from .errors import NotFound, StoreError
from .records import Session


class Sessions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add_calls(self, session_id: str, trace_id: str, key_id: str | None, calls: list[dict],
                  task: dict | None) -> None:
        """Record a request's calls (one per choice) under `session_id`, opening the session on
        its first call: its task is `task` when the program named one, else the first user input."""
        now = time.time()
        if task is None:
            first = next((m.get("content") for m in calls[0]["messages"] if m.get("role") == "user"), None) \
                if calls else None
            task = {"id": session_id, "input": first if isinstance(first, str) else ""}
        with self.db.tx() as c:
            c.execute("INSERT INTO sessions VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
                      (session_id, now, key_id, json.dumps(task)))
            for call in calls:
                c.execute("INSERT INTO session_calls (session_id, trace_id, created, call) VALUES (?,?,?,?)",
                          (session_id, trace_id, now, json.dumps(call)))

    def get(self, session_id: str) -> Session | None:
        return record(self.db.read().execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone(),
                      ("task",))

    def calls(self, session_id: str) -> list[dict]:
        """The session's calls in the order they were answered."""
        rows = self.db.read().execute("SELECT call FROM session_calls WHERE session_id = ? ORDER BY seq",
                                      (session_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def add_feedback(self, session_id: str, reward: float) -> int:
        if not 0.0 <= reward <= 1.0:
            raise StoreError(f"reward must be in [0, 1], got {reward}")
        with self.db.tx() as c:
            if c.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                raise NotFound(f"unknown session id {session_id!r}")
            return int(c.execute("INSERT INTO session_feedback (session_id, created, reward) VALUES (?,?,?) "
                                 "RETURNING id", (session_id, time.time(), reward)).fetchone()[0])

    def failure_rates(self, window: int = 50, env: str = "agent") -> dict[str, tuple[float, float | None, int, int]]:
        """As Traces.failure_rates, of session verdicts (each verdict a row, newest first), under
        `env` (the agent environment's name): (failure rate of the last `window` verdicts, of the
        `window` before them or None, rows in each)."""
        rows = self.db.read().execute("SELECT reward FROM session_feedback ORDER BY id DESC LIMIT ?",
                                      (2 * window,)).fetchall()
        fails = [float(r[0] < 1) for r in rows]
        if not fails:
            return {}
        recent, prior = fails[:window], fails[window:]
        return {env: (sum(recent) / len(recent), sum(prior) / len(prior) if prior else None, len(recent), len(prior))}

    def failed(self, limit: int = 1000) -> list[Session]:
        """Sessions whose latest verdict is a reward below 1, newest verdict first."""
        return self._judged("< 1", limit)

    def succeeded(self, limit: int = 1000) -> list[Session]:
        """Sessions whose latest verdict is reward 1 (replayed so old skills are kept)."""
        return self._judged(">= 1", limit)

    def _judged(self, condition: str, limit: int) -> list[Session]:
        rows = self.db.read().execute(
            "SELECT s.*, f.reward FROM sessions s JOIN session_feedback f ON f.session_id = s.id "
            "WHERE f.id = (SELECT MAX(id) FROM session_feedback WHERE session_id = s.id) "
            f"AND f.reward {condition} ORDER BY f.id DESC LIMIT ?", (limit,)).fetchall()
        return [record(r, ("task",)) for r in rows]
