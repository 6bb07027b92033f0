"""A fine-tuning job as a method sees it: its hyper-parameters ("auto" resolved), what it
trains from (JobRun) and how it reports (Progress)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..algorithms.dpo import DPOLoss
from ..models import lora


@dataclass
class Hyper:
    """Resolved hyper-parameters ("auto" replaced by a number)."""

    n_epochs: int
    batch_size: int
    learning_rate: float
    learning_rate_multiplier: float = 1.0  # what the job was given (or "auto" chose); the rate is this x base_rate
    beta: float = 0.1
    length_normalize: bool = False
    reference_free: bool = False
    sft_weight: float = 0.0
    lora: dict | None = None              # LoraOptions as a dict, or None: every weight trains
    group_size: int = 8                   # reinforcement: samples per prompt
    max_new_tokens: int = 16              # reinforcement: most tokens per sampled answer (auto: AUTO_ANSWER_TOKENS)
    eval_interval: int = 0                # reinforcement: steps between held-out evaluations (0: at the end)
    eval_samples: int = 100               # reinforcement: held-out prompts evaluated
    micro_batch_size: int = 0             # supervised, reinforcement: rows per forward/backward (0: all at once)

    @property
    def compute_multiplier(self) -> float:
        """OpenAI's name for what group_size measures: samples per prompt over 8."""
        return self.group_size / 8

    def public(self, method: str) -> dict:
        """As the job object reports them (OpenAI's names: a multiplier, not a rate)."""
        out = {"n_epochs": self.n_epochs, "batch_size": self.batch_size,
               "learning_rate_multiplier": self.learning_rate_multiplier,
               **{f: getattr(self, f) for f in METHOD_HYPER[method].fields}}
        if self.lora is not None:
            out["lora"] = self.lora
        return out


BASE_LR = 1e-3           # learning_rate_multiplier 1 of a nano-sized model (up to SMALL_MODEL parameters)
SMALL_MODEL = 1_000_000
LORA_SCALE = 10.0        # LoRA's adapters start at zero and hold few weights: they take a larger step


# auto max_new_tokens of a reinforcement job, by whether the model is nano-sized: nano answers
# its arithmetic in a few tokens; a real model's answer is a sentence or a tool call (a SmolLM2
# call of the calls environment is ~25-40 tokens: 16 cut every one short and scored 0). A sample
# ends at the model's end of turn, so the bound costs only answers that run on.
AUTO_ANSWER_TOKENS = {True: 16, False: 128}


def base_rate(n_params: int | None, lora: bool) -> float:
    """The learning rate of multiplier 1 for a model of `n_params` parameters (None: nano-sized).

    Full fine-tuning: BASE_LR up to SMALL_MODEL parameters, then falling with the square root of
    the size (SmolLM2-135M: 8.6e-5; a 7B model: 1.2e-5), near the rates published fine-tunes of
    those sizes use. LoRA: LORA_SCALE times that, at most BASE_LR (SmolLM2-135M: 8.6e-4; 7B: 1.2e-4).
    """
    full = BASE_LR * min(1.0, (SMALL_MODEL / n_params) ** 0.5) if n_params else BASE_LR
    return min(BASE_LR, LORA_SCALE * full) if lora else full


Pick = Callable[[str, object], object]      # pick(name, auto value) -> the given value, or the auto one


def _dpo(h: Hyper, pick: Pick, given: dict) -> None:
    h.beta = float(pick("beta", 0.1))
    h.length_normalize = bool(given.get("length_normalize", False))
    h.reference_free = bool(given.get("reference_free", False))
    # auto: RPO's NLL anchor on the preferred answer. Plain DPO (0) only widens the margin, and on
    # nano it did so by lowering both answers' likelihood: held-out accuracy fell below the base's
    # (28.0% -> 12.7% and 44.7% -> 22.0% on bases of seeds 0 and 1, bench/results/learning/finetune_api-auto/).
    h.sft_weight = float(pick("sft_weight", 1.0))
    DPOLoss(h.beta, h.length_normalize, h.reference_free, h.sft_weight)      # validates


def _micro_batch(h: Hyper, pick: Pick, given: dict) -> None:
    h.micro_batch_size = int(pick("micro_batch_size", h.micro_batch_size))


def _reinforcement(h: Hyper, pick: Pick, given: dict) -> None:
    h.group_size = int(pick("group_size", max(2, round(8 * float(pick("compute_multiplier", 1.0))))))
    h.max_new_tokens = int(pick("max_new_tokens", h.max_new_tokens))
    h.eval_interval = int(pick("eval_interval", 0))
    h.eval_samples = int(pick("eval_samples", 100))
    _micro_batch(h, pick, given)
    if h.group_size < 2:
        raise ValueError("reinforcement needs group_size >= 2 (advantages compare a prompt's samples)")


