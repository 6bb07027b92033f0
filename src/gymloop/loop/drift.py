"""Drift: the world changed under the served model. A suite it now scores lower on than when it
was promoted, or a production failure rate that jumped (feedback on answers, or an agent program's
session verdicts); each event is recorded in the store."""
from __future__ import annotations

from .config import DriftConfig
from ..store import Store


def detect_drift(d: DriftConfig, run_id: str, store: Store, r: int, promoted_scores: dict[str, float],
                 now: dict[str, float]) -> list[dict]:
    """Drift events of round r: a suite the promoted model now scores lower on than when it was
    promoted, or a production failure rate that jumped. Each is recorded in the store."""
    events = []
    for env, then in promoted_scores.items():
        if env in now and then - now[env] > d.eval_drop:
            events.append({"env": env, "kind": "eval", "before": then, "after": now[env]})
    rates = {**store.traces.failure_rates(d.window), **store.sessions.failure_rates(d.window)}  # an agent program's
    for env, (recent, prior, n, n_prior) in rates.items():
        # a rise needs a history to rise from: the first traffic ever is not drift
        if min(n, n_prior) >= d.window // 2 and recent - prior > d.failure_rise:
            events.append({"env": env, "kind": "production", "before": prior, "after": recent})
    for e in events:
        store.versions.add_drift_event(run_id=run_id, round=r, **e)
    return events
