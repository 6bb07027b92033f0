"""Generic backend: any Hugging Face causal LM through its own forward and a DynamicCache."""
from __future__ import annotations

import inspect

import torch


class HFBackend:
    # Reindexing a DynamicCache would reach into transformers' internals: finished rows stay.
    can_compact = False

    def __init__(self, model: torch.nn.Module) -> None:
        from transformers import DynamicCache

        self.model = model
        self._cache_cls = DynamicCache
        # a LoRA (peft) wrapper forwards **kwargs: the wrapped model's signature says the name
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; accept either.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _call(self, ids, mask, pos):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **{self._cache_kw: self.cache})
        return out.logits[:, -1].float()

    @torch.inference_mode()
    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        self.cache = self._cache_cls()
        self.mask = mask.long()
        pos = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self.next_pos = self.mask.sum(-1)
        return self._call(ids, self.mask, pos)

    @torch.inference_mode()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], -1)
        logits = self._call(tok[:, None], self.mask, self.next_pos[:, None])
        self.next_pos = self.next_pos + 1
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        raise NotImplementedError("HFBackend cannot drop rows from its cache")
