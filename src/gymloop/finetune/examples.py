"""A job's rows as token examples: (ids, mask) per conversation or per (prompt, completion),
and all of them as one padded matrix a step indexes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from ..models.chat import ChatTokenizer
from ..trainer.logprobs import TokenBatch


def sft_example(tok: ChatTokenizer, row: dict) -> tuple[list[int], list[int]]:
    """(ids, mask): the conversation, 1 on tokens of assistant messages whose weight is not 0; a
    row made of tokens already (an agent program's session: {"tokens": {"ids", "mask"}}) as it is."""
    if "tokens" in row:
        return list(row["tokens"]["ids"]), list(row["tokens"]["mask"])
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
    """(ids, mask) of a prompt and a completion of it, 1 on the completion's tokens only (a
    one-message completion: up to its end-of-turn token, the last one it generates)."""
    prompt = tok.prompt_ids(messages, tools=tools)
    full = tok.encode(tok.render(list(messages) + list(completion), add_generation_prompt=False, tools=tools))
    if full[:len(prompt)] != prompt:
        raise ValueError("chat template does not render prefixes as prefixes")
    rest = full[len(prompt):]
    return full, [0] * len(prompt) + (tok.turn_mask(rest) if len(completion) == 1 else [1] * len(rest))


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


def sft_examples(tok: ChatTokenizer, rows: list[dict]) -> Examples:
    """A supervised job's rows: one example each."""
    return Examples.of([sft_example(tok, r) for r in rows], tok.pad_token_id)


def preference_example(tok: ChatTokenizer, row: dict, key: str) -> tuple[list[int], list[int]]:
    """(ids, mask) of one side of a DPO row: its prompt and its `key` answer, or (a session pair:
    {"preferred_tokens": {"ids", "mask"}, ...}) that side's tokens as they were sampled."""
    if key + "_tokens" in row:
        return list(row[key + "_tokens"]["ids"]), list(row[key + "_tokens"]["mask"])
    return completion_example(tok, row["input"]["messages"], row[key + "_output"], row["input"].get("tools"))


def preference_examples(tok: ChatTokenizer, rows: list[dict]) -> Examples:
    """A DPO job's rows: the N preferred answers, then the N non-preferred (pair i is rows i and N + i)."""
    sides = [[preference_example(tok, r, key) for r in rows] for key in ("preferred", "non_preferred")]
    return Examples.of(sides[0] + sides[1], tok.pad_token_id)
