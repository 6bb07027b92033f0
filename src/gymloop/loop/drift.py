"""Drift: the world changed under the served model. A suite it now scores lower on than when it
was promoted, or a production failure rate that jumped; each event is recorded in the store."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..config import _Strict
from ..store import Store

if TYPE_CHECKING:
    from .rounds import LoopConfig


class DriftConfig(_Strict):
    """When the world has changed under the served model, and how the loop reacts."""

    eval_drop: float = Field(0.1, gt=0, le=1, description="A suite whose score for the promoted model fell by "
                             "more than this since its promotion is a drift event.")
    failure_rise: float = Field(0.2, gt=0, le=1, description="Production failure rate (last window vs the one "
                                "before) rising by more than this is a drift event.")
    window: int = Field(50, ge=5, description="Feedback rows per window.")
    production_share: float = Field(0.8, ge=0, le=1, description="Curriculum share of production failures "
                                    "in a round that follows a drift event.")


def detect_drift(cfg: "LoopConfig", store: Store, r: int, promoted_scores: dict[str, float],
                 now: dict[str, float]) -> list[dict]:
    """Drift events of round r: a suite the promoted model now scores lower on than when it was
    promoted, or a production failure rate that jumped. Each is recorded in the store."""
    events = []
    for env, then in promoted_scores.items():
        if env in now and then - now[env] > cfg.drift.eval_drop:
            events.append({"env": env, "kind": "eval", "before": then, "after": now[env]})
    for env, (recent, prior, n, n_prior) in store.failure_rates(cfg.drift.window).items():
        # a rise needs a history to rise from: the first traffic ever is not drift
        if min(n, n_prior) >= cfg.drift.window // 2 and recent - prior > cfg.drift.failure_rise:
            events.append({"env": env, "kind": "production", "before": prior, "after": recent})
    for e in events:
        store.add_drift_event(run_id=cfg.name, round=r, **e)
    return events