def _epochs(n_examples: int) -> int:
    """Auto epochs of SFT and RFT: 3 over 100 examples or more, 5 over fewer."""
    return 3 if n_examples >= 100 else 5


def _one_epoch(n_examples: int) -> int:
    """Auto epochs of DPO: each pair once. A pair seen again is fitted by widening its margin,
    and on pairs that differ in a few tokens the margin widens by lowering what both answers
    share: SmolLM2's DPO job on 50 tool-call pairs (5 epochs) held its held-out validity after
    epoch 1 (92% of 60 requests, correct 63% -> 67%) and lost it by epoch 5 (68%, correct 55%)."""
    return 1


@dataclass(frozen=True)
class MethodHyper:
    """A method's own hyper-parameters: its "auto" learning-rate multiplier and epochs (of the
    number of examples), the fields it adds to the common ones (reported as given), and how it
    resolves them."""

    auto_lr: float
    fields: tuple[str, ...] = ()
    resolve: Callable[[Hyper, Pick, dict], None] | None = None
    auto_epochs: Callable[[int], int] = _epochs


# "auto" learning rates: SFT at BASE_LR, DPO at a tenth of it, GRPO at a fifth (the demo's 2e-4)
METHOD_HYPER = {
    "supervised": MethodHyper(1.0, ("micro_batch_size",), _micro_batch),
    "dpo": MethodHyper(0.1, ("beta", "length_normalize", "reference_free", "sft_weight"), _dpo, _one_epoch),
    "reinforcement": MethodHyper(0.2, ("compute_multiplier", "group_size", "max_new_tokens", "eval_interval",
                                       "eval_samples", "micro_batch_size"), _reinforcement),
}


def resolve(method: str, given: dict, n_examples: int, n_params: int | None = None) -> Hyper:
    """Hyper-parameters of a job: "auto" (or absent) -> defaults that suit the data size (batch
    and epochs) and the model (the learning rate: its size, LoRA or not; see base_rate)."""
    def pick(name, auto):
        v = given.get(name, "auto")
        return auto if v == "auto" or v is None else v
    spec = METHOD_HYPER[method]
    batch = int(pick("batch_size", max(1, min(32, n_examples // 10))))
    epochs = int(pick("n_epochs", spec.auto_epochs(n_examples)))
    multiplier = float(pick("learning_rate_multiplier", spec.auto_lr))
    if batch < 1 or epochs < 1 or multiplier <= 0:
        raise ValueError("batch_size and n_epochs must be >= 1 and learning_rate_multiplier > 0")
    lr = base_rate(n_params, given.get("lora") is not None) * multiplier
    small = (n_params or 0) <= SMALL_MODEL
    h = Hyper(n_epochs=epochs, batch_size=batch, learning_rate=lr, learning_rate_multiplier=multiplier,
              # a real model's activations are large: a SmolLM2 SFT step of 20 tool-call rows (~400 tokens)
              # peaks at 12.5 GB resident in one pass, 4.8 GB in parts of 4 (bench/results/training/sft_memory/);
              # RFT's 32 answers in one pass took 24 GB
              micro_batch_size=0 if small else 4,
              max_new_tokens=AUTO_ANSWER_TOKENS[small])
    if given.get("lora") is not None:
        h.lora = lora.LoraOptions(**given["lora"]).model_dump()
    if spec.resolve is not None:
        spec.resolve(h, pick, given)
    return h


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


class JobClock:
    """A job's progress over all its runs (a resumed job goes on counting): steps, trained
    tokens and seconds, kept in each checkpoint's state; when a checkpoint is due."""

    def __init__(self, progress: Progress, examples: int, hp: Hyper, saved: dict | None) -> None:
        saved = saved or {}
        self.step = saved.get("step", 0)
        self.tokens = saved.get("trained_tokens", 0)
        self.seconds0, self.t0 = saved.get("seconds", 0.0), time.perf_counter()
        self.steps_per_epoch = -(-examples // hp.batch_size)          # the last batch may be short
        self.total = self.steps_per_epoch * hp.n_epochs
        self.every = progress.checkpoint_every or self.steps_per_epoch

    def seconds(self) -> float:
        return self.seconds0 + time.perf_counter() - self.t0

    def due(self) -> bool:
        """A checkpoint after this step: every `checkpoint_every` steps (default: each epoch) and the last."""
        return self.step % self.every == 0 or self.step == self.total

    def state(self) -> dict:
        return {"step": self.step, "trained_tokens": self.tokens, "seconds": self.seconds()}

    def result(self, status: str) -> dict:
        return {"status": status, **self.state()}
