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
import warnings
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, field_validator, model_validator

from .checkpoint import load_model, resolve_model
from .config import ClusterConfig, CostConfig, EnvSpec, LoggingConfig, EvalConfig, GRPOConfig, SamplingConfig, TrainConfig, _Strict, check_device
from .engine import Engine
from .envs import Task, make_env, rebuilds_tasks
from .evaluate import evaluate
from .ledger import load_profiles
from .loop_summary import loop_summary
from .report import write_loop_report
from .run import Phases, write_json
from .progress import progress as progress_bar
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
    replay_share: float = Field(0.1, ge=0, le=1, description="Share drawn from past production successes, "
                                "so skills already learned are kept; the rest are fresh tasks.")


class DriftConfig(_Strict):
    """When the world has changed under the served model, and how the loop reacts."""

    eval_drop: float = Field(0.1, gt=0, le=1, description="A suite whose score for the promoted model fell by "
                             "more than this since its promotion is a drift event.")
    failure_rise: float = Field(0.2, gt=0, le=1, description="Production failure rate (last window vs the one "
                                "before) rising by more than this is a drift event.")
    window: int = Field(50, ge=5, description="Feedback rows per window.")
    production_share: float = Field(0.8, ge=0, le=1, description="Curriculum share of production failures "
                                    "in a round that follows a drift event.")


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
    drift: DriftConfig = Field(default_factory=DriftConfig, description="Drift detection.")
    seed: int = Field(0, description="Seed; round r uses seed * 1000 + r.")
    threads: int = Field(1, ge=1, description="torch CPU threads.")
    lineage: Literal["promoted", "latest"] = Field(
        "promoted", description="What a round trains from: the served (promoted) model, or the latest "
        "candidate, promoted or not, so no round's training is thrown away. The gate always compares "
        "with the served model.")
    cost: CostConfig = Field(default_factory=CostConfig, description="Cost accounting of every round.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric loggers of every round.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where each round's roles (rollouts, evaluation, trainer) run.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where each round's trainer and its engine run "
                                           "(TrainConfig.device); gate evaluations and serving stay on the CPU.")

    @field_validator("grpo")
    @classmethod
    def _no_decay(cls, g: GRPOConfig) -> GRPOConfig:
        # Rounds continue one optimizer and schedule: a decay would end in round 1 and leave
        # every later round, the drift's recovery included, at the floor.
        if g.lr_schedule != "constant":
            raise ValueError("grpo.lr_schedule must be 'constant' in a loop (it never ends; a decay would "
                             "leave every round after the first at the floor)")
        return g

    @model_validator(mode="after")
    def _cuda_collector(self) -> "LoopConfig":
        check_device(self.device, self.grpo, self.cluster)
        return self


def suite_envs(cfg: LoopConfig) -> list:
    """The gate's suites: the target environment with its configured options (a loop on
    `arith` with `digits: 3` is gated on 3-digit tasks), then every other suite by name."""
    target = make_env(cfg.env.name, **cfg.env.options)
    return [target] + [make_env(s) for s in cfg.suites if make_env(s).name != target.name]


def suite_scores(model_dir: str, suites: list, cfg: LoopConfig) -> dict[str, float]:
    """Greedy held-out pass@1 of a model on each suite environment, by environment name."""
    model, tok = load_model(model_dir)
    engine = Engine(model, tok.pad_token_id, decode=tok.decode)
    out = {}
    for env in suites:
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


