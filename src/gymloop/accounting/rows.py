"""The only writer of the store's ledger rows: every priced phase of a training run, a loop
round, a fine-tuning job and served requests becomes a `LedgerRow` here, and the store takes
nothing else (store.Store refuses other objects), so every row is priced the one way.

    phase_rows(phases, profile)           a Ledger summary's phases (a run's economics) -> rows
    seconds_rows(seconds, profile)        wall seconds of named phases -> rows
    round_rows(trained, phases, ...)      a loop round's: its training's, its phases', the rest
    job_row(job_id, seconds, tokens, ...) a fine-tuning job's whole cost, written with its success
    ServingLedger                         served tokens and engine seconds, one row per tick
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

from .ledger import Profile, token_flops

TOKEN_FIELDS = ("prompt_tokens", "generated_tokens", "trained_tokens", "served_tokens")


@dataclass(frozen=True)
class LedgerRow:
    """One row of the ledger: a phase's wall seconds priced on a profile, its tokens and FLOPs."""

    phase: str
    seconds: float
    dollars: float
    flops: float = 0.0
    device_seconds: float | None = None          # None: the wall seconds
    prompt_tokens: int = 0
    generated_tokens: int = 0
    trained_tokens: int = 0
    served_tokens: int = 0
    run_id: str | None = None                    # a loop's id or a fine-tuning job's
    round: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def phase_rows(phases: dict[str, dict], profile: Profile | None = None) -> list[LedgerRow]:
    """Rows of a Ledger.summary()'s `phases` ({phase: {seconds, dollars, flops, *_tokens}}), as
    that ledger priced them (`profile` re-prices the seconds when given)."""
    return [LedgerRow(phase=p, seconds=v["seconds"],
                      dollars=profile.dollars(v["seconds"]) if profile else v.get("dollars", 0.0),
                      flops=v.get("flops", 0.0), **{k: int(v.get(k, 0)) for k in TOKEN_FIELDS})
            for p, v in phases.items()]


def seconds_rows(seconds: dict[str, float], profile: Profile) -> list[LedgerRow]:
    """Rows of phases known only by their wall seconds (a round's gate evaluations, ...)."""
    return [LedgerRow(phase=p, seconds=s, dollars=profile.dollars(s)) for p, s in seconds.items()]


def round_rows(trained: list[LedgerRow], phases: dict[str, float], profile: Profile,
               wall_seconds: float) -> list[LedgerRow]:
    """A loop round's rows: its training's, its own timed phases' and `other`, the rest of its
    wall seconds (store reads, summaries), so every second of the round is on the ledger."""
    rows = list(trained) + seconds_rows(phases, profile)
    return rows + seconds_rows({"other": max(0.0, wall_seconds - sum(r.seconds for r in rows))}, profile)


def job_row(job_id: str, seconds: float, trained_tokens: int, active_params: int, profile: Profile,
            phase: str = "fine_tuning") -> LedgerRow:
    """A fine-tuning job's (or a loop round's fine-tuning's) cost: its seconds and trained tokens."""
    return LedgerRow(phase=phase, seconds=seconds, dollars=profile.dollars(seconds), run_id=job_id or None,
                     trained_tokens=trained_tokens, flops=token_flops(active_params, trained_tokens=trained_tokens))


class ServingLedger:
    """Engine seconds and tokens of serving, flushed to the store's ledger every poll tick
    (one row per tick, not per batch: the ledger is priced per phase, not per request)."""

    def __init__(self, store, profile: Profile, active_params: int) -> None:
        self.store, self.profile, self.params = store, profile, active_params
        self.lock = threading.Lock()
        self.seconds = 0.0
        self.prompt = self.served = 0

    def add(self, seconds: float, prompt_tokens: int, generated_tokens: int) -> None:
        with self.lock:
            self.seconds += seconds
            self.prompt += prompt_tokens
            self.served += generated_tokens

    def flush(self) -> None:
        with self.lock:
            sec, prompt, served = self.seconds, self.prompt, self.served
            self.seconds, self.prompt, self.served = 0.0, 0, 0
        if served or prompt:
            self.store.ledger.add(LedgerRow(
                "serving", sec, dollars=self.profile.dollars(sec), prompt_tokens=prompt, served_tokens=served,
                flops=token_flops(self.params, prompt_tokens=prompt, served_tokens=served)))
