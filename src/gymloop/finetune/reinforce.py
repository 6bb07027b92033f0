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


def train_reinforcement(run: JobRun, progress: Progress) -> dict:
    hp = run.hp
    run.root.mkdir(parents=True, exist_ok=True)
    options = {"path": _write_rows(run.root / "rft-train.jsonl", run.rows), "grader": run.grader,
               "heldout_path": _write_rows(run.root / "rft-valid.jsonl", run.valid_rows) if run.valid_rows else None}
    env = GradedEnv(GradedConfig(**options), chat=run.chat)
    start = json.loads((run.resume / STATE).read_text()) if run.resume else {"step": 0, "trained_tokens": 0,
                                                                              "seconds": 0.0}
    done = start["step"]
    tasks = env.tasks("train")
    steps_per_epoch = math.ceil(len(tasks) / hp.batch_size)
    total = steps_per_epoch * hp.n_epochs
    every = progress.checkpoint_every or steps_per_epoch
    tokens, t0 = [start["trained_tokens"]], time.perf_counter()

    def task_source(s: int) -> list:
        """The prompts of this run's step s (1-based), which is the job's step done + s."""
        epoch, k = divmod(done + s - 1, steps_per_epoch)
        order = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(run.seed * 1000 + epoch))
        return [tasks[i] for i in order[k * hp.batch_size:(k + 1) * hp.batch_size].tolist()]

    def seconds() -> float:
        return start["seconds"] + time.perf_counter() - t0

    def on_step(s: int, m: dict, save) -> str | None:
        step = done + s
        tokens[0] += m["trained_tokens"]
        metrics = {"step": step, "total_steps": total, "train_loss": m.get("loss", 0.0), "mean_reward": m["reward"],
                   "grader_errors": m["errors"]}
        if "heldout_reward" in m:
            metrics.update(valid_mean_reward=m["heldout_reward"], valid_pass1=m["heldout_pass1"])

        def write(path: Path) -> None:
            save(str(path))
            (path / STATE).write_text(json.dumps({"step": step, "trained_tokens": tokens[0], "seconds": seconds()}))
        if step % every == 0 or step == total:
            progress.on_checkpoint(step, metrics, write)
        progress.on_metrics(metrics)
        stop = progress.should_stop()
        if stop == "paused":
            progress.on_checkpoint(step, metrics, write)
        last[0] = step
        return stop

    last = [done]
    # resuming: the checkpoint's weights (LoRA: the base and the checkpoint's adapter) and optimizer
    lora_resume = run.resume is not None and hp.lora is not None
    cfg = TrainConfig(
        model=str(run.start_model if lora_resume or run.resume is None else run.resume), name="rft",
        run_dir=str(run.root / "runs"), seed=run.seed, env={"name": "graded", "options": options},
        sampling={"temperature": 1.0, "max_new_tokens": hp.max_new_tokens},
        grpo={"steps": total - done, "prompts_per_step": hp.batch_size, "group_size": hp.group_size,
              "lr": hp.learning_rate, "warmup_steps": min(10, total // 10), "betas": (0.9, 0.999), "lora": hp.lora},
        eval={"tasks": min(hp.eval_samples, len(env.tasks("heldout"))), "every": hp.eval_interval,
              "max_new_tokens": hp.max_new_tokens},
        init_trainer_state=str(run.resume) if run.resume else None,
        init_adapter=str(run.resume / ADAPTER_DIR) if lora_resume else None)
    from ..orchestrator.train import train

    stop: list[str | None] = [None]

    def hook(s, m, save):
        stop[0] = on_step(s, m, save)
        return stop[0]
    try:
        summary = train(cfg, progress=False, echo=log.info, task_source=task_source, env=env, on_step=hook)
    finally:
        env.close()
    out = {"step": last[0], "trained_tokens": tokens[0], "seconds": seconds(),
           "message": (f"Held-out mean reward {summary['base']['mean_reward']:.3f} -> "
                       f"{summary['final']['mean_reward']:.3f} on {summary['heldout_tasks']} "
                       + ("training prompts (no validation_file)" if env.heldout_is_train else "validation prompts")),
           "data": {"base_mean_reward": summary["base"]["mean_reward"], "final_mean_reward": summary["final"]["mean_reward"],
                    "heldout_prompts": summary["heldout_tasks"], "heldout_is_train": env.heldout_is_train}}
    if stop[0] is not None:
        return {**out, "status": stop[0]}
    return {**out, "status": "succeeded", "final": Path(summary["run_dir"]) / "checkpoint",
            "active_parameters": summary["active_parameters"]}
