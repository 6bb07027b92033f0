"""`gymloop run`: the loop that never stops, in rounds that each survive a crash.

    round r:  start from the promoted model (and its optimizer state)
              -> GRPO for `grpo.steps` steps (curriculum position = r: seeds derive from it)
              -> evaluate the candidate on the target environment and every suite
              -> gate: promote only if the target improves by >= delta and no suite drops by > epsilon
              -> commit the candidate and the round to the store in one transaction

Servers following the same store (`gymloop serve`) switch to a promoted version between
batches. A `kill -9` at any moment and a restart redo the round that was not committed,
from the same model, optimizer state and seeds; a committed round is never repeated.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


from ..accounting.ledger import Profile, load_profiles
from ..accounting.rows import LedgerRow, phase_rows, round_rows
from ..seeds import round_seed
from ..trainer.state import has_state
from ..config import TrainConfig
from ..bases.registry import resolve_model
from .config import LoopConfig
from .curriculum import curriculum, lineage_start
from .drift import detect_drift
from .from_traces import train_on_traces
from .gate import close_envs, ensure_production, gate, suite_envs, suite_scores
from .summary import loop_summary
from ..tracking.report import write_loop_report
from ..tracking.run_dir import Phases, read_metrics, write_json
from ..tracking.progress import progress as progress_bar
from ..store import Store
from ..orchestrator.train import train



@dataclass
class RoundContext:
    """What a round's training needs: the loop, the store, the round, where it starts from and
    writes to, whether drift was detected (the curriculum then favours production), the round's
    clocks and price."""

    cfg: LoopConfig
    store: Store
    r: int
    start_dir: str
    out_dir: Path
    drift: bool
    phases: Phases
    profile: Profile
    progress: bool
    env: object = None          # the target environment, the loop's for every round


@dataclass
class Trained:
    """A round's candidate and what its training cost and did."""

    candidate: str
    ledger: list[LedgerRow]
    training: dict
    economics: dict
    curriculum: dict = field(default_factory=dict)


def grpo_round(ctx: RoundContext) -> Trained:
    """GRPO from the round's start model (its optimizer state carried on) on the curriculum."""
    cfg, r = ctx.cfg, ctx.r
    # The training run does not evaluate: the gate measures the start model and the candidate on
    # the same suite (its own held-out passes would repeat both, half of a short round's time).
    tcfg = TrainConfig(**{**cfg.blocks(), "model": ctx.start_dir, "seed": round_seed(cfg.seed, r),
                          "run_dir": str(ctx.out_dir.parent), "name": ctx.out_dir.name,
                          "eval": cfg.eval.model_copy(update={"tasks": 0})},
                       init_trainer_state=ctx.start_dir if has_state(ctx.start_dir) else None)
    with ctx.phases.time("curriculum"):
        source, cur_stats = curriculum(cfg.curriculum, cfg.env, cfg.grpo.prompts_per_step, tcfg.seed, ctx.store, r,
                                       cfg.drift.production_share if ctx.drift else None, env=ctx.env)
    summary = train(tcfg, progress=ctx.progress, echo=lambda m: None, task_source=source, env=ctx.env)
    return Trained(str(Path(summary["run_dir"]) / "checkpoint"), phase_rows(summary["economics"]["phases"]),
                   training_stats(summary),
                   {k: summary["economics"].get(k) for k in ("dollars", "post_training_dollars",
                                                             "cost_per_1m_generated_tokens")}, cur_stats)


def traces_round(ctx: RoundContext) -> Trained:
    """A fine-tuning job (sft / dpo) on production's traces with feedback."""
    candidate, training, rows = train_on_traces(ctx.store, ctx.cfg.round, ctx.start_dir, ctx.out_dir,
                                                round_seed(ctx.cfg.seed, ctx.r), ctx.profile)
    dollars = sum(x.dollars for x in rows)
    return Trained(candidate, rows, training, {"dollars": dollars, "post_training_dollars": dollars,
                                               "cost_per_1m_generated_tokens": None})


