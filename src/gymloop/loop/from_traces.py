"""A loop round that trains on production itself: the store's traces with feedback exported as
a fine-tuning file (finetune/export.py: sft keeps the answers production got right, dpo pairs a
prompt's best and worst answer), trained by the fine-tuning API's trainer (finetune/methods.py)
from the round's start model. The candidate then goes through the same gate as a GRPO round's.
"""
from __future__ import annotations

import json
import time
from pathlib import Path


from ..accounting.ledger import Profile
from ..accounting.rows import LedgerRow, job_row
from .config import RoundMethod
from ..finetune.export import export
from ..finetune.formats import parse
from ..finetune.job import JobRun, Progress, resolve
from ..finetune.methods import train_tokens
from ..models.checkpoint import parameter_count

EXPORT = {"sft": ("sft", "supervised"), "dpo": ("dpo", "dpo")}       # round method -> (export format, job method)



def session_rows(store, fmt: str, tok) -> list[dict]:
    """An agent program's judged sessions as token rows, their calls merged into sequences
    (rollout/capture.py) with the exact ids the model sampled: sft, every sequence of a session
    judged 1 ({"tokens": {ids, mask}}); dpo, per task, the first sequence of its best session
    against its worst's when their rewards differ ({"preferred_tokens", "non_preferred_tokens"})."""
    from ..rollout.capture import Call, merge

    def sequences(session: dict) -> list[dict]:
        segs = merge([Call(**c) for c in store.sessions.calls(session["id"])], tok)
        return [{"ids": s.prompt_ids + s.token_ids, "mask": [0] * len(s.prompt_ids) + s.mask} for s in segs]

    judged = store.sessions.succeeded() + store.sessions.failed()
    if fmt == "sft":
        return [{"tokens": seq, "session_id": s["id"]} for s in judged if s["reward"] >= 1 for seq in sequences(s)]
    by_task: dict[str, list[dict]] = {}
    for s in judged:
        by_task.setdefault(json.dumps(s["task"], sort_keys=True), []).append(s)
    out = []
    for group in by_task.values():
        best, worst = max(group, key=lambda s: s["reward"]), min(group, key=lambda s: s["reward"])
        good, bad = sequences(best), sequences(worst)
        if best["reward"] > worst["reward"] and good and bad:
            out.append({"preferred_tokens": good[0], "non_preferred_tokens": bad[0],
                        "session_ids": [best["id"], worst["id"]]})
    return out


def train_on_traces(store, rm: RoundMethod, start_dir: str, root: Path, seed: int,
                    profile: Profile) -> tuple[str, dict, list[LedgerRow]]:
    """(candidate directory, the round's training stats, its ledger rows). Traces with feedback
    are exported as the fine-tuning API's rows; an agent program's judged sessions join them as
    rows of the tokens they sampled."""
    from ..models.checkpoint import load_tokenizer

    fmt, method = EXPORT[rm.method]
    data = export(store.traces.graded(), fmt)
    rows = parse(data, method).rows if data.strip() else []
    sessions = session_rows(store, fmt, load_tokenizer(start_dir))
    rows += sessions
    root.mkdir(parents=True, exist_ok=True)
    (root / f"traces.{fmt}.jsonl").write_bytes(data)          # what the round trained on, kept with it
    if sessions:
        (root / f"sessions.{fmt}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sessions))
    if len(rows) < rm.min_examples:
        return start_dir, {"method": rm.method, "examples": len(rows), "session_examples": len(sessions),
                           "skipped": f"fewer than {rm.min_examples} "
                           "examples"}, []
    given = {"n_epochs": rm.n_epochs, "batch_size": rm.batch_size, "beta": rm.beta, "sft_weight": rm.sft_weight,
             **({"learning_rate_multiplier": rm.learning_rate_multiplier} if rm.learning_rate_multiplier else {})}
    losses: list[float] = []
    t0 = time.perf_counter()
    out = train_tokens(method, JobRun(Path(start_dir), None, rows, None, resolve(method, given, len(rows), parameter_count(start_dir)), seed, root),
                       Progress(lambda m: losses.append(m["train_loss"]), lambda *a: None, lambda: None))
    seconds = time.perf_counter() - t0
    stats = {"method": rm.method, "examples": len(rows), "session_examples": len(sessions), "steps": out["step"], "trained_tokens": out["trained_tokens"],
             "loss_first": losses[0], "loss_last": losses[-1]}
    (root / "training.json").write_text(json.dumps(stats, indent=2))
    ledger = [job_row("", seconds, out["trained_tokens"], out["active_parameters"], profile)]
    return str(out["final"]), stats, ledger
