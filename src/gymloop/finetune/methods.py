"""What a fine-tuning job trains: one function per method (METHODS), each from a JobRun (the
weights to start from, the checkpoint to resume, the rows, the hyper-parameters) to a result,
reporting metrics and checkpoints through Progress until done, cancelled or paused.

    supervised     NLL on assistant tokens (weight 0 messages excluded)      trainer/objectives.TokenNLL
    dpo            DPO on (input, preferred, non-preferred), the reference's
                   log-probs computed once before the first step             trainer/objectives.Preference
    reinforcement  GRPO on the prompts, rewards from the job's grader        finetune/reinforce.py

Every method trains through trainer.Trainer and checkpoints trainer/state.py's one state
format. Any method trains LoRA adapters instead of every weight with hyperparameters.lora.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..algorithms.dpo import DPOLoss, sequence_logps
from ..algorithms.table import Table
from ..models.chat import ChatTokenizer
from ..models.checkpoint import load_model, save_model
from ..models.parameters import count_parameters
from ..models import lora
from ..seeds import epoch_order
from ..trainer.logprobs import CompletionLogprobs, TokenBatch
from ..trainer.objectives import Objective, Preference, TokenNLL, completion_logps
from ..trainer.state import read_state
from ..trainer.trainer import Trainer
from .examples import Examples, preference_examples, sft_examples
from .job import Hyper, JobClock, JobRun, Progress  # noqa: F401  (Hyper: what a caller builds a JobRun with)
from .reinforce import train_reinforcement

# Every method returns {"status": "succeeded" | "cancelled" | "paused" | "shutdown", "step",
# "trained_tokens", "seconds", and when succeeded "final" (the trained model's directory) and
# "active_parameters" (what the trained tokens' FLOPs count)}.


@dataclass
class TokenJob:
    """A supervised or DPO job being trained: the model, its trainer, the examples, the clock."""

    kind: "TokenMethod"
    run: JobRun
    model: torch.nn.Module
    tok: ChatTokenizer
    trainer: Trainer
    score: CompletionLogprobs
    examples: Examples
    valid: Examples | None
    clock: JobClock
    dpo: DPOLoss | None = None
    reference: tuple[torch.Tensor, torch.Tensor] | None = None    # DPO: [P] chosen, [P] rejected

    def write(self, path: Path) -> None:
        """The model directory (LoRA: merged, its adapter in adapter/) and the one state format."""
        save_model(self.model, self.tok, path, extra={"step": self.clock.step})
        self.trainer.save_state(path, run={**self.clock.state(), "reference": self.reference})


class Supervised:
    """SFT: a row per example, the NLL of its assistant tokens; a validation file's loss at checkpoints."""

    examples = staticmethod(sft_examples)

    def prepare(self, job: TokenJob, saved: dict | None) -> None:
        if job.run.valid_rows:
            job.valid = sft_examples(job.tok, job.run.valid_rows)

    def step_batch(self, job: TokenJob, idx: torch.Tensor) -> tuple[TokenBatch, Objective]:
        return job.examples.batch(idx), TokenNLL(job.score)


class Preferences:
    """DPO: pair i is example i (preferred) and N + i (not); the reference's log-probs are taken
    once before the first step and kept in the state, not recomputed on resume."""

    examples = staticmethod(preference_examples)

    def prepare(self, job: TokenJob, saved: dict | None) -> None:
        hp = job.run.hp
        job.dpo = DPOLoss(hp.beta, hp.length_normalize, hp.reference_free, hp.sft_weight)
        job.reference = saved["run"]["reference"] if saved else (
            None if hp.reference_free else _reference_logps(job.score, job.examples, hp.batch_size, hp.length_normalize))

    def step_batch(self, job: TokenJob, idx: torch.Tensor) -> tuple[TokenBatch, Objective]:
        ref = job.reference
        batch = job.examples.batch(torch.cat((idx, idx + len(job.run.rows))))
        return batch, Preference(job.dpo, job.score, None if ref is None else ref[0][idx],
                                 None if ref is None else ref[1][idx])


TokenMethod = Supervised | Preferences
TOKEN_METHODS: dict[str, TokenMethod] = {"supervised": Supervised(), "dpo": Preferences()}


