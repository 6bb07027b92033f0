"""What a fine-tuning job trains: one function per method (METHODS), each from a JobRun (the
weights to start from, the checkpoint to resume, the rows, the hyper-parameters) to a result,
reporting metrics and checkpoints through Progress until done, cancelled or paused.

    supervised     NLL on assistant tokens (weight 0 messages excluded)      algorithms/sft.py
    dpo            DPO on (input, preferred, non-preferred), the reference's
                   log-probs computed once before the first step             algorithms/dpo.py
    reinforcement  GRPO on the prompts, rewards from the job's grader        finetune/reinforce.py

Any method trains LoRA adapters instead of every weight with hyperparameters.lora (models/lora.py).
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from ..algorithms.dpo import DPOLoss, sequence_logps
from ..algorithms.sft import sft_loss
from ..algorithms.table import Table
from ..engine.gemm import route_linears
from ..models.chat import ChatTokenizer
from ..models.checkpoint import load_model, save_model
from ..models.parameters import count_parameters
from ..trainer.logprobs import CompletionLogprobs, TokenBatch, logprobs_and_aux
from ..trainer.trainer import lr_factor, optimizer_step
from ..models import lora


@dataclass
class Hyper:
    """Resolved hyper-parameters ("auto" replaced by a number)."""

    n_epochs: int
    batch_size: int
    learning_rate: float
    beta: float = 0.1
    length_normalize: bool = False
    reference_free: bool = False
    sft_weight: float = 0.0
    lora: dict | None = None              # LoraOptions as a dict, or None: every weight trains
    group_size: int = 8                   # reinforcement: samples per prompt
    max_new_tokens: int = 16              # reinforcement: most tokens per sampled answer
    eval_interval: int = 0                # reinforcement: steps between held-out evaluations (0: at the end)
    eval_samples: int = 100               # reinforcement: held-out prompts evaluated

    def public(self, method: str) -> dict:
        """As the job object reports them (OpenAI's names: a multiplier, not a rate)."""
        out = {"n_epochs": self.n_epochs, "batch_size": self.batch_size,
               "learning_rate_multiplier": self.learning_rate / BASE_LR}
        if method == "dpo":
            out.update(beta=self.beta, length_normalize=self.length_normalize,
                       reference_free=self.reference_free, sft_weight=self.sft_weight)
        if method == "reinforcement":
            out.update(compute_multiplier=self.group_size / 8, group_size=self.group_size,
                       max_new_tokens=self.max_new_tokens, eval_interval=self.eval_interval,
                       eval_samples=self.eval_samples)
        if self.lora is not None:
            out["lora"] = self.lora
        return out


BASE_LR = 1e-3           # learning_rate_multiplier 1 (nano-sized models; pass a multiplier for others)
# "auto" learning-rate multipliers: SFT at BASE_LR, DPO at a tenth of it, GRPO at a fifth (the demo's 2e-4)
AUTO_LR = {"supervised": 1.0, "dpo": 0.1, "reinforcement": 0.2}


def resolve(method: str, given: dict, n_examples: int) -> Hyper:
    """Hyper-parameters of a job: "auto" (or absent) -> defaults that suit the data size."""
    def pick(name, auto):
        v = given.get(name, "auto")
        return auto if v == "auto" or v is None else v
    batch = int(pick("batch_size", max(1, min(32, n_examples // 10))))
    epochs = int(pick("n_epochs", 3 if n_examples >= 100 else 5))
    lr = BASE_LR * float(pick("learning_rate_multiplier", AUTO_LR[method]))
    if batch < 1 or epochs < 1 or lr <= 0:
        raise ValueError("batch_size and n_epochs must be >= 1 and learning_rate_multiplier > 0")
    h = Hyper(n_epochs=epochs, batch_size=batch, learning_rate=lr)
    if given.get("lora") is not None:
        h.lora = lora.LoraOptions(**given["lora"]).model_dump()
    if method == "reinforcement":
        h.group_size = max(2, round(8 * float(pick("compute_multiplier", 1.0))))
        h.group_size = int(pick("group_size", h.group_size))
        h.max_new_tokens = int(pick("max_new_tokens", 16))
        h.eval_interval = int(pick("eval_interval", 0))
        h.eval_samples = int(pick("eval_samples", 100))
        if h.group_size < 2:
            raise ValueError("reinforcement needs group_size >= 2 (advantages compare a prompt's samples)")
    if method == "dpo":
        h.beta = float(pick("beta", 0.1))
        h.length_normalize = bool(given.get("length_normalize", False))
        h.reference_free = bool(given.get("reference_free", False))
        h.sft_weight = float(pick("sft_weight", 0.0))
        DPOLoss(h.beta, h.length_normalize, h.reference_free, h.sft_weight)      # validates
    return h


# --- examples as token ids ---------------------------------------------------------------
def sft_example(tok: ChatTokenizer, row: dict) -> tuple[list[int], list[int]]:
    """(ids, mask): the conversation, 1 on tokens of assistant messages whose weight is not 0."""
    msgs = [{k: v for k, v in m.items() if k != "weight"} for m in row["messages"]]
    ids, mask = tok.sft_ids(msgs, tools=row.get("tools"))
    if any(m.get("weight", 1) == 0 for m in row["messages"]):
        mask = _zero_weighted(tok, row, ids, mask)
    return ids, mask


def _zero_weighted(tok: ChatTokenizer, row: dict, ids: list[int], mask: list[int]) -> list[int]:
    """Clear the mask of assistant messages with weight 0 (rendered prefix by prefix)."""
    msgs = [{k: v for k, v in m.items() if k != "weight"} for m in row["messages"]]
    out = list(mask)
    for i, m in enumerate(row["messages"]):
        if m["role"] == "assistant" and m.get("weight", 1) == 0:
            start = len(tok.prompt_ids(msgs[:i], tools=row.get("tools")))
            end = len(tok.encode(tok.render(msgs[:i + 1], add_generation_prompt=False, tools=row.get("tools"))))
            out[start:end] = [0] * (end - start)
    return out


def completion_example(tok: ChatTokenizer, messages: list[dict], completion: list[dict],
                       tools: list | None) -> tuple[list[int], list[int]]:
    """(ids, mask) of a prompt and a completion of it, 1 on the completion's tokens only."""
    prompt = tok.prompt_ids(messages, tools=tools)
    full = tok.encode(tok.render(list(messages) + list(completion), add_generation_prompt=False, tools=tools))
    if full[:len(prompt)] != prompt:
        raise ValueError("chat template does not render prefixes as prefixes")
    return full, [0] * len(prompt) + [1] * (len(full) - len(prompt))


def _logprobs(score: CompletionLogprobs, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp [N, L] of the trained tokens, an MoE router's aux loss or None): packed rows or the
    shared prefix run once and only trained positions are projected onto the vocabulary
    (trainer/logprobs.CompletionLogprobs, built once per job); MoE models take the full path with
    their router loss."""
    if score.moe:
        return logprobs_and_aux(score.model, batch)
    return score(batch), None


@dataclass
class Examples:
    """A job's token examples as one right-padded matrix, built once, so a step only indexes it:
    ids [N, L] (pad_id past each row's end), mask [N, L] (1 on trained tokens; 0 at position 0,
    which nothing predicts), lens [N]."""

    ids: torch.Tensor
    mask: torch.Tensor
    lens: torch.Tensor

    @classmethod
    def of(cls, examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> "Examples":
        ids = [torch.as_tensor(e[0], dtype=torch.long) for e in examples]
        if not ids:
            return cls(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))
        mask = pad_sequence([torch.as_tensor(e[1], dtype=torch.float32) for e in examples], batch_first=True)
        mask[:, 0] = 0
        return cls(pad_sequence(ids, batch_first=True, padding_value=pad_id), mask, torch.tensor([len(i) for i in ids]))

    def __len__(self) -> int:
        return len(self.lens)

    def batch(self, idx: Sequence[int] | torch.Tensor) -> TokenBatch:
        """Rows `idx` as a TokenBatch [len(idx), the longest of them]."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        lens = self.lens[idx]
        width = int(lens.max())
        mask = self.mask[idx, :width]
        att = (torch.arange(width) < lens[:, None]).long()
        return TokenBatch(self.ids[idx, :width], att, mask, torch.zeros_like(mask))


# --- the loop ----------------------------------------------------------------------------
@dataclass
class Progress:
    """What a job reports as it goes (events, checkpoints), and whether it should stop.
    on_checkpoint(step, metrics, write): `write(path)` writes the checkpoint's files there (the
    model, and what resuming needs); the worker records it once written."""

    on_metrics: Callable[[dict], None]
    on_checkpoint: Callable[[int, dict, Callable[[Path], None]], None]
    should_stop: Callable[[], str | None]                      # "cancelled" / "paused" / None
    checkpoint_every: int = 0                                  # 0: one per epoch


@dataclass
class JobRun:
    """What a method trains from: the weights of the job's `model`, the newest checkpoint of this
    job when it resumes, its rows, hyper-parameters and seed, and its directory."""

    start_model: Path
    resume: Path | None
    rows: list[dict]
    valid_rows: list[dict] | None
    hp: Hyper
    seed: int
    root: Path
    grader: dict | None = None                 # reinforcement
    chat: Callable | None = None               # reinforcement: score_model graders' model calls


# Every method returns {"status": "succeeded" | "cancelled" | "paused" | "shutdown", "step",
# "trained_tokens", "seconds", and when succeeded "final" (the trained model's directory) and
# "active_parameters" (what the trained tokens' FLOPs count)}.
STATE_FILE = "ft_state.pt"


def _write_checkpoint(model, tok, path: Path, extra: dict, state: dict | None) -> None:
    """The model directory (LoRA: merged, its adapter in adapter/) and the resume state."""
    save_model(model, tok, path, extra=extra)
    if state is not None:
        save_state(path / STATE_FILE, state)


def _examples(method: str, tok: ChatTokenizer, rows: list[dict]) -> Examples:
    """supervised: a row per example; dpo: the N preferred answers, then the N non-preferred
    (pair i is rows i and N + i)."""
    if method == "supervised":
        return Examples.of([sft_example(tok, r) for r in rows], tok.pad_token_id)
    sides = [[completion_example(tok, r["input"]["messages"], r[key], r["input"].get("tools")) for r in rows]
             for key in ("preferred_output", "non_preferred_output")]
    return Examples.of(sides[0] + sides[1], tok.pad_token_id)


def train_tokens(method: str, run: JobRun, progress: Progress) -> dict:
    """supervised and dpo: minibatches of the examples, n_epochs passes in a seeded order, a
    checkpoint every `checkpoint_every` steps (default: each epoch); resumable from any of them."""
    hp = run.hp
    start = torch.load(run.resume / STATE_FILE, weights_only=False) if run.resume else None
    # LoRA resumes from the base and the checkpoint's adapter; otherwise from the checkpoint's weights
    model, tok = load_model(run.start_model if (hp.lora or not run.resume) else run.resume)
    if hp.lora:
        model = lora.wrap(model, hp.lora, run.resume / lora.ADAPTER_DIR if run.resume else None)
    route_linears(model)                        # models that run their own forward (LoRA, MoE): engine/gemm.py
    score = CompletionLogprobs(model)
    examples = _examples(method, tok, run.rows)
    valid = _examples(method, tok, run.valid_rows) if method == "supervised" and run.valid_rows else None
    n = len(run.rows)                                     # examples (dpo: pairs) per epoch
    ref = None
    if method == "dpo":
        loss_fn = DPOLoss(hp.beta, hp.length_normalize, hp.reference_free, hp.sft_weight)
        # the reference is the model before the first step: kept in the state, not recomputed on resume
        ref = start["reference"] if start else (None if hp.reference_free else _reference_logps(score, examples, hp))
    steps_per_epoch = math.ceil(n / hp.batch_size)
    total = steps_per_epoch * hp.n_epochs
    trainable = [p for p in model.parameters() if p.requires_grad]
    # the fused kernel (one call for every tensor) where torch has one: AdamW 2.8 -> 1.1 ms of a 17 ms nano step
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=hp.learning_rate, weight_decay=0.0, betas=(0.9, 0.999), fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup_steps=min(10, total // 10),
                                                                     decay_steps=total, min_ratio=0.1))
    step, tokens, seconds = 0, 0, 0.0
    if start:
        opt.load_state_dict(start["optimizer"])
        sched.load_state_dict(start["scheduler"])
        step, tokens, seconds = start["step"], start["trained_tokens"], start["seconds"]
    every = progress.checkpoint_every or steps_per_epoch
    model.train()
    t0 = time.perf_counter()

    def state() -> dict:
        return {"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "reference": ref,
                "trained_tokens": tokens, "seconds": seconds + time.perf_counter() - t0}

    def write(path: Path) -> None:
        _write_checkpoint(model, tok, path, {"step": step}, state())

    def result(status: str) -> dict:
        model.eval()
        return {"status": status, "step": step, "trained_tokens": tokens, "seconds": state()["seconds"]}

    @functools.lru_cache(maxsize=1)
    def epoch_order(epoch: int) -> torch.Tensor:
        """The examples in this epoch's order (seeded: a resumed job draws the same)."""
        return torch.randperm(n, generator=torch.Generator().manual_seed(run.seed * 1000 + epoch))

    while step < total:
        stop = progress.should_stop()
        if stop is not None:
            if stop == "paused":
                progress.on_checkpoint(step, {"step": step}, write)
            return result(stop)
        epoch, k = divmod(step, steps_per_epoch)
        idx = epoch_order(epoch)[k * hp.batch_size:(k + 1) * hp.batch_size]
        if method == "supervised":
            batch = examples.batch(idx)
            logp, aux = _logprobs(score, batch)
            loss, m = sft_loss(logp, batch.loss_mask)
            metrics = {"train_loss": m["nll"]}
        else:
            batch = examples.batch(torch.cat((idx, idx + n)))
            logp, aux = _logprobs(score, batch)
            seq = sequence_logps(logp, batch.loss_mask, hp.length_normalize)
            c, r = seq[:len(idx)], seq[len(idx):]
            nll = -(logp * batch.loss_mask).sum(-1)[:len(idx)] / batch.loss_mask[:len(idx)].sum(-1).clamp(min=1)
            loss, m = loss_fn(c, r, None if ref is None else ref[0][idx], None if ref is None else ref[1][idx], nll)
            metrics = {"train_loss": m["loss"], "reward_margin": m["reward_margin"],
                       "reward_accuracy": m["reward_accuracy"]}
        if aux is not None:
            loss = loss + aux
        optimizer_step(model, opt, sched, loss, 1.0)
        step += 1
        tokens += int(batch.attention_mask.sum())
        metrics.update(step=step, total_steps=total, learning_rate=sched.get_last_lr()[0], trained_tokens=tokens)
        if step % every == 0 or step == total:
            if valid is not None:
                metrics["valid_loss"] = _mean_nll(score, valid, hp.batch_size)
            progress.on_checkpoint(step, metrics, write)
        progress.on_metrics(metrics)
    out = result("succeeded")
    _write_checkpoint(model, tok, run.root / "final", {"step": step}, None)
    # what a trained token passes through (MoE: the top-k experts; LoRA: the base and its adapters)
    return {**out, "final": run.root / "final", "active_parameters": count_parameters(model)[1]}


def _reinforcement(run: JobRun, progress: Progress) -> dict:
    from .reinforce import train_reinforcement

    return train_reinforcement(run, progress)


METHODS: Table[Callable[[JobRun, Progress], dict]] = Table("fine-tuning method", {
    "supervised": (lambda run, p: train_tokens("supervised", run, p), "NLL on the assistant turns"),
    "dpo": (lambda run, p: train_tokens("dpo", run, p), "DPO on preferred / non-preferred answers"),
    "reinforcement": (_reinforcement, "GRPO on the prompts, rewarded by the job's grader"),
})


@torch.no_grad()
def _reference_logps(score: CompletionLogprobs, examples: Examples, hp: Hyper) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen reference (the model before the first step) on every pair: [P] chosen, [P] rejected.
    Computed once, so no second model is kept in memory."""
    model = score.model
    model.eval()
    out = ([], [])
    n = len(examples) // 2
    for i in range(0, n, hp.batch_size):
        for side in (0, 1):
            b = examples.batch(torch.arange(i, min(i + hp.batch_size, n)) + side * n)
            out[side].append(sequence_logps(_logprobs(score, b)[0], b.loss_mask, hp.length_normalize))
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
        lp = _logprobs(score, b)[0]
        total += float(-(lp * b.loss_mask).sum())
        n += float(b.loss_mask.sum())
    model.train(was)
    return total / max(n, 1.0)


def save_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)                      # a crash mid-write leaves the previous state whole
