"""A fleet's figures, counted from the store: responses whose trace is missing (lost), versions
that answered without ever being promoted, and how long a promotion took to reach every replica.
The fleet test and bench/serving/fleet.py both count with these."""
from __future__ import annotations

from typing import Iterable


def audit(store, answered: Iterable[tuple[str, int]]) -> dict:
    """`answered`: (trace id, model version) of every response a client received. Returns
    {"answered", "lost" (trace not in the store), "versions" (each version's answers),
    "unpromoted" (versions that answered but were never promoted; version 0 is the base)}."""
    answered = list(answered)
    found = store.traces.existing([t for t, _ in answered])
    versions: dict[int, int] = {}
    for _, v in answered:
        versions[v] = versions.get(v, 0) + 1
    promoted = {r["version"] for r in store.versions.list() if r["promoted_at"] is not None}
    return {"answered": len(answered), "lost": sum(t not in found for t, _ in answered),
            "versions": {str(k): n for k, n in sorted(versions.items())},
            "unpromoted": sorted(v for v in versions if v != 0 and v not in promoted)}


def rollout_seconds(store, fleet: str, version: int) -> float | None:
    """Seconds from `version`'s promotion until the last live replica answered with it (None:
    not every live replica serves it yet, or it was never promoted). A replica started after the
    promotion counts from when it was ready (it loads the promoted version before serving)."""
    row = store.versions.get(version)
    replicas = store.replicas.list(fleet=fleet, seen_within_s=10.0)
    if row is None or row["promoted_at"] is None or not replicas or any(r["version"] != version for r in replicas):
        return None
    return max(r["version_since"] for r in replicas) - row["promoted_at"]


def replaced(store, fleet: str, killed_pid: int, replicas: int, version: int | None = None) -> bool:
    """Whether the fleet is whole again after a replica (`killed_pid`) died: `replicas` live ones
    (heard from within 3 s), the dead one not among them, all on `version` when given."""
    live = store.replicas.list(fleet=fleet, seen_within_s=3.0)
    return (len(live) == replicas and killed_pid not in {r["pid"] for r in live}
            and (version is None or all(r["version"] == version for r in live)))
