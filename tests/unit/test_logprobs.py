"""completion_logprobs (what SFT and DPO jobs train with) gives the same log-probs and gradients
as the plain forward, whether it shares a prefix and skips positions or falls back."""
from __future__ import annotations

import pytest
import torch

from gymloop.trainer.logprobs import (MIN_SHARED_PREFIX, CompletionLogprobs, completion_logprobs, make_batch, pack_rows, shared_prefix,
                                     token_logprobs)

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
    assert CompletionLogprobs(model).native is not None     # LoRA too: base + scaling * B A, natively
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


def pair_batch(tok, pairs, extra=(), system=False):
    """DPO-shaped: the preferred answers, then the non-preferred ones (rows i and len(pairs) + i
    share their prompt), then `extra` rows of their own; every row after SYSTEM with `system`."""
    seqs, masks = [], []
    first = [SYSTEM] if system else []
    for side in (0, 1):
        for prompt, answers in pairs:
            msgs = first + [{"role": "user", "content": prompt}, {"role": "assistant", "content": answers[side]}]
            ids, mask = tok.sft_ids(msgs)
            seqs.append(ids), masks.append(mask)
    for msgs in extra:
        ids, mask = tok.sft_ids(first + msgs)
        seqs.append(ids), masks.append(mask)
    b = make_batch(seqs, masks, None, tok.pad_token_id)
    b.loss_mask[:, 0] = 0
    return b


@pytest.mark.parametrize("system", [False, True])
@pytest.mark.parametrize("kind", ["llama", "gqa", "qwen2"])
def test_packed_rows_share_prompts_and_change_nothing(tok, kind, system):
    """A DPO batch runs each pair's prompt once (pack_rows), a system prompt every row starts
    with once for the batch, and the last layer only where a trained token is predicted; values
    and gradients are the plain forward's. With rows that share nothing, a row with no trained
    token, and a multi-turn row trained on a middle turn."""
    model = tiny_llama(tok.vocab_size, seed=1, kv_heads=2 if kind == "gqa" else None,
                       model_type="qwen2" if kind == "qwen2" else "llama")
    untrained = [{"role": "user", "content": "5+5="}]
    multi = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"},
             {"role": "user", "content": "and 3+3="}]
    b = pair_batch(tok, [("1+2=", ("3", "4")), ("13+40=", ("53", "530")), ("7+7=", ("14", "1"))],
                   extra=[[{"role": "user", "content": "99+1="}, {"role": "assistant", "content": "100"}], untrained, multi],
                   system=system)
    head = shared_prefix(b)
    assert (head >= MIN_SHARED_PREFIX) == system
    packed = pack_rows(b, head=head)
    # every packed row with a trained token starts right after the head
    assert torch.equal(packed.head, b.input_ids[0, :head]) and (packed.pos[packed.at_row.unique(), 0] == head).all()
    assert packed.ids.shape[0] == 3 + 3                         # three pairs packed, three rows alone
    assert packed.mask is not None and packed.sel.shape[0] == 6
    plain = token_logprobs(model, b) * b.loss_mask
    fast = completion_logprobs(model, b)
    assert torch.allclose(plain, fast, atol=1e-5)
    assert (fast != 0).sum() == b.loss_mask[:, 1:].sum()
    for g1, g2 in zip(grads(model, plain.sum()), grads(model, fast.sum())):
        assert torch.allclose(g1, g2, atol=1e-5)


def test_rows_that_share_nothing_stay_plain_causal(tok):
    b = batch_of(tok, ["1+2=", "13+40=", "7+7="], system=False)
    packed = pack_rows(b)
    last = max(int((b.loss_mask[row] > 0).nonzero().max()) for row in range(3))      # the last trained token
    # plain causal rows, up to the token that predicts the last trained one (the final token feeds nothing)
    assert packed.mask is None and torch.equal(packed.ids, b.input_ids[:, :last])
    # each row's selected positions are the ones before its trained tokens, in order, then padding
    for row in range(3):
        want = (b.loss_mask[row, 1:] > 0).nonzero().squeeze(-1).tolist()
        assert packed.sel[row].tolist() == want + [0] * (packed.sel.shape[1] - len(want))


def test_a_scorer_built_once_sees_the_weights_change(tok):
    """A job builds CompletionLogprobs once and steps the optimizer under it: each call reads the
    weights as they are then, as a fresh completion_logprobs does."""
    model = tiny_llama(tok.vocab_size, seed=2)
    b = pair_batch(tok, [("1+2=", ("3", "4")), ("13+40=", ("53", "530"))])
    score = CompletionLogprobs(model)
    assert score.native is not None and not score.moe
    before = score(b).detach()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    (-score(b).sum()).backward()
    opt.step()
    after = score(b).detach()
    assert not torch.allclose(before, after, atol=1e-4)                 # the update is seen ...
    assert torch.allclose(after, token_logprobs(model, b) * b.loss_mask, atol=1e-5)     # ... and is the model's


@pytest.mark.parametrize("lora", [False, True])
def test_grpo_groups_share_their_prompt_and_train_as_the_plain_forward(tok, lora):
    """GRPO's objective reads the trained tokens' log-probs through completion_logps: a group's
    samples share one prompt, which runs once. Its loss and gradients at a sampling temperature
    are those of the plain forward (token_logprobs), natively and through a LoRA adapter."""
    from gymloop.algorithms import PolicyLoss
    from gymloop.trainer.objectives import PolicyObjective

    model = tiny_llama(tok.vocab_size, seed=0)
    if lora:
        from gymloop.models.lora import wrap

        model = wrap(model, {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    # two groups of three samples: each group's rows share their prompt, the groups do not
    b = batch_of(tok, ["1+2=", "1+2=", "1+2=", "13+40=", "13+40=", "13+40="])
    b.input_ids[[1, 4], -1] = 5                             # samples of one prompt differ
    with torch.no_grad():
        b.old_logp = token_logprobs(model, b, 0.7) * b.loss_mask
    adv = torch.tensor([1.0, -0.5, -0.5, 0.3, 0.2, -0.5])
    objective = PolicyObjective(PolicyLoss(), adv, temperature=0.7)
    objective.prepare(model, None, b)
    loss, _, _ = objective(model, b, torch.arange(len(b)))
    plain_logp = token_logprobs(model, b, 0.7)
    plain, _ = PolicyLoss()(plain_logp, b.old_logp, adv, b.loss_mask)
    assert torch.allclose(loss, plain, atol=1e-6)
    for g1, g2 in zip(grads(model, loss), grads(model, plain)):
        assert torch.allclose(g1, g2, atol=1e-5)