# round.method -> how the round trains its candidate
ROUND_METHODS: dict[str, Callable[[RoundContext], Trained]] = {"grpo": grpo_round, "sft": traces_round,
                                                                "dpo": traces_round}


def run_loop(cfg: LoopConfig, progress: bool = False, echo: Callable[[str], None] = print) -> list[dict]:
    """Rounds until `cfg.rounds` are committed (forever when None). The target environment is
    built once and serves every round's curriculum, training and gate (a peer's environment
    keeps one bridge or server for the loop, closed when it ends)."""
    suites = suite_envs(cfg.gate_run())
    try:
        return _rounds(cfg, suites, progress, echo)
    finally:
        close_envs(suites)


def _rounds(cfg: LoopConfig, suites: list, progress: bool, echo: Callable[[str], None]) -> list[dict]:
    store = Store(cfg.store)
    store.versions.ensure_run(cfg.name, cfg.model_dump(mode="json"))
    profiles = load_profiles(cfg.cost.profiles_file)
    profile = profiles[cfg.cost.profile]
    gate_run = cfg.gate_run()
    target = suites[0].name
    loop_dir = Path(cfg.run_dir) / cfg.name
    bar = progress_bar(None, f"loop {cfg.name}", progress, "round", total=cfg.rounds,
                       initial=store.versions.last_round(cfg.name))
    while cfg.rounds is None or store.versions.last_round(cfg.name) < cfg.rounds:
        r = store.versions.last_round(cfg.name) + 1
        started = time.time()
        phases = Phases()     # the loop's own work; train() accounts for its phases
        with phases.time("gate_evaluation"):     # the first round records the base model as version 1
            current = store.versions.promoted() or ensure_production(
                store, str(resolve_model(cfg.model, progress=progress)), suites, gate_run)
        # Re-measured every round: an environment that changed shows up as a drop here.
        with phases.time("gate_evaluation"):
            before = suite_scores(current["path"], suites, gate_run)
        start = lineage_start(cfg.lineage, cfg.name, store, current)
        start_dir = start["path"]
        drift = detect_drift(cfg.drift, cfg.name, store, r, current["scores"], before)
        if drift:
            echo(f"round {r}: drift " + ", ".join(
                f"{e['env']} ({'production failure rate' if e['kind'] == 'production' else 'held-out score'} "
                f"{e['before']:.0%} -> {e['after']:.0%})" for e in drift))
        ctx = RoundContext(cfg, store, r, start_dir, loop_dir / f"round-{r:04d}", bool(drift), phases, profile, progress,
                           env=suites[0])
        trained = ROUND_METHODS[cfg.round.method](ctx)
        candidate = trained.candidate
        with phases.time("gate_evaluation"):
            after = suite_scores(candidate, suites, gate_run)
        promote, why = gate(before, after, target, cfg.gate)
        status = "promoted" if promote else "rejected"
        finished = time.time()
        ledger = round_rows(trained.ledger, phases.seconds, profile, finished - started)
        version = store.versions.commit_round(
            cfg.name, r, path=candidate, parent=start["version"], status=status, scores=after,
            started=started, finished=finished, ledger_rows=ledger,
            metrics={"target": target, "served_version": current["version"], "trained_from": start["version"],
                     "before": before, "after": after, "why": why, "curriculum": trained.curriculum,
                     "drift": drift, "training": trained.training, "economics": trained.economics})
        echo(f"round {r}: v{version} {status} ({why}); " + ", ".join(f"{k} {v:.3f}" for k, v in after.items()))
        write_loop_files(store, cfg, target, loop_dir, profiles)
        bar.update(1)
        bar.set_postfix({"served": f"v{version if promote else current['version']}", target: f"{(after if promote else before)[target]:.2f}"})
    bar.close()
    return store.versions.rounds(cfg.name)


def training_stats(summary: dict) -> dict:
    """A round's GRPO in a few numbers: mean reward of its first and last tenth of steps, mean
    loss, and generation throughput."""
    train = read_metrics(summary["run_dir"], "train")
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
