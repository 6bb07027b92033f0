"""The reinforcement method of the fine-tuning API: GRPO (orchestrator.train, the same run
`gymloop train` makes) on the job's prompts, each sampled answer rewarded by the job's grader
through the `graded` environment (envs/graded.py). Grader errors are episode errors: counted in
the job's metrics (grader_errors) and left out of training, never a reward of 0.

Steps: ceil(prompts / batch_size) per epoch, n_epochs epochs, the prompts of a step taken in a
seeded order per epoch; group_size samples per prompt. A checkpoint (model, trainer state and
rft_state.json) is written each epoch, at the last step and when paused; a resumed job continues from it.
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch

from ..config import TrainConfig
from ..envs.graded import GradedConfig, GradedEnv
from ..models.lora import ADAPTER_DIR
from .methods import JobRun, Progress

log = logging.getLogger(__name__)
STATE = "rft_state.json"


def _write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class _JobSteps:
    """The job's side of the GRPO run: which prompts a step trains on, and after each step its
    metrics, checkpoints and whether to stop. The run may be a resumed part of the job: its
    step s is the job's step `done + s`."""

    def __init__(self, run: JobRun, progress: Progress, tasks: list, start: dict) -> None:
        self.run, self.progress, self.tasks = run, progress, tasks
        self.done = self.step = start["step"]
        self.tokens, self.seconds0, self.t0 = start["trained_tokens"], start["seconds"], time.perf_counter()
        self.steps_per_epoch = math.ceil(len(tasks) / run.hp.batch_size)
        self.total = self.steps_per_epoch * run.hp.n_epochs
        self.every = progress.checkpoint_every or self.steps_per_epoch
        self.stopped: str | None = None

    def seconds(self) -> float:
        return self.seconds0 + time.perf_counter() - self.t0

    def prompts(self, s: int) -> list:
        """The run's step s (1-based): batch k of the job's epoch, in that epoch's seeded order."""
        b = self.run.hp.batch_size
        epoch, k = divmod(self.done + s - 1, self.steps_per_epoch)
        order = torch.randperm(len(self.tasks), generator=torch.Generator().manual_seed(self.run.seed * 1000 + epoch))
        return [self.tasks[i] for i in order[k * b:(k + 1) * b].tolist()]

    def after(self, s: int, m: dict, save) -> str | None:
        """orchestrator.train's StepHook: report, checkpoint (each epoch, the last step, a pause)."""
        self.step = self.done + s
        self.tokens += m["trained_tokens"]
        metrics = {"step": self.step, "total_steps": self.total, "train_loss": m.get("loss", 0.0),
                   "mean_reward": m["reward"], "grader_errors": m["errors"]}
        if "heldout_reward" in m:
            metrics.update(valid_mean_reward=m["heldout_reward"], valid_pass1=m["heldout_pass1"])

        def write(path: Path) -> None:
            save(str(path))
            (path / STATE).write_text(json.dumps({"step": self.step, "trained_tokens": self.tokens,
                                                  "seconds": self.seconds()}))
        if self.step % self.every == 0 or self.step == self.total:
            self.progress.on_checkpoint(self.step, metrics, write)
        self.progress.on_metrics(metrics)
        self.stopped = self.progress.should_stop()
        if self.stopped == "paused":
            self.progress.on_checkpoint(self.step, metrics, write)
        return self.stopped


def train_reinforcement(run: JobRun, progress: Progress) -> dict:
    from ..orchestrator.train import train

    hp = run.hp
    run.root.mkdir(parents=True, exist_ok=True)
    options = {"path": _write_rows(run.root / "rft-train.jsonl", run.rows), "grader": run.grader,
               "heldout_path": _write_rows(run.root / "rft-valid.jsonl", run.valid_rows) if run.valid_rows else None}
    env = GradedEnv(GradedConfig(**options), chat=run.chat)
    start = (json.loads((run.resume / STATE).read_text()) if run.resume
             else {"step": 0, "trained_tokens": 0, "seconds": 0.0})
    job = _JobSteps(run, progress, env.tasks("train"), start)
    # resuming: the checkpoint's weights (LoRA: the base and the checkpoint's adapter) and optimizer
    lora_resume = run.resume is not None and hp.lora is not None
    cfg = TrainConfig(
        model=str(run.start_model if lora_resume or run.resume is None else run.resume), name="rft",
        run_dir=str(run.root / "runs"), seed=run.seed, env={"name": "graded", "options": options},
        sampling={"temperature": 1.0, "max_new_tokens": hp.max_new_tokens},
        grpo={"steps": job.total - job.done, "prompts_per_step": hp.batch_size, "group_size": hp.group_size,
              "lr": hp.learning_rate, "warmup_steps": min(10, job.total // 10), "betas": (0.9, 0.999),
              "lora": hp.lora},
        eval={"tasks": min(hp.eval_samples, len(env.tasks("heldout"))), "every": hp.eval_interval,
              "max_new_tokens": hp.max_new_tokens},
        init_trainer_state=str(run.resume) if run.resume else None,
        init_adapter=str(run.resume / ADAPTER_DIR) if lora_resume else None)
    try:
        summary = train(cfg, progress=False, echo=log.info, task_source=job.prompts, env=env, on_step=job.after)
    finally:
        env.close()
    base, final = summary["base"]["mean_reward"], summary["final"]["mean_reward"]
    where = "training prompts (no validation_file)" if env.heldout_is_train else "validation prompts"
    out = {"step": job.step, "trained_tokens": job.tokens, "seconds": job.seconds(),
           "message": f"Held-out mean reward {base:.3f} -> {final:.3f} on {summary['heldout_tasks']} {where}",
           "data": {"base_mean_reward": base, "final_mean_reward": final, "heldout_prompts": summary["heldout_tasks"],
                    "heldout_is_train": env.heldout_is_train}}
    if job.stopped is not None:
        return {**out, "status": job.stopped}
    return {**out, "status": "succeeded", "final": Path(summary["run_dir"]) / "checkpoint",
            "active_parameters": summary["active_parameters"]}
