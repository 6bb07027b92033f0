"""A loop round that trains on production itself: the store's traces with feedback exported as
a fine-tuning file (finetune/export.py: sft keeps the answers production got right, dpo pairs a
prompt's best and worst answer), trained by the fine-tuning API's trainer (finetune/methods.py)
from the round's start model. The candidate then goes through the same gate as a GRPO round's.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..accounting.ledger import Profile, token_flops
from ..config import _Strict
from ..finetune.export import export
from ..finetune.formats import parse
from ..finetune.methods import JobRun, Progress, resolve, train_tokens

EXPORT = {"sft": ("sft", "supervised"), "dpo": ("dpo", "dpo")}       # round method -> (export format, job method)


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


def train_on_traces(store, rm: RoundMethod, start_dir: str, root: Path, seed: int,
                    profile: Profile) -> tuple[str, dict, list[dict]]:
    """(candidate directory, the round's training stats, its ledger rows)."""
    fmt, method = EXPORT[rm.method]
    data = export(store.graded_traces(), fmt)
    rows = parse(data, method).rows if data.strip() else []
    root.mkdir(parents=True, exist_ok=True)
    (root / f"traces.{fmt}.jsonl").write_bytes(data)          # what the round trained on, kept with it
    if len(rows) < rm.min_examples:
        return start_dir, {"method": rm.method, "examples": len(rows), "skipped": f"fewer than {rm.min_examples} "
                           "examples"}, []
    given = {"n_epochs": rm.n_epochs, "batch_size": rm.batch_size, "beta": rm.beta, "sft_weight": rm.sft_weight,
             **({"learning_rate_multiplier": rm.learning_rate_multiplier} if rm.learning_rate_multiplier else {})}
    losses: list[float] = []
    t0 = time.perf_counter()
    out = train_tokens(method, JobRun(Path(start_dir), None, rows, None, resolve(method, given, len(rows)), seed, root),
                       Progress(lambda m: losses.append(m["train_loss"]), lambda *a: None, lambda: None))
    seconds = time.perf_counter() - t0
    stats = {"method": rm.method, "examples": len(rows), "steps": out["step"], "trained_tokens": out["trained_tokens"],
             "loss_first": losses[0], "loss_last": losses[-1]}
    (root / "training.json").write_text(json.dumps(stats, indent=2))
    ledger = [{"phase": "fine_tuning", "seconds": seconds, "dollars": profile.dollars(seconds),
               "trained_tokens": out["trained_tokens"],
               "flops": token_flops(out["active_parameters"], trained_tokens=out["trained_tokens"])}]
    return str(out["final"]), stats, ledger
