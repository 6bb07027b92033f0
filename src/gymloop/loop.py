"""`gymloop run`: the loop that never stops, in rounds that each survive a crash.

    round r:  start from the promoted model (and its optimizer state)
              -> GRPO for `steps_per_round` steps (curriculum position = r: seeds derive from it)
              -> evaluate the candidate on the target environment and every suite
              -> gate: promote only if the target improves by >= delta and no suite drops by > epsilon
              -> commit the candidate and the round to the store in one transaction

Servers following the same store (`gymloop serve`) switch to a promoted version between
batches. A `kill -9` at any moment and a restart redo the round that was not committed,
from the same model, optimizer state and seeds; a committed round is never repeated.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pydantic import Field

from .checkpoint import load_model, resolve_model
from .config import EnvSpec, EvalConfig, GRPOConfig, SamplingConfig, TrainConfig, _Strict
from .engine import Engine
from .envs import Task, make_env
from .evaluate import evaluate
from .store import Store
from .train import train


class GateConfig(_Strict):
    """When a candidate replaces the served model."""

    delta: float = Field(0.01, ge=0, description="The target suite's pass@1 must rise by at least this.")
    epsilon: float = Field(0.02, ge=0, description="No suite's pass@1 may fall by more than this.")


class CurriculumConfig(_Strict):
    """What each round trains on."""

    production_share: float = Field(0.5, ge=0, le=1, description="Share of each step's tasks drawn from "
                                    "production failures (feedback with reward < 1 and a task reference).")


class LoopConfig(_Strict):
    """`gymloop run CONFIG.yaml`."""

    model: str = Field("nano", description="Base model when the store has no promoted version yet.")
    store: str = Field("gymloop.db", description="The SQLite store shared with `gymloop serve`.")
    run_dir: str = Field("runs", description="Parent of the loop's round directories.")
    name: str = Field("loop", pattern=r"^[A-Za-z0-9_.-]+$", description="Loop id; a restart with the same name resumes.")
    rounds: int | None = Field(None, ge=1, description="Stop after this many committed rounds (None: never).")
    env: EnvSpec = Field(default_factory=EnvSpec, description="The target environment trained on.")
    suites: list[str] = Field(default_factory=list, description="Other held-out suites guarded against regression.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Rollout sampling.")
    grpo: GRPOConfig = Field(default_factory=lambda: GRPOConfig(steps=50), description="GRPO per round (steps = per round).")
    eval_tasks: int = Field(200, ge=1, description="Held-out tasks per suite.")
    eval_max_new_tokens: int = Field(8, ge=1, description="Most tokens per turn in evaluation.")
    gate: GateConfig = Field(default_factory=GateConfig, description="Promotion gate.")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Curriculum.")
    seed: int = Field(0, description="Seed; round r uses seed * 1000 + r.")
    threads: int = Field(1, ge=1, description="torch CPU threads.")


def suite_scores(model_dir: str, suites: list[str], cfg: LoopConfig) -> dict[str, float]:
    model, tok = load_model(model_dir)
    engine = Engine(model, tok.pad_token_id, decode=tok.decode)
    out = {}
    for name in suites:
        env = make_env(name)
        res = evaluate(engine, tok, env, env.sample_tasks(cfg.eval_tasks, "heldout", seed=cfg.seed),
                       max_new_tokens=cfg.eval_max_new_tokens, max_turns=cfg.env.max_turns)
        out[res.env] = res.pass1
    return out


def gate(before: dict[str, float], after: dict[str, float], target: str, g: GateConfig) -> tuple[bool, str]:
    """(promote?, why). Pure: the scores in, the decision out."""
    gain = after[target] - before[target]
    if gain < g.delta:
        return False, f"{target} changed by {gain:+.3f} < delta {g.delta}"
    worst = min(((after[k] - before[k], k) for k in before if k in after), default=(0.0, None))
    if worst[0] < -g.epsilon:
        return False, f"{worst[1]} fell by {-worst[0]:.3f} > epsilon {g.epsilon}"
    return True, f"{target} rose by {gain:+.3f}"


def curriculum(cfg: LoopConfig, store: Store, r: int) -> tuple[Callable[[int], list[Task]], dict]:
    """task_source(step) for round r: production failures of the target environment (rebuilt
    from their ids, recorded in the store as production tasks) mixed with fresh train tasks."""
    env = make_env(cfg.env.name, **cfg.env.options)
    failures = []
    for f in store.production_failures():
        if f["env"] != env.name and f["env"] != cfg.env.name:
            continue
        try:
            t = env.task_from_id(f["task_id"])
        except ValueError:
            continue          # a reference this environment cannot rebuild: skip, never crash
        t = Task(**{**t.__dict__, "source": "production", "split": "train"})
        store.add_task(t)
        failures.append(t)
    n = cfg.grpo.prompts_per_step
    n_prod = min(len(failures), round(n * cfg.curriculum.production_share))
    stats = {"production_failures": len(failures), "production_per_step": n_prod}

    def source(step: int) -> list[Task]:
        k = (r * 1_000 + step) * n_prod
        prod = [failures[(k + i) % len(failures)] for i in range(n_prod)] if n_prod else []
        fresh = env.sample_tasks(n - n_prod, "train", seed=(cfg.seed * 1000 + r) * 1_000_003 + step)
        return prod + fresh

    return source, stats


def run_loop(cfg: LoopConfig, progress: bool = False, echo: Callable[[str], None] = print) -> list[dict]:
    store = Store(cfg.store)
    store.ensure_run(cfg.name, cfg.model_dump(mode="json"))
    target = make_env(cfg.env.name, **cfg.env.options).name
    suites = [target] + [s for s in cfg.suites if s != target]
    while cfg.rounds is None or store.last_round(cfg.name) < cfg.rounds:
        r = store.last_round(cfg.name) + 1
        started = time.time()
        current = store.promoted()
        if current is None:   # the first round starts from the base model, recorded as version 1
            base = str(resolve_model(cfg.model, progress=progress))
            scores = suite_scores(base, suites, cfg)
            vid = store.add_model_version(base, parent=None, status="promoted", scores=scores)
            current = store.model_version(vid)
        start_dir = current["path"]
        before = current["scores"] if set(suites) <= set(current["scores"]) else suite_scores(start_dir, suites, cfg)
        has_state = (Path(start_dir) / "trainer_state.pt").exists()
        tcfg = TrainConfig(
            model=start_dir, env=cfg.env, sampling=cfg.sampling, grpo=cfg.grpo,
            eval=EvalConfig(tasks=cfg.eval_tasks, every=0, max_new_tokens=cfg.eval_max_new_tokens),
            seed=cfg.seed * 1000 + r, threads=cfg.threads, run_dir=str(Path(cfg.run_dir) / cfg.name),
            name=f"round-{r:04d}", init_trainer_state=start_dir if has_state else None)
        source, cur_stats = curriculum(cfg, store, r)
        summary = train(tcfg, progress=progress, echo=lambda m: None, task_source=source)
        candidate = str(Path(summary["run_dir"]) / "checkpoint")
        after = suite_scores(candidate, suites, cfg)
        promote, why = gate(before, after, target, cfg.gate)
        status = "promoted" if promote else "rejected"
        version = store.commit_round(
            cfg.name, r, path=candidate, parent=current["version"], status=status, scores=after,
            started=started, metrics={"before": before, "after": after, "why": why, "curriculum": cur_stats,
                                      "economics": {k: summary["economics"].get(k) for k in
                                                    ("dollars", "post_training_dollars", "cost_per_1m_generated_tokens")}})
        echo(f"round {r}: v{version} {status} ({why}); " + ", ".join(f"{k} {after[k]:.3f}" for k in suites))
    return store.rounds(cfg.name)
