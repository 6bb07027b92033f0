"""The fine-tuning API's request bodies, as /openapi.json describes them and the routes
(serve/fine_tuning.py) validate them: jobs and their methods' hyper-parameters, graders (typed
by `type`, run by envs/graders.py), promotion. Fields not set are None, so a route can tell
"auto" and absent apart from a value."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import EnvSpec
from ..envs.grader_types import Grader
from ..loop.config import GateConfig
from ..models.lora import LoraOptions
from .openapi import json_int


Auto = Literal["auto"]


class Hyperparameters(BaseModel):
    """A method's hyper-parameters: "auto" (or absent) or a value (methods.resolve)."""

    model_config = ConfigDict(extra="forbid")
    n_epochs: json_int(1, 1000) | Auto | None = None
    batch_size: json_int(1, 4096) | Auto | None = None
    learning_rate_multiplier: Annotated[float, Field(gt=0, le=1000)] | Auto | None = None
    beta: Annotated[float, Field(gt=0, le=100)] | Auto | None = Field(None, description="dpo: the KL weight.")
    sft_weight: Annotated[float, Field(ge=0, le=100)] | Auto | None = Field(
        None, description="dpo: weight of an NLL term on the preferred answer (RPO); auto: 1, 0: plain DPO.")
    length_normalize: bool | None = Field(None, description="dpo: log-ratios per token, not per answer.")
    reference_free: bool | None = Field(None, description="dpo: no reference model.")
    lora: LoraOptions | None = Field(None, description="Any method: train LoRA adapters (peft) instead of "
                                     "every weight.")
    compute_multiplier: Annotated[float, Field(gt=0, le=64)] | Auto | None = Field(
        None, description="reinforcement: samples per prompt = 8 x this (at least 2).")
    group_size: json_int(2, 256) | Auto | None = Field(None, description="reinforcement: samples per prompt "
                                                        "(overrides compute_multiplier).")
    max_new_tokens: json_int(1, 4096) | Auto | None = Field(None, description="reinforcement: most tokens per "
                                                             "sampled answer.")
    eval_interval: json_int(0, 100000) | Auto | None = Field(None, description="reinforcement: steps between "
                                                              "held-out evaluations (0: at the end only).")
    eval_samples: json_int(1, 100000) | Auto | None = Field(None, description="reinforcement: held-out prompts "
                                                             "evaluated (validation_file, else training prompts).")
    micro_batch_size: json_int(0, 4096) | Auto | None = Field(
        None, description="supervised and reinforcement: rows (sampled answers) per forward/backward pass, "
        "gradients summed over the parts (the same update in less memory; auto: 0, all at once, for models up to 1M parameters, else 4).")


# graders: one typed model per type (envs/grader_types.py), run by envs/graders.py


def grader_dict(g: BaseModel) -> dict:
    return g.model_dump(exclude_none=True)


class MethodOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hyperparameters: Hyperparameters | None = None


class ReinforcementOptions(MethodOptions):
    grader: Grader = Field(description="The grader that rewards each sampled answer.")


class MethodBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: MethodOptions | None = None
    dpo: MethodOptions | None = None
    reinforcement: ReinforcementOptions | None = None


class PromoteRequest(BaseModel):
    """POST /v1/fine_tuning/jobs/{id}/promote (admin keys): the job's model through the loop's
    gate into the production slot. The suites are scored for production and candidate now."""

    model_config = ConfigDict(extra="forbid")
    env: EnvSpec = Field(description="The target suite: an environment and its options (as a loop's env).")
    suites: list[str] = Field(default_factory=list, max_length=16, description="Other held-out suites that must "
                              "not fall by more than epsilon.")
    eval_tasks: json_int(1, 100000) = Field(200, description="Held-out tasks per suite.")
    max_new_tokens: json_int(1, 4096) = Field(8, description="Most tokens per model turn in the evaluation.")
    gate: GateConfig = Field(default_factory=GateConfig, description="delta and epsilon of the gate.")


class GraderValidate(BaseModel):
    """POST /v1/fine_tuning/alpha/graders/validate."""

    model_config = ConfigDict(extra="forbid")
    grader: Grader = Field(description="A grader object.")


class JobCreate(BaseModel):
    """POST /v1/fine_tuning/jobs."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="A base model this server can train ('nano', ...), or an ft: "
                       "model or checkpoint id of yours (continued training).")
    training_file: str
    validation_file: str | None = None
    suffix: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    seed: json_int(0, 2**31 - 1) | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    method: MethodBody | None = None
    hyperparameters: Hyperparameters | None = Field(None, description="Legacy: the supervised method's "
                                                    "hyper-parameters.")
    integrations: list[dict] | None = Field(None, max_length=0, description="None are supported (metrics are "
                                            "the job's events and its results file).")


class GraderRun(BaseModel):
    """POST /v1/fine_tuning/alpha/graders/run."""

    model_config = ConfigDict(extra="forbid")
    grader: Grader = Field(description="A grader object.")
    model_sample: str = Field(description="The model output the grader scores ({{sample.output_text}}).")
    item: dict | None = Field(None, description="The data item ({{item.<field>}}).")
