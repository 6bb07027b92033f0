"""What a loop has done, read back from the store: one row per committed round (served version,
held-out score per suite, promotion, production success per environment, cost by phase),
the drift events, what each cost to recover from, and intelligence per dollar over time.

The loop writes it as `summary.json` (and `report.html`) in its directory after every round,
so the numbers a person reads are the store's, never a second bookkeeping.
"""
from __future__ import annotations

from ..accounting.ledger import Profile, cost_to_maintain, project
from ..store import Store


def loop_summary(store: Store, run_id: str, target: str, epsilon: float,
                 profiles: dict[str, Profile] | None = None, utilisation: float = 0.4) -> dict:
    """`target`: the suite trained for, unless a round recorded its own (the environment's
    version can change between rounds). `profiles`: other hardware to project the rounds'
    FLOPs onto, at `utilisation`.

    Spend counts every phase of a round (rollouts, training, the gate's evaluations), since all
    of it is what keeping the model worth serving costs. Intelligence per dollar is held-out
    points of the target suite per dollar: from the base (first round's served model) over the
    cumulative spend, and per promotion over that round's spend."""
    rounds = store.versions.rounds(run_id)
    costs = store.ledger.round_costs(run_id)
    versions = {v["version"]: v for v in store.versions.list()}
    events = [e for e in store.versions.drift_events() if e["run_id"] == run_id]
    rows: list[dict] = []
    spent = 0.0
    base = rounds[0]["metrics"]["before"] if rounds else {}
    # Production outcomes of round r: feedback since the previous round ended; for the first
    # round, since the model it started from was recorded (its traffic before the loop began).
    first_parent = versions.get(rounds[0]["metrics"]["version"], {}).get("parent") if rounds else None
    since = versions[first_parent]["created"] if first_parent in versions else (rounds[0]["started"] if rounds else 0.0)
    for r in rounds:
        m = r["metrics"]
        promoted = r["status"] == "promoted"
        served = m["after"] if promoted else m["before"]
        phases = costs.get(r["round"], {})
        dollars = sum(p["dollars"] for p in phases.values())
        spent += dollars
        prod = store.traces.production_success(since, r["finished"])
        since = r["finished"]
        goal = m.get("target", target)      # what the round trained for (it may change: a new API version)
        gain_prev = 100 * (m["after"][goal] - m["before"][goal]) if promoted else 0.0
        gained = 100 * (served[goal] - base[goal]) if goal in base else None
        rows.append({
            "round": r["round"], "version": m["version"], "status": r["status"], "why": m.get("why", ""),
            # after the round: the candidate if promoted, else whoever served during it
            "served_version": m["version"] if promoted else m.get(
                "served_version", versions.get(m["version"], {}).get("parent")),
            "before": m["before"], "after": m["after"], "served": served,
            "production": {env: ok / n for env, (ok, n) in prod.items()},
            "production_requests": {env: n for env, (_, n) in prod.items()},
            "drift": m.get("drift", []), "training": m.get("training", {}),
            "seconds": r["finished"] - r["started"], "ledger_seconds": sum(p["seconds"] for p in phases.values()),
            "dollars": dollars, "phase_dollars": {k: p["dollars"] for k, p in phases.items()},
            "cumulative_dollars": spent,
            "target": goal, "points_from_base": gained,
            "intelligence_per_dollar": gained / spent if gained is not None and spent > 0 else None,
            "promotion_points_per_dollar": gain_prev / dollars if promoted and dollars > 0 else None,
        })
    serving = store.ledger.stats()
    last = rows[-1] if rows else None
    # traffic served since the last round (its production success is nobody's round yet)
    tail = store.traces.production_success(since, float("inf")) if rows else {}
    production_after = {env: ok / n for env, (ok, n) in tail.items() if n}
    flops = sum(p["flops"] for c in costs.values() for p in c.values())
    return {
        "kind": "loop", "run_id": run_id, "target": last["target"] if last else target, "epsilon": epsilon,
        "rounds": rows, "drift_events": events,
        "cost_to_maintain": cost_to_maintain(rows, events, epsilon, production_after),
        "production_after_last_round": production_after,
        "base_scores": base,
        "served_scores": last["served"] if last else {},
        "post_training_dollars": spent,
        "points_gained": last["points_from_base"] if last else None,
        "intelligence_per_dollar": last["intelligence_per_dollar"] if last else None,
        "promotions": sum(r["status"] == "promoted" for r in rows),
        "flops": flops, "projections": project(flops, profiles or {}, utilisation),
        "served_tokens": serving["served_tokens"], "serving_dollars": serving["serving_dollars"],
        "cost_per_1m_served_tokens": serving["cost_per_1m_served_tokens"],
    }
