"""Typed configuration of `gymloop train` (YAML in, validated by pydantic).

Every field is documented once, here. Unknown keys and bad values are errors that name the
field (`load_config` turns pydantic's report into a short message).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .backends import NAMES, check_backend
from .models.lora import LoraOptions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EnvSpec(_Strict):
    """Which environment to train and evaluate on."""

    name: str = Field("arith", description="Registered environment name (see `gymloop envs list`).")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Environment options, validated by the environment.")
    max_turns: int = Field(1, ge=1, description="Most model turns per episode.")

    @model_validator(mode="after")
    def _check(self) -> "EnvSpec":
        from .envs import REGISTRY

        # a clear error on a bad name or option; nothing is started (a peer's server, a bridge):
        # the run builds the environment
        REGISTRY.check(self.name, **self.options)
        return self


class SamplingConfig(_Strict):
    """Rollout sampling."""

    temperature: float = Field(1.0, gt=0, description="Sampling temperature of rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1 = off).")
    max_new_tokens: int = Field(8, ge=1, description="Most tokens per model turn.")


# The names of engine.ENGINE_DTYPES (a test keeps them equal; this module stays free of torch).
EngineDtype = Literal["model", "bfloat16"]
# The engine backends' names, declared once (backends.py, also torch-free)
EngineBackend = Literal[NAMES]  # type: ignore[valid-type]


class VLLMSettings(_Strict):
    """How gymloop starts vLLM (engine_backend vllm): the device's preset (CPU: eager, whole prefills,
    its KV cache in RAM; GPU: CUDA graphs, a share of the GPU's memory) chosen from the runtime's
    vLLM build, then these."""

    args: list[str] = Field(default_factory=list, description="More vLLM server flags, passed last (they win over "
                            "the preset's), e.g. ['--max-num-seqs', '128'].")
    gpu_memory: float | None = Field(None, gt=0, le=1, description="GPU: the share of the GPU's memory vLLM may "
                                     "take (default 0.9; 0.45 when the trainer is on the same GPU, device: cuda).")
    kv_cache_gb: float | None = Field(None, gt=0, description="CPU: the KV cache's size in GiB "
                                      "(VLLM_CPU_KVCACHE_SPACE; default 1).")

_TABLES = {"advantage": "ADVANTAGES", "loss": "LOSSES", "loss_agg": "AGGREGATIONS", "correction": "CORRECTIONS"}


def _known(field: str, name: str) -> str:
    """`name` must be a key of the gymloop.algorithms table of `field` (imported here, not at
    the top: the tables import torch, and the CLI starts without it)."""
    from . import algorithms

    names = getattr(algorithms, _TABLES[field])
    if name not in names:
        raise ValueError(f"unknown {field} {name!r}; known: {', '.join(names)} (see gymloop algorithms)")
    return name


class GRPOConfig(_Strict):
    """The policy-gradient update: GRPO and its variants, by name (`gymloop algorithms` lists
    them; the functions are in gymloop/algorithms/)."""

    steps: int = Field(200, ge=0, description="Training steps (one batch of rollouts each).")
    prompts_per_step: int = Field(16, ge=1, description="Tasks per step.")
    group_size: int = Field(8, ge=2, description="Samples per task (G).")
    lr: float = Field(2e-3, gt=0, description="Peak AdamW learning rate (after warm-up; see lr_schedule).")
    warmup_steps: int = Field(5, ge=0, description="Linear learning-rate warm-up steps.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="After warm-up: constant, or cosine decay to min_lr_ratio x lr at the "
        "last step (a run that should end on its best policy, not on a late noisy update).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine schedule's final learning rate / lr.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    clip_low: float = Field(0.2, ge=0, le=1, description="Ratio clip below 1 (1: no lower bound, as CISPO uses it).")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (DAPO clip-higher).")
    beta: float = Field(0.0, ge=0, description="Weight of KL to the frozen initial model (0 = none).")
    advantage: str = Field("grpo", description="Advantage estimator: grpo (group-normalised), dr_grpo "
                           "(no std), rloo (leave-one-out). algorithms/advantages.py.")
    loss: str = Field("grpo", description="Policy loss: grpo (token-level clipped ratio), gspo "
                      "(sequence-level ratio; use clip ranges ~1e-3 and loss_agg seq-mean), cispo (clipped, "
                      "detached IS weight). algorithms/losses.py.")
    loss_agg: str = Field("token-mean", description="Loss aggregation: token-mean or seq-mean. algorithms/aggregation.py.")
    correction: str = Field("none", description="Trainer/behaviour mismatch correction: none, tis (truncated "
                            "IS weight), icepop (mask tokens outside the band). The ratio is then taken "
                            "against the trainer's weights before the step (one more forward pass); "
                            "mismatch_kl and masked_frac are logged. algorithms/corrections.py.")
    correction_low: float = Field(0.5, gt=0, le=1, description="icepop: lower edge of the kept band of "
                                  "pi_trainer / pi_behaviour.")
    correction_high: float = Field(2.0, ge=1, description="tis: the weight's cap; icepop: upper edge of the band.")
    dynamic_sampling: bool = Field(False, description="DAPO's dynamic sampling: draw more groups while fewer "
                                   "than prompts_per_step carry a signal (up to max_refills draws), train on "
                                   "prompts_per_step of them.")
    max_refills: int = Field(3, ge=1, description="Extra draws per step with dynamic_sampling.")
    overlong_cache: int = Field(0, ge=0, description="DAPO's soft overlong penalty: replies within this many "
                                "tokens of the budget (max_new_tokens x max_turns) lose up to 1 reward, "
                                "linearly; over it, 1. 0 = off.")
    reward_weights: dict[str, float] = Field(
        default_factory=dict, description="Train on a weighted sum of the verifier's reward components "
        "instead of its reward (TRL's reward_weights), e.g. calls: {tool: 0.25, arguments: 0.25, correct: 0.5}, "
        "partial credit for a call of the right tool, so a group that never gets the whole call right still "
        "has a signal. Success, evaluation and the gate read the reward. Empty: the reward.")
    epochs: int = Field(1, ge=1, description="Passes over each batch (>1 makes the ratio clip matter).")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass over the batch.")
    micro_batch: int = Field(0, ge=0, description="Rows per forward/backward pass (0: a minibatch at once). "
                             "Gradients are summed over the parts: the same update, with the memory of one "
                             "part (a 49k-token vocabulary's logits of 32 x 400 tokens are 2.5 GB).")
    max_staleness: int = Field(
        0, ge=0, description="0: synchronous, on-policy. N > 0: a collector thread generates ahead "
        "and rollouts up to N weight versions old are trained on (older ones are dropped).")
    collector: Literal["process", "thread"] = Field(
        "process", description="With max_staleness > 0: generate in a separate process (no GIL "
        "shared with the trainer; weights through shared memory) or in a thread.")
    drop_zero_signal: bool = Field(
        True, description="Leave out groups whose rewards are all equal (their advantage is 0)."
    )
    router_replay: bool = Field(False, description="MoE models: the engine records every token's experts and "
                                "the trainer's forward uses them (R3), so trained log-probs use the routing "
                                "that produced the sample. In-process collectors only (not cluster.backend ray).")

    @field_validator("advantage", "loss", "loss_agg", "correction")
    @classmethod
    def _registered(cls, v: str, info: ValidationInfo) -> str:
        return _known(info.field_name, v)
    train_only: list[str] = Field(
        default_factory=list, description="Train only the parameters whose name matches one of these "
        "regular expressions (e.g. 'layers\\.(2[6-9])\\.' for the top 4 of 30 layers); the rest stay "
        "frozen, so backward stops below the lowest trained layer. Empty: train everything.")
    lora: LoraOptions | None = Field(
        None, description="Train LoRA adapters (peft) instead of every weight: {rank, alpha, dropout, "
        "target_modules}. Checkpoints hold the merged model and the adapter (adapter/); the engine runs the "
        "model's own forward (hf backend). Synchronous, local runs only (max_staleness 0, no trainer actors).")


class EvalConfig(_Strict):
    """Held-out evaluation."""

    tasks: int = Field(500, ge=0, description="Held-out tasks (greedy pass@1 and mean reward). 0: the run does not "
                       "evaluate (a loop round's training: the gate measures the candidate on the same suite).")
    every: int = Field(50, ge=0, description="Evaluate every N training steps (0 = only at start and end).")
    ks: list[int] = Field(default_factory=list, description="k values of pass@k (sampled).")
    samples: int = Field(0, ge=0, description="Samples per task for pass@k (>= max k).")
    max_new_tokens: int = Field(8, ge=1, description="Most tokens per model turn in evaluation.")


class CostConfig(_Strict):
    """How the ledger prices the run."""

    profile: str = Field("cpu-2vcpu", description="Hardware profile the run is priced on (profiles.yaml).")
    profiles_file: str | None = Field(None, description="Your own profiles YAML (default: the shipped one).")
    utilisation: float = Field(0.4, gt=0, le=1, description="Assumed utilisation for projections to other hardware.")


class LoggingConfig(_Strict):
    """Where metrics go besides RUN_DIR/metrics.jsonl, which is always written."""

    tensorboard: bool = Field(False, description="Also write TensorBoard event files to RUN_DIR/tensorboard "
                              "(pip install 'gymloop[loggers]').")
    wandb: bool = Field(False, description="Also log to a Weights & Biases run in RUN_DIR/wandb "
                        "(pip install 'gymloop[loggers]').")
    wandb_project: str = Field("gymloop", min_length=1, description="W&B project name.")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline needs no network or account; `wandb sync RUN_DIR/wandb/offline-run-*` uploads later.")


class ClusterConfig(_Strict):
    """Where the job's roles run. `local`: this machine's processes. `ray`: rollout workers
    (an engine and the environment each) and the held-out evaluation are Ray actors; the
    trainer stays in the driver, or with `trainers` >= 1 runs as data-parallel Ray actors."""

    backend: Literal["local", "ray"] = Field("local", description="local or ray.")
    address: str | None = Field(None, description="Ray cluster to join: 'host:port', 'auto' or 'ray://...'; "
                                "None starts a private local Ray instance for the run (stopped after it).")
    num_cpus: int = Field(2, ge=1, description="CPUs of the private local Ray instance.")
    workers: int = Field(2, ge=1, description="Rollout worker actors; each step's tasks are split across them.")
    worker_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each rollout worker.")
    worker_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves for each rollout worker. > 0: its "
                               "engine generates on the GPU (fractions share one GPU between workers).")
    connect_timeout_s: float = Field(20.0, gt=0, description="Fail with a clear error when the cluster does "
                                     "not answer within this.")
    step_timeout_s: float = Field(600.0, gt=0, description="Most seconds a step's rollouts may take before "
                                  "the run stops with an error (never a silent hang).")
    max_restarts: int = Field(3, ge=0, description="Dead workers replaced per step before giving up.")
    bucket_mb: int = Field(64, ge=1, description="Weight-transfer bucket size through the object store.")
    trainers: int = Field(0, ge=0, description="Trainer actors. 0: the trainer runs in the driver. N >= 1: "
                          "N data-parallel ranks (torch.distributed, gloo) as Ray actors, each step's batch "
                          "split across them; rank 0 publishes the weights to the rollout workers.")
    trainer_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each trainer actor.")
    trainer_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves for each trainer actor. > 0: each "
                                "rank trains on its GPU and the ranks talk over NCCL (else gloo on CPU); NCCL needs a GPU "
                                "of its own per rank, so use 1 with trainers >= 2.")
    fsdp: bool = Field(False, description="Shard parameters, gradients and optimizer state across the "
                       "trainer ranks (FSDP2, one unit per decoder layer): each holds 1/trainers of them. "
                       "Needs trainers >= 2.")

    @model_validator(mode="after")
    def _trainers_need_ray(self) -> "ClusterConfig":
        if self.trainers and self.backend != "ray":
            raise ValueError("cluster.trainers needs backend: ray (the local backend trains in this process)")
        if self.fsdp and self.trainers < 2:
            raise ValueError("cluster.fsdp shards across trainer ranks: it needs trainers >= 2")
        return self


def check_device(device: str, grpo: GRPOConfig, cluster: ClusterConfig) -> None:
    """A forked collector process cannot use CUDA: on a GPU, asynchronous training collects in
    a thread or on Ray."""
    if device == "cuda" and grpo.max_staleness and grpo.collector == "process" and cluster.backend == "local":
        raise ValueError("device: cuda with max_staleness > 0 needs grpo.collector: thread (a forked "
                         "collector process cannot use CUDA) or cluster.backend: ray")


class RunBlocks(_Strict):
    """The blocks a training run and a loop share: what model, on what, trained how, priced,
    logged and placed where. `TrainConfig` and the loop's `LoopConfig` both are these blocks plus
    their own fields, so a loop's round is a `TrainConfig` built from the loop's blocks."""

    model: str = Field("nano", description="'nano', 'nano-tools' or 'nano-moe' (built and cached locally; 'nano:seed=1' picks the "
                       "pre-training seed), 'smollm2', or a Hugging Face model directory. In a loop: the base "
                       "model when the store has no promoted version yet.")
    env: EnvSpec = Field(default_factory=EnvSpec, description="Environment trained on.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Rollout sampling.")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPO update (in a loop: per round).")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation (in a loop: also "
                             "the tasks per suite at the gate).")
    seed: int = Field(0, description="Seed of task sampling and rollouts (a loop's round r uses seed * 1000 + r).")
    threads: int = Field(1, ge=1, description="torch CPU threads, set for the process by the CLI (1 was fastest "
                         "and steadiest on 2 cores).")
    run_dir: str = Field("runs", description="Parent directory of run directories.")
    name: str = Field("grpo", pattern=r"^[A-Za-z0-9_.-]+$", description="Run name (directory prefix); a loop's id "
                      "(a restart with the same name resumes).")
    engine_backend: EngineBackend = Field(
        "auto", description="Engine backend (gymloop/backends.py): auto (llama when the model allows it, else hf), "
        "llama (gymloop's native sampler), hf (transformers' forward), or vllm (a vLLM server in its own process "
        "and venv, `make vllm`; weights sent after every step, a LoRA run's as adapters; with max_staleness > 0 a "
        "collector thread generates on it; on Ray each rollout worker starts its own).")
    vllm_url: str | None = Field(None, description="engine_backend vllm: a running vLLM server (started with "
                                 "gymloop's worker extension) to use instead of starting one.")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="engine_backend vllm: how it is started.")
    engine_dtype: EngineDtype = Field(
        "model", description="The dtype generation computes in (engine.ENGINE_DTYPES): model (the parameters' own, exact) or "
                        "bfloat16 (native: cast copies, remade at each weight load, 2-3x faster prefill on CPUs with "
                        "AMX; vLLM: its --dtype). The trainer keeps the model's dtype: the sampled tokens' log-probs "
                        "then differ from its own (logged as approx_kl_behaviour; grpo.correction corrects).")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where the trainer and its engine run. cuda: this process's current GPU "
        "(asynchronous training then needs grpo.collector: thread, or backend: ray, since a forked "
        "process cannot use CUDA). Ray actors are placed by cluster: rollout workers and trainer actors "
        "on GPUs with cluster.worker_gpus and cluster.trainer_gpus. A loop's gate evaluations and "
        "serving stay on the CPU.")
    cost: CostConfig = Field(default_factory=CostConfig, description="Cost accounting.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric loggers.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where the roles run.")

    @model_validator(mode="after")
    def _cuda_collector(self) -> "RunBlocks":
        check_device(self.device, self.grpo, self.cluster)
        check_backend(self.engine_backend, router_replay=self.grpo.router_replay, dtype=self.engine_dtype,
                      lora=self.grpo.lora is not None)
        if self.grpo.router_replay and self.cluster.backend == "ray":
            raise ValueError("grpo.router_replay records routing in this process's engines: it does not "
                             "run with cluster.backend ray yet")
        if self.grpo.lora is not None and (self.grpo.max_staleness or self.cluster.backend == "ray"
                                           or self.cluster.trainers):
            raise ValueError("grpo.lora trains the adapters in this process, generating from the same model: "
                             "it needs grpo.max_staleness 0 and a local cluster without trainer actors")
        return self

    def blocks(self) -> dict[str, Any]:
        """The shared blocks as keyword arguments of another `RunBlocks` subclass."""
        return {k: getattr(self, k) for k in RunBlocks.model_fields}


class TrainConfig(RunBlocks):
    """`gymloop train CONFIG.yaml`."""

    @model_validator(mode="after")
    def _stop_needs_evaluation(self) -> "TrainConfig":
        if self.stop_at_pass1 is not None and self.eval.tasks == 0:
            raise ValueError("stop_at_pass1 stops on a held-out score: it needs eval.tasks >= 1")
        return self

    @model_validator(mode="after")
    def _resumable(self) -> "TrainConfig":
        if self.resume_from and (self.grpo.max_staleness or self.cluster.backend == "ray" or self.cluster.trainers):
            raise ValueError("resume_from continues a synchronous local run (grpo.max_staleness 0, no Ray): "
                             "an asynchronous collector's draws depend on timing, so they cannot be replayed")
        return self

    stop_at_pass1: float | None = Field(
        None, gt=0, le=1, description="Stop once held-out pass@1 reaches this value (benchmarks)."
    )
    init_trainer_state: str | None = Field(
        None, description="A checkpoint directory whose optimizer state this new run continues (a loop's next "
        "round); its steps, seeds and clocks start afresh.")
    checkpoint_every: int = Field(
        0, ge=0, description="Steps between checkpoints of the run (checkpoint/ in its run directory, "
        "model and train_state.pt) that `resume_from` continues after a crash; 0: only at the end.")
    resume_from: str | None = Field(
        None, description="A checkpoint of an interrupted run with this config: the run goes on from the "
        "step after it and draws what the uninterrupted run would have (a synchronous local run "
        "ends at the same weights). `gymloop train CONFIG --resume RUN_DIR` sets it.")
    init_adapter: str | None = Field(
        None, description="grpo.lora: a LoRA adapter directory (a checkpoint's adapter/) to continue training, "
        "on `model` as its base.")


class ConfigError(ValueError):
    """A configuration file that does not validate; the message names each bad field."""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {loc}: {msg}" + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" and "input" in e and not isinstance(e["input"], dict) else ""))
    return "\n".join(lines)


def load_config(path: str | Path, overrides: dict | None = None, model: type[BaseModel] = TrainConfig) -> Any:
    """Read and validate a YAML config as `model` (`TrainConfig` for `gymloop train`, `LoopConfig`
    for `gymloop run`); raise ConfigError naming every bad field, or what is wrong with the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    data = _deep_merge(data, overrides or {})
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, str(path))) from None


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
