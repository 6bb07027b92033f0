"""The reinforcement method of the fine-tuning API: GRPO (orchestrator.train, the same run
`gymloop train` makes) on the job's prompts, each sampled answer rewarded by the job's grader
through the `graded` environment (envs/graded.py), built from the rows in memory. Grader errors
are episode errors: counted in the job's metrics (grader_errors) and left out of training,
never a reward of 0.

Steps: ceil(prompts / batch_size) per epoch, n_epochs epochs, the prompts of a step taken in a
seeded order per epoch; group_size samples per prompt. A checkpoint (the model and the one
state format, trainer/state.py, carrying the run's and the job's progress) is written each
epoch, at the last step and when paused; a resumed job continues the run from it.
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..config import TrainConfig
from ..envs.graded import GradedConfig, GradedEnv
from ..seeds import epoch_order
from ..trainer.state import read_state
from .job import JobClock, JobRun, Progress

log = logging.getLogger(__name__)


class _JobSteps:
    """The job's side of the GRPO run: which prompts a step trains on, and after each step its
    metrics, checkpoints and whether to stop. The run's step s is the job's step s (a resumed
    job resumes the run)."""

    def __init__(self, run: JobRun, progress: Progress, tasks: list, saved: dict | None) -> None:
        self.run, self.progress, self.tasks = run, progress, tasks
        self.clock = JobClock(progress, len(tasks), run.hp, saved)
        self.stopped: str | None = None

    def prompts(self, s: int) -> list:
        """Step s (1-based): batch k of the job's epoch, in that epoch's seeded order."""
        b = self.run.hp.batch_size
        epoch, k = divmod(s - 1, self.clock.steps_per_epoch)
        return [self.tasks[i] for i in epoch_order(self.run.seed, epoch, len(self.tasks))[k * b:(k + 1) * b].tolist()]

    def after(self, s: int, m: dict, save) -> str | None:
        """orchestrator.train's StepHook: report, checkpoint (each epoch, the last step, a pause)."""
        clock = self.clock
        clock.step = s
        clock.tokens += m["trained_tokens"]
        metrics = {"step": s, "total_steps": clock.total, "train_loss": m.get("loss", 0.0),
                   "mean_reward": m["reward"], "grader_errors": m["errors"]}
        if "heldout_reward" in m:
            metrics.update(valid_mean_reward=m["heldout_reward"], valid_pass1=m["heldout_pass1"])

        def write(path: Path) -> None:
            save(path, clock.state())
        if clock.due():
            self.progress.on_checkpoint(s, metrics, write)
        self.progress.on_metrics(metrics)
        self.stopped = self.progress.should_stop()
        if self.stopped == "paused":
            self.progress.on_checkpoint(s, metrics, write)
        return self.stopped


def env_options(run: JobRun) -> dict:
    """The graded environment of a job: its rows in memory (checked at upload), its grader."""
    return {"rows": run.rows, "heldout_rows": run.valid_rows, "grader": run.grader, "label": "rft-train"}


def run_config(run: JobRun, env: GradedEnv, total: int) -> TrainConfig:
    """The GRPO run of a job: its hyper-parameters, the graded environment (its options go in the
    run's config.yaml; the environment itself is passed built), resuming from its checkpoint."""
    hp = run.hp
    return TrainConfig(
        model=str(run.start_model), name="rft", run_dir=str(run.root / "runs"), seed=run.seed,
        env={"name": "graded", "options": env_options(run)},
        sampling={"temperature": 1.0, "max_new_tokens": hp.max_new_tokens},
        grpo={"steps": total, "prompts_per_step": hp.batch_size, "group_size": hp.group_size,
              "lr": hp.learning_rate, "warmup_steps": min(10, total // 10), "betas": (0.9, 0.999),
              "lora": hp.lora, "micro_batch": hp.micro_batch_size},
        eval={"tasks": min(hp.eval_samples, len(env.tasks("heldout"))), "every": hp.eval_interval,
              "max_new_tokens": hp.max_new_tokens},
        resume_from=str(run.resume) if run.resume else None)


def train_reinforcement(run: JobRun, progress: Progress) -> dict:
    from ..orchestrator.train import train

    run.root.mkdir(parents=True, exist_ok=True)
    env = GradedEnv(GradedConfig(**env_options(run)), chat=run.chat)
    saved = read_state(run.resume)["run"].get("job") if run.resume else None
    job = _JobSteps(run, progress, env.tasks("train"), saved)
    try:
        summary = train(run_config(run, env, job.clock.total), progress=False, echo=log.info,
                        task_source=job.prompts, env=env, on_step=job.after)
    finally:
        env.close()
    base, final = summary["base"]["mean_reward"], summary["final"]["mean_reward"]
    where = "training prompts (no validation_file)" if env.heldout_is_train else "validation prompts"
    out = {**job.clock.state(),
           "message": f"Held-out mean reward {base:.3f} -> {final:.3f} on {summary['heldout_tasks']} {where}",
           "data": {"base_mean_reward": base, "final_mean_reward": final, "heldout_prompts": summary["heldout_tasks"],
                    "heldout_is_train": env.heldout_is_train}}
    if job.stopped is not None:
        return {**out, "status": job.stopped}
    return {**out, "status": "succeeded", "final": Path(summary["run_dir"]) / "checkpoint",
            "active_parameters": summary["active_parameters"]}