def _open(method: str, run: JobRun, progress: Progress) -> TokenJob:
    """Load the model (resuming: the checkpoint's weights, LoRA: the base and its adapter), the
    trainer (resuming: its state), the examples and what the method prepares."""
    hp, kind = run.hp, TOKEN_METHODS[method]
    model, tok = load_model(run.start_model if (hp.lora or not run.resume) else run.resume)
    if hp.lora:
        model = lora.wrap(model, hp.lora, run.resume / lora.ADAPTER_DIR if run.resume else None)
    saved = read_state(run.resume) if run.resume else None
    clock = JobClock(progress, len(run.rows), hp, saved and saved["run"])
    # the fused kernel: AdamW 2.8 -> 1.1 ms of a 17 ms nano step
    trainer = Trainer(model, hp.learning_rate, betas=(0.9, 0.999), warmup_steps=min(10, clock.total // 10),
                      decay_steps=clock.total, min_lr_ratio=0.1, max_grad_norm=1.0, fused=True,
                      micro_batch=hp.micro_batch_size)      # SFT's rows in parts; DPO's pairs stay whole
    if saved:
        trainer.set_state(saved, rng=True)
    job = TokenJob(kind, run, model, tok, trainer, CompletionLogprobs(model), kind.examples(tok, run.rows), None, clock)
    kind.prepare(job, saved)
    return job


def _step(job: TokenJob) -> dict:
    """One optimizer step on the clock's next batch of the epoch's seeded order; its metrics."""
    hp = job.run.hp
    epoch, k = divmod(job.clock.step, job.clock.steps_per_epoch)
    idx = epoch_order(job.run.seed, epoch, len(job.run.rows))[k * hp.batch_size:(k + 1) * hp.batch_size]
    batch, objective = job.kind.step_batch(job, idx)
    m = job.trainer.step(batch, objective)          # the model stays in train mode (set by train_tokens)
    job.clock.step += 1
    job.clock.tokens += int(batch.attention_mask.sum())
    m.pop("grad_norm", None)
    m.pop("router_aux_loss", None)
    return {**m, "step": job.clock.step, "total_steps": job.clock.total, "learning_rate": job.trainer.learning_rate,
            "trained_tokens": job.clock.tokens}


def train_tokens(method: str, run: JobRun, progress: Progress) -> dict:
    """supervised and dpo: minibatches of the examples, n_epochs passes in a seeded order, a
    checkpoint every `checkpoint_every` steps (default: each epoch); resumable from any of them."""
    job = _open(method, run, progress)
    job.model.train()
    clock = job.clock
    while clock.step < clock.total:
        stop = progress.should_stop()
        if stop is not None:
            if stop == "paused":
                progress.on_checkpoint(clock.step, {"step": clock.step}, job.write)
            job.model.eval()
            return clock.result(stop)
        metrics = _step(job)
        if clock.due():
            if job.valid is not None:
                metrics["valid_loss"] = _mean_nll(job.score, job.valid, run.hp.batch_size)
            progress.on_checkpoint(clock.step, metrics, job.write)
        progress.on_metrics(metrics)
    job.model.eval()
    out = clock.result("succeeded")
    save_model(job.model, job.tok, run.root / "final", extra={"step": clock.step})
    # what a trained token passes through (MoE: the top-k experts; LoRA: the base and its adapters)
    return {**out, "final": run.root / "final", "active_parameters": count_parameters(job.model)[1]}


METHODS: Table[Callable[[JobRun, Progress], dict]] = Table("fine-tuning method", {
    "supervised": (functools.partial(train_tokens, "supervised"), "NLL on the assistant turns"),
    "dpo": (functools.partial(train_tokens, "dpo"), "DPO on preferred / non-preferred answers"),
    "reinforcement": (train_reinforcement, "GRPO on the prompts, rewarded by the job's grader"),
})


@torch.no_grad()
def _reference_logps(score: CompletionLogprobs, examples: Examples, batch_size: int,
                     length_normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen reference (the model before the first step) on every pair: [P] chosen, [P] rejected.
    Computed once, so no second model is kept in memory."""
    model = score.model
    model.eval()
    out = ([], [])
    n = len(examples) // 2
    for i in range(0, n, batch_size):
        for side in (0, 1):
            b = examples.batch(torch.arange(i, min(i + batch_size, n)) + side * n)
            out[side].append(sequence_logps(completion_logps(score, b)[0], b.loss_mask, length_normalize))
    model.train()
    return torch.cat(out[0]), torch.cat(out[1])


@torch.no_grad()
def _mean_nll(score: CompletionLogprobs, examples: Examples, batch_size: int) -> float:
    model = score.model
    was = model.training
    model.eval()
    total, n = 0.0, 0.0
    for i in range(0, len(examples), batch_size):
        b = examples.batch(torch.arange(i, min(i + batch_size, len(examples))))
        lp = completion_logps(score, b)[0]
        total += float(-(lp * b.loss_mask).sum())
        n += float(b.loss_mask.sum())
    model.train(was)
    return total / max(n, 1.0)
