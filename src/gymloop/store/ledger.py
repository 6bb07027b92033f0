"""The ledger: priced rows (accounting/rows.py makes every one) and what is summed from them."""
from __future__ import annotations

import time

from ..accounting.rows import LedgerRow
from .db import Conn, Database
from .records import LedgerRecord


def insert(c: Conn, row: LedgerRow) -> None:
    """One row, inside the caller's transaction (a round's or a job's commit writes its cost with it)."""
    # accounting/rows.py prices every row; a dict here would be a second writer's
    if not isinstance(row, LedgerRow):
        raise TypeError(f"ledger rows are accounting.rows.LedgerRow, made by gymloop.accounting; got {type(row).__name__}")
    c.execute("INSERT INTO ledger (run_id, round, phase, seconds, device_seconds, prompt_tokens, "
              "generated_tokens, trained_tokens, served_tokens, flops, dollars, created) "
              "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
              (row.run_id, row.round, row.phase, row.seconds,
               row.seconds if row.device_seconds is None else row.device_seconds, row.prompt_tokens,
               row.generated_tokens, row.trained_tokens, row.served_tokens, row.flops, row.dollars, time.time()))


class Ledger:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, row: LedgerRow) -> None:
        with self.db.tx() as c:
            insert(c, row)

    def rows(self, phase: str | None = None) -> list[LedgerRecord]:
        q, args = "SELECT * FROM ledger", ()
        if phase is not None:
            q, args = q + " WHERE phase = ?", (phase,)
        return [dict(r) for r in self.db.read().execute(q + " ORDER BY id", args)]

    def round_costs(self, run_id: str) -> dict[int, dict[str, dict]]:
        """{round: {phase: {seconds, dollars, flops, *_tokens}}} of a loop's committed rounds."""
        rows = self.db.read().execute(
            "SELECT round, phase, SUM(seconds) AS seconds, SUM(dollars) AS dollars, SUM(flops) AS flops, "
            "SUM(prompt_tokens) AS prompt_tokens, SUM(generated_tokens) AS generated_tokens, "
            "SUM(trained_tokens) AS trained_tokens FROM ledger WHERE run_id = ? AND round IS NOT NULL "
            "GROUP BY round, phase ORDER BY round", (run_id,)).fetchall()
        out: dict[int, dict[str, dict]] = {}
        for r in rows:
            out.setdefault(r["round"], {})[r["phase"]] = {k: r[k] for k in r.keys() if k not in ("round", "phase")}
        return out

    def fine_tuning_rate(self) -> dict | None:
        """Trained tokens per second and dollars per trained token over finished jobs."""
        row = self.db.read().execute("SELECT COUNT(*) n, SUM(seconds) s, SUM(trained_tokens) t, SUM(dollars) d "
                                     "FROM ledger WHERE phase = 'fine_tuning'").fetchone()
        if not row["n"] or not row["t"] or not row["s"]:
            return None
        return {"jobs": row["n"], "tokens_per_second": row["t"] / row["s"], "dollars_per_token": row["d"] / row["t"]}

    def stats(self) -> dict:
        """Aggregates for the dashboard (no trace contents): traces, feedback, spend, serving's cost."""
        c = self.db.read()
        t = c.execute("SELECT COUNT(*), COALESCE(SUM(completion_tokens), 0), MAX(created) FROM traces").fetchone()
        f = c.execute("SELECT COUNT(*), COALESCE(SUM(CASE WHEN reward < 1 THEN 1 ELSE 0 END), 0) FROM feedback "
                      "WHERE reward IS NOT NULL").fetchone()
        d = c.execute("SELECT COALESCE(SUM(dollars), 0), COALESCE(SUM(seconds), 0) FROM ledger").fetchone()
        sv = c.execute("SELECT COALESCE(SUM(dollars), 0), COALESCE(SUM(served_tokens), 0) FROM ledger "
                       "WHERE phase = 'serving'").fetchone()
        return {"traces": t[0], "served_tokens": t[1], "last_trace": t[2], "feedback": f[0], "failures": f[1],
                "ledger_dollars": d[0], "ledger_seconds": d[1], "serving_dollars": sv[0],
                "cost_per_1m_served_tokens": sv[0] / sv[1] * 1e6 if sv[1] else None}
