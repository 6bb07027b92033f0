"""A loop's configuration, in one module the loop's parts import (none of them imports another
for its config): `gymloop run CONFIG.yaml` is a LoopConfig, its blocks the parts' own configs."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ..config import EngineDtype, EnvSpec, EvalConfig, GRPOConfig, RunBlocks, _Strict


class GateConfig(_Strict):
    """When a candidate replaces the served model."""

    delta: float = Field(0.01, ge=0, description="The target suite's pass@1 must rise by at least this.")
    epsilon: float = Field(0.02, ge=0, description="No suite's pass@1 may fall by more than this.")


class DriftConfig(_Strict):
    """When the world has changed under the served model, and how the loop reacts."""

    eval_drop: float = Field(0.1, gt=0, le=1, description="A suite whose score for the promoted model fell by "
                             "more than this since its promotion is a drift event.")
    failure_rise: float = Field(0.2, gt=0, le=1, description="Production failure rate (last window vs the one "
                                "before) rising by more than this is a drift event.")
    window: int = Field(50, ge=5, description="Feedback rows per window.")
    production_share: float = Field(0.8, ge=0, le=1, description="Curriculum share of production failures "
                                    "in a round that follows a drift event.")


class CurriculumConfig(_Strict):
    """What each round trains on."""

    production_share: float = Field(0.5, ge=0, le=1, description="Share of each step's tasks drawn from "
                                    "production failures (feedback with reward < 1 and a task reference).")
    replay_share: float = Field(0.1, ge=0, le=1, description="Share drawn from past production successes, "
                                "so skills already learned are kept; the rest are fresh tasks.")


class RoundMethod(_Strict):
    """How a round trains its candidate."""

    method: Literal["grpo", "sft", "dpo"] = Field(
        "grpo", description="grpo: GRPO on the environment (and the curriculum's production tasks); sft / dpo: "
        "a fine-tuning job on the store's traces with feedback (gymloop traces export --format sft|dpo).")
    n_epochs: int = Field(2, ge=1, description="sft / dpo: passes over the exported examples.")
    batch_size: int = Field(16, ge=1, description="sft / dpo: examples per step.")
    learning_rate_multiplier: float | None = Field(None, gt=0, description="sft / dpo: as the fine-tuning API's "
                                                   "(None: its default for the method).")
    beta: float = Field(0.1, gt=0, description="dpo: the KL weight.")
    sft_weight: float = Field(0.0, ge=0, description="dpo: weight of an NLL term on the preferred answer (RPO).")
    min_examples: int = Field(8, ge=1, description="sft / dpo: fewer exported examples and the round trains "
                              "nothing (the candidate is the start model, which the gate rejects).")


class GateRun(_Strict):
    """What the gate needs to measure and decide: the target environment, the other suites, how
    many held-out tasks (and tokens) each, the seed of their sample, and the rule. A loop makes
    one from its config (LoopConfig.gate_run); the API's promotion from its request."""

    env: EnvSpec = Field(default_factory=EnvSpec, description="The target environment, with its options.")
    suites: list[str] = Field(default_factory=list, description="Other held-out suites guarded against regression.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Tasks per suite and tokens per turn.")
    seed: int = Field(0, description="Seed of each suite's held-out sample.")
    gate: GateConfig = Field(default_factory=GateConfig, description="The rule.")
    engine_dtype: EngineDtype = Field("model", description="The dtype the evaluations compute in "
                                                       "(engine.ENGINE_DTYPES; a loop's engine_dtype).")


class LoopConfig(RunBlocks):
    """`gymloop run CONFIG.yaml`: the blocks of a training run (each round is one, on the
    promoted model) and what only a loop has: its store, gate, curriculum and drift detection."""

    name: str = Field("loop", pattern=r"^[A-Za-z0-9_.-]+$", description="Loop id; a restart with the same name resumes.")
    grpo: GRPOConfig = Field(default_factory=lambda: GRPOConfig(steps=50), description="GRPO per round (steps = per round).")
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(tasks=200, every=0),
                             description="Held-out evaluation of each round and tasks per suite at the gate.")
    store: str = Field("gymloop.db", description="The store shared with `gymloop serve`: a SQLite file or a "
                       "PostgreSQL URL (postgresql://user@host/db).")
    rounds: int | None = Field(None, ge=1, description="Stop after this many committed rounds (None: never).")
    suites: list[str] = Field(default_factory=list, description="Other held-out suites guarded against regression.")
    gate: GateConfig = Field(default_factory=GateConfig, description="Promotion gate.")
    round: RoundMethod = Field(default_factory=RoundMethod, description="How each round trains its candidate: "
                               "GRPO, or a fine-tuning job (sft / dpo) on the store's traces with feedback.")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Curriculum.")
    drift: DriftConfig = Field(default_factory=DriftConfig, description="Drift detection.")
    lineage: Literal["promoted", "latest"] = Field(
        "promoted", description="What a round trains from: the served (promoted) model, or the latest "
        "candidate, promoted or not, so no round's training is thrown away. The gate always compares "
        "with the served model.")

    @field_validator("grpo")
    @classmethod
    def _no_decay(cls, g: GRPOConfig) -> GRPOConfig:
        # Rounds continue one optimizer and schedule: a decay would end in round 1 and leave
        # every later round, the drift's recovery included, at the floor.
        if g.lr_schedule != "constant":
            raise ValueError("grpo.lr_schedule must be 'constant' in a loop (it never ends; a decay would "
                             "leave every round after the first at the floor)")
        return g

    @field_validator("eval")
    @classmethod
    def _gate_tasks(cls, e: EvalConfig) -> EvalConfig:
        if e.tasks < 1:
            raise ValueError("eval.tasks is the gate's tasks per suite in a loop: it must be >= 1")
        return e

    def gate_run(self) -> GateRun:
        return GateRun(env=self.env, suites=self.suites, eval=self.eval, seed=self.seed, gate=self.gate,
                       engine_dtype=self.engine_dtype)
