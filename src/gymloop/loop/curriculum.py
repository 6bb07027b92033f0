"""What a round trains on: production failures rebuilt as tasks, replayed successes, fresh tasks;
and which model version a round starts from (its lineage)."""
from __future__ import annotations

import warnings
from typing import Callable

from ..config import EnvSpec
from ..envs import Task, make_env, rebuilds_tasks
from ..seeds import step_seed
from ..store import Store
from .config import CurriculumConfig


def curriculum(cur: CurriculumConfig, target: EnvSpec, per_step: int, run_seed: int, store: Store, r: int,
               production_share: float | None = None, env=None) -> tuple[Callable[[int], list[Task]], dict]:
    """task_source(step) for round r, `per_step` tasks a step: production failures of the target
    environment (rebuilt from their ids, recorded in the store as production tasks) and replayed
    successes, by the curriculum's shares (`production_share` overrides the first, after a drift),
    the rest fresh train tasks drawn as the round's run draws them (seeds.step_seed of its seed).
    `env`: the target environment, built already (the loop's, kept across rounds)."""
    env = env if env is not None else make_env(target.name, **target.options)
    skipped = 0

    def rebuild(rows: list[dict]) -> list[Task]:
        nonlocal skipped
        out = []
        mine = [f for f in rows if f["env"] in (env.name, target.name)]
        if mine and not rebuilds_tasks(env):
            skipped += len(mine)     # said once below, never dropped silently
            return []
        for f in mine:
            try:
                t = env.task_from_id(f["task_id"])
            except ValueError:
                skipped += 1  # a reference this environment cannot rebuild: counted, never a crash
                continue
            t = Task(**{**t.__dict__, "source": "production", "split": "train"})
            store.traces.add_task(t)
            out.append(t)
        return out

    def sessions(rows: list[dict]) -> list[Task]:
        """An agent program's judged sessions as tasks (their program re-runs them)."""
        nonlocal skipped
        out = []
        for s in rows:
            try:
                t = env.task_from_session(s)
            except ValueError:
                skipped += 1
                continue
            store.traces.add_task(t)
            out.append(t)
        return out

    failures = rebuild(store.traces.production_failures()) + sessions(store.sessions.failed())
    successes = rebuild(store.traces.production_successes()) + sessions(store.sessions.succeeded())
    if skipped and not rebuilds_tasks(env):
        # the loop then learns from fresh tasks only
        warnings.warn(f"environment {env.name!r} has no task_from_id: {skipped} production tasks cannot "
                      "become training tasks (docs/environments.md)", stacklevel=2)
    n = per_step
    share = cur.production_share if production_share is None else production_share
    n_prod = min(len(failures), round(n * share))
    n_replay = min(len(successes), round(n * cur.replay_share), n - n_prod)
    stats = {"production_failures": len(failures), "production_per_step": n_prod,
             "replay_per_step": n_replay, "production_not_rebuildable": skipped}

    def cycle(pool: list[Task], k: int, step: int) -> list[Task]:
        start = (r * 1_000 + step) * k
        return [pool[(start + i) % len(pool)] for i in range(k)] if k else []

    def source(step: int) -> list[Task]:
        fresh = env.sample_tasks(n - n_prod - n_replay, "train", seed=step_seed(run_seed, step))
        return cycle(failures, n_prod, step) + cycle(successes, n_replay, step) + fresh

    return source, stats


def lineage_start(lineage: str, run_id: str, store: Store, served: dict) -> dict:
    """The model version round training starts from (with its optimizer state): the served one,
    or (`latest`) the loop's latest candidate."""
    if lineage == "latest":
        done = store.versions.rounds(run_id)
        if done:
            return store.versions.get(done[-1]["metrics"]["version"])
    return served