def detect_drift(cfg: LoopConfig, store: Store, r: int, promoted_scores: dict[str, float],
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


def curriculum(cfg: LoopConfig, store: Store, r: int,
               production_share: float | None = None) -> tuple[Callable[[int], list[Task]], dict]:
    """task_source(step) for round r: production failures of the target environment (rebuilt
    from their ids, recorded in the store as production tasks) mixed with fresh train tasks."""
    env = make_env(cfg.env.name, **cfg.env.options)
    skipped = 0

    def rebuild(rows: list[dict]) -> list[Task]:
        nonlocal skipped
        out = []
        mine = [f for f in rows if f["env"] in (env.name, cfg.env.name)]
        if mine and not rebuilds_tasks(env):
            # said, never dropped silently: the loop learns from fresh tasks only
            skipped += len(mine)
            warnings.warn(f"environment {env.name!r} has no task_from_id: {len(mine)} production tasks cannot "
                          "become training tasks (docs/environments.md)", stacklevel=2)
            return []
        for f in mine:
            try:
                t = env.task_from_id(f["task_id"])
            except ValueError:
                skipped += 1  # a reference this environment cannot rebuild: counted, never a crash
                continue
            t = Task(**{**t.__dict__, "source": "production", "split": "train"})
            store.add_task(t)
            out.append(t)
        return out

    failures = rebuild(store.production_failures())
    successes = rebuild(store.production_successes())
    n = cfg.grpo.prompts_per_step
    share = cfg.curriculum.production_share if production_share is None else production_share
    n_prod = min(len(failures), round(n * share))
    n_replay = min(len(successes), round(n * cfg.curriculum.replay_share), n - n_prod)
    stats = {"production_failures": len(failures), "production_per_step": n_prod,
             "replay_per_step": n_replay, "production_not_rebuildable": skipped}

    def cycle(pool: list[Task], k: int, step: int) -> list[Task]:
        start = (r * 1_000 + step) * k
        return [pool[(start + i) % len(pool)] for i in range(k)] if k else []

    def source(step: int) -> list[Task]:
        fresh = env.sample_tasks(n - n_prod - n_replay, "train", seed=(cfg.seed * 1000 + r) * 1_000_003 + step)
        return cycle(failures, n_prod, step) + cycle(successes, n_replay, step) + fresh

    return source, stats


def lineage_start(cfg: LoopConfig, store: Store, served: dict) -> dict:
    """The model version round training starts from (with its optimizer state)."""
    if cfg.lineage == "latest":
        done = store.rounds(cfg.name)
        if done:
            return store.model_version(done[-1]["metrics"]["version"])
    return served


def run_loop(cfg: LoopConfig, progress: bool = False, echo: Callable[[str], None] = print) -> list[dict]:
    store = Store(cfg.store)
    store.ensure_run(cfg.name, cfg.model_dump(mode="json"))
    profiles = load_profiles(cfg.cost.profiles_file)
    profile = profiles[cfg.cost.profile]
    suites = suite_envs(cfg)
    target = suites[0].name
    loop_dir = Path(cfg.run_dir) / cfg.name
    bar = progress_bar(None, f"loop {cfg.name}", progress, "round", total=cfg.rounds,
                       initial=store.last_round(cfg.name))
    while cfg.rounds is None or store.last_round(cfg.name) < cfg.rounds:
        r = store.last_round(cfg.name) + 1
        started = time.time()
        phases = Phases()     # the loop's own work; train() accounts for its phases
        current = store.promoted()
        if current is None:   # the first round starts from the base model, recorded as version 1
            with phases.time("gate_evaluation"):
                base = str(resolve_model(cfg.model, progress=progress))
                scores = suite_scores(base, suites, cfg)
            vid = store.add_model_version(base, parent=None, status="promoted", scores=scores)
            current = store.model_version(vid)
        # Re-measured every round: an environment that changed shows up as a drop here.
        with phases.time("gate_evaluation"):
            before = suite_scores(current["path"], suites, cfg)
        start = lineage_start(cfg, store, current)
        start_dir = start["path"]
        drift = detect_drift(cfg, store, r, current["scores"], before)
        if drift:
            echo(f"round {r}: drift " + ", ".join(
                f"{e['env']} ({'production failure rate' if e['kind'] == 'production' else 'held-out score'} "
                f"{e['before']:.0%} -> {e['after']:.0%})" for e in drift))
        has_state = (Path(start_dir) / "trainer_state.pt").exists()
        tcfg = TrainConfig(
            model=start_dir, env=cfg.env, sampling=cfg.sampling, grpo=cfg.grpo,
            eval=EvalConfig(tasks=cfg.eval_tasks, every=0, max_new_tokens=cfg.eval_max_new_tokens),
            seed=cfg.seed * 1000 + r, threads=cfg.threads, run_dir=str(loop_dir),
            cost=cfg.cost, logging=cfg.logging, cluster=cfg.cluster, device=cfg.device,
            name=f"round-{r:04d}", init_trainer_state=start_dir if has_state else None)
        with phases.time("curriculum"):
            source, cur_stats = curriculum(cfg, store, r, cfg.drift.production_share if drift else None)
        summary = train(tcfg, progress=progress, echo=lambda m: None, task_source=source)
        candidate = str(Path(summary["run_dir"]) / "checkpoint")
        with phases.time("gate_evaluation"):
            after = suite_scores(candidate, suites, cfg)
        promote, why = gate(before, after, target, cfg.gate)
        status = "promoted" if promote else "rejected"
        ledger = [{"phase": k, **{f: v[f] for f in ("seconds", "dollars", "flops", "prompt_tokens",
                                                    "generated_tokens", "trained_tokens")}}
                  for k, v in summary["economics"]["phases"].items()]
        ledger += [{"phase": k, "seconds": sec, "dollars": sec * profile.usd_per_hour / 3600}
                   for k, sec in phases.seconds.items()]
        version = store.commit_round(
            cfg.name, r, path=candidate, parent=start["version"], status=status, scores=after,
            started=started, ledger=ledger,
            metrics={"target": target, "served_version": current["version"], "trained_from": start["version"],
                     "before": before, "after": after, "why": why, "curriculum": cur_stats,
                     "drift": drift,
                     "training": training_stats(summary),
                     "economics": {k: summary["economics"].get(k) for k in
                                   ("dollars", "post_training_dollars", "cost_per_1m_generated_tokens")}})
        echo(f"round {r}: v{version} {status} ({why}); " + ", ".join(f"{k} {v:.3f}" for k, v in after.items()))
        write_loop_files(store, cfg, target, loop_dir, profiles)
        bar.update(1)
        bar.set_postfix({"served": f"v{version if promote else current['version']}", target: f"{(after if promote else before)[target]:.2f}"})
    bar.close()
    return store.rounds(cfg.name)


def training_stats(summary: dict) -> dict:
    """A round's GRPO in a few numbers: mean reward of its first and last tenth of steps, mean
    loss, and generation throughput."""
    import json

    recs = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    tenth = max(1, len(train) // 10)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    gen_s = sum(r.get("gen_seconds", 0.0) for r in train)
    gen_tokens = sum(r.get("generated_tokens", 0) for r in train)
    return {"steps": len(train), "reward_first": mean([r["reward"] for r in train[:tenth]]),
            "reward_last": mean([r["reward"] for r in train[-tenth:]]),
            "reward_mean": mean([r["reward"] for r in train]),
            "loss_mean": mean([r["loss"] for r in train if "loss" in r]),
            "generated_tokens": gen_tokens, "tokens_per_s": gen_tokens / gen_s if gen_s > 0 else None}


def write_loop_files(store: Store, cfg: LoopConfig, target: str, loop_dir: Path, profiles: dict) -> Path:
    """summary.json and report.html of the loop so far (rewritten whole after every round)."""
    loop_dir.mkdir(parents=True, exist_ok=True)
    others = {k: v for k, v in profiles.items() if k != cfg.cost.profile}
    write_json(loop_dir / "summary.json", loop_summary(store, cfg.name, target, cfg.gate.epsilon,
                                                       others, cfg.cost.utilisation))
    return write_loop_report(loop_dir)
