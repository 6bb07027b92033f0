"""What a fine-tuning job will train on before it runs: tokens per epoch of its rows, by method
(what POST /v1/fine_tuning/jobs/estimate prices at the server's measured throughput)."""
from __future__ import annotations

from typing import Callable

from ..models.chat import ChatTokenizer
from .examples import preference_example, sft_example


def _sft_tokens(tok: ChatTokenizer, rows: list[dict], hp: dict) -> int:
    return sum(len(sft_example(tok, r)[0]) for r in rows)


def _dpo_tokens(tok: ChatTokenizer, rows: list[dict], hp: dict) -> int:
    return sum(len(preference_example(tok, r, k)[0]) for r in rows for k in ("preferred", "non_preferred"))


def _rft_tokens(tok: ChatTokenizer, rows: list[dict], hp: dict) -> int:
    # group_size samples of each prompt, each at most max_new_tokens long
    return sum(hp["group_size"] * (len(tok.prompt_ids(r["messages"], tools=r.get("tools"))) + hp["max_new_tokens"])
               for r in rows)


# method -> tokens one epoch of its rows trains on (the methods of methods.METHODS)
EPOCH_TOKENS: dict[str, Callable[[ChatTokenizer, list[dict], dict], int]] = {
    "supervised": _sft_tokens, "dpo": _dpo_tokens, "reinforcement": _rft_tokens}


def epoch_tokens(method: str, tok: ChatTokenizer, rows: list[dict], hp: dict) -> int:
    """Tokens one epoch of `rows` trains on with `method` and resolved hyper-parameters `hp`."""
    return EPOCH_TOKENS[method](tok, rows, hp)
