"""completion_logprobs (what SFT and DPO jobs train with) gives the same log-probs and gradients
as the plain forward, whether it shares a prefix and skips positions or falls back."""
from __future__ import annotations

import pytest
import torch

from gymloop.trainer.logprobs import MIN_SHARED_PREFIX, completion_logprobs, make_batch, shared_prefix, token_logprobs

from conftest import tiny_llama

SYSTEM = {"role": "system", "content": "you are a careful calculator"}


def batch_of(tok, prompts, system=True):
    seqs, masks = [], []
    for p in prompts:
        msgs = ([SYSTEM] if system else []) + [{"role": "user", "content": p},
                                                {"role": "assistant", "content": str(eval(p[:-1]))}]
        ids, mask = tok.sft_ids(msgs)
        seqs.append(ids)
        masks.append(mask)
    b = make_batch(seqs, masks, None, tok.pad_token_id)
    b.loss_mask[:, 0] = 0
    return b


def grads(model, value):
    return torch.autograd.grad(value, [p for p in model.parameters() if p.requires_grad])


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prefix_and_kept_positions_change_nothing(tok, lora):
    model = tiny_llama(tok.vocab_size, seed=0)
    if lora:
        from gymloop.models.lora import wrap

        model = wrap(model, {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
        with torch.no_grad():       # B starts at 0; move it so the adapter is in the gradient path
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    b = batch_of(tok, ["1+2=", "13+40=", "7+7="])
    assert shared_prefix(b) >= MIN_SHARED_PREFIX            # the system prompt and the user header
    plain = token_logprobs(model, b) * b.loss_mask
    fast = completion_logprobs(model, b)
    assert torch.allclose(plain, fast, atol=1e-5)
    assert (fast != 0).sum() == b.loss_mask.sum()
    for g1, g2 in zip(grads(model, plain.sum()), grads(model, fast.sum())):
        assert torch.allclose(g1, g2, atol=1e-5)


def test_short_prefixes_and_capped_prefixes(tok):
    model = tiny_llama(tok.vocab_size, seed=0)
    b = batch_of(tok, ["1+2=", "3+4="], system=False)
    assert shared_prefix(b) < MIN_SHARED_PREFIX              # only the template's first tokens: the native forward
    plain, fast = token_logprobs(model, b) * b.loss_mask, completion_logprobs(model, b)
    assert torch.allclose(plain, fast, atol=1e-6)
    for g1, g2 in zip(grads(model, plain.sum()), grads(model, fast.sum())):
        assert torch.allclose(g1, g2, atol=1e-5)
    # identical rows: the prefix stops before the first trained token's predecessor
    same = batch_of(tok, ["12+30=", "12+30="])
    first = int(same.loss_mask[0].nonzero()[0])
    assert shared_prefix(same) == first - 1
    assert torch.allclose(token_logprobs(model, same) * same.loss_mask, completion_logprobs(model, same), atol=1e-5)
