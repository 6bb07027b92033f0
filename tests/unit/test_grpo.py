"""GRPO advantages and loss against values computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from gymloop.algorithms import PolicyLoss, group_advantages, sft_loss


def grpo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, ref_logp=None, beta=0.0, agg="token-mean"):
    return PolicyLoss(clip_low=clip_low, clip_high=clip_high, beta=beta, agg=agg)(logp, old, adv, mask, ref_logp=ref_logp)


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv, zero = group_advantages(r, 4)
    # group 1: mean 0.5, population std 0.5 -> +-1; group 2: all equal -> exactly 0
    assert torch.allclose(adv, torch.tensor([1.0, -1, -1, 1, 0, 0, 0, 0]), atol=1e-5)
    assert zero.tolist() == [False, True]
    adv, _ = group_advantages(r, 4, "dr_grpo")  # Dr. GRPO: no std scaling
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    adv, _ = group_advantages(torch.tensor([1.0, 0.0, 0.0]), 3)
    mean, std = 1 / 3, math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3)
    assert torch.allclose(adv, torch.tensor([(1 - mean) / std, -mean / std, -mean / std]), atol=1e-4)


def test_group_advantages_rejects_ragged():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)


def _batch():
    # 4 sequences of width 4; trained tokens: 3, 1, 1, 1
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0]], dtype=torch.float)
    old = torch.full((4, 4), -1.0) * mask
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    return mask, old, adv


def test_on_policy_loss_by_hand():
    mask, old, adv = _batch()
    logp = old.clone().requires_grad_(True)
    loss, m = grpo_loss(logp, old, adv, mask)
    # ratio 1 everywhere: per-token loss = -adv; token-mean = -(3 - 1 - 1 + 1) / 6
    assert loss.item() == pytest.approx(-2 / 6)
    loss.backward()
    expect = -adv[:, None] * mask / 6
    assert torch.allclose(logp.grad, expect)
    seq, _ = grpo_loss(old, old, adv, mask, agg="seq-mean")
    assert seq.item() == pytest.approx(0.0)
    assert m["clip_frac"] == 0.0 and m["approx_kl_behaviour"] == 0.0


def test_clipped_loss_by_hand():
    mask, old, adv = _batch()
    shift = torch.zeros(4, 4)
    shift[0] = math.log(1.5)   # adv > 0, ratio 1.5 > 1.28 -> clipped at 1.28
    shift[1] = math.log(0.5)   # adv < 0, ratio 0.5 < 0.8  -> clipped at 0.8
    logp = (old + shift * mask).requires_grad_(True)
    loss, m = grpo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # seq0: 3 * -1.28; seq1: +0.8; seq2: +1; seq3: -1  -> sum -3.04 over 6 tokens
    assert loss.item() == pytest.approx(-3.04 / 6, abs=1e-6)
    loss.backward()
    # Clipped tokens carry no gradient; unclipped ones -adv * ratio / 6.
    expect = torch.zeros(4, 4)
    expect[2, 1], expect[3, 1] = 1 / 6, -1 / 6
    assert torch.allclose(logp.grad, expect, atol=1e-6)
    assert m["clip_frac"] == pytest.approx(4 / 6)


def test_kl_penalty_by_hand():
    mask, old, adv = _batch()
    ref = old + 0.5 * mask                      # d = ref - logp = 0.5 on every trained token
    loss0, _ = grpo_loss(old, old, adv, mask)
    loss, m = grpo_loss(old, old, adv, mask, ref_logp=ref, beta=0.1)
    k3 = math.exp(0.5) - 0.5 - 1
    assert m["kl_ref"] == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(loss0.item() + 0.1 * k3, abs=1e-6)


def test_unknown_aggregation():
    mask, old, adv = _batch()
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(old, old, adv, mask, agg="sum")  # type: ignore[arg-type]


def test_sft_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, m = sft_loss(logp, mask)
    assert loss.item() == pytest.approx(-(math.log(0.25) + math.log(0.9)) / 2, abs=1e-6)
    assert m["tokens"] == 2


def test_dpo_loss_by_hand():
    from gymloop.algorithms.dpo import DPOLoss, sequence_logps

    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    assert sequence_logps(lp, mask).tolist() == [-3.0, -0.5]
    assert sequence_logps(lp, mask, length_normalize=True).tolist() == [-1.5, -0.5]
    c, r = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-2.5, -1.5])
    loss, m = DPOLoss(beta=0.5)(c, r, rc, rr)
    # margins: 0.5 * ((0.5) - (-0.5)) = 0.5 and 0.5 * ((0) - (0.5)) = -0.25
    expect = (-math.log(1 / (1 + math.exp(-0.5))) - math.log(1 / (1 + math.exp(0.25)))) / 2
    assert loss.item() == pytest.approx(expect, abs=1e-6) and m["reward_accuracy"] == 0.5
    free, _ = DPOLoss(beta=0.5, reference_free=True)(c, r, None, None)
    # margins 0.5 * (2) = 1 and 0.5 * (-1) = -0.5
    assert free.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(0.5))) / 2, abs=1e-6)
    rpo, _ = DPOLoss(beta=0.5, sft_weight=2.0)(c, r, rc, rr, nll_chosen=torch.tensor([1.0, 0.5]))
    assert rpo.item() == pytest.approx(expect + 2.0 * 0.75, abs=1e-6)
    with pytest.raises(ValueError, match="reference"):
        DPOLoss()(c, r, None, None)
    with pytest.raises(ValueError, match="beta"):
        DPOLoss(beta=0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_micro_batches_give_the_same_update_as_one_pass(tok, agg):
    """Trainer(micro_batch=k): each part's loss over the whole minibatch's count, gradients summed,
    one step: the gradient equals one pass's (the memory is one part's). Compared before Adam,
    whose update of a near-zero gradient turns rounding into a sign."""
    from conftest import tiny_llama
    from gymloop.trainer.trainer import Trainer
    from gymloop.trainer.logprobs import make_batch, token_logprobs
    from gymloop.trainer.objectives import PolicyObjective

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(6, tok.vocab_size, (int(n),), generator=gen).tolist() for n in (9, 12, 7, 12, 10)]
    masks = [[0] * 4 + [1] * (len(s) - 4) for s in seqs]
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75])
    after = []
    for micro in (0, 2):
        model = tiny_llama(tok.vocab_size, seed=3)
        batch = make_batch(seqs, masks, None, tok.pad_token_id)
        with torch.no_grad():
            batch.old_logp = token_logprobs(model, batch) * batch.loss_mask + 0.05 * batch.loss_mask
        metrics = Trainer(model, lr=1e-2, micro_batch=micro).step(batch, PolicyObjective(PolicyLoss(agg=agg), advantages))
        after.append(([p.grad.clone() for p in model.parameters()], metrics))     # what the step used
    (one, m_one), (parts, m_parts) = after
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-8) for a, b in zip(one, parts))
    assert m_parts["loss"] == pytest.approx(m_one["loss"], abs=1e-6)
    assert m_parts["grad_norm"] == pytest.approx(m_one["grad_norm"], rel=1e-5)


def test_sft_micro_batches_give_the_same_update_and_loss_as_one_pass(tok):
    """SFT's TokenNLL in parts (a supervised job's micro_batch_size): each part's summed NLL over
    the whole minibatch's trained tokens, so the gradient and the reported token-mean loss are
    one pass's, on rows of unequal trained lengths (a part's own mean would weigh rows wrongly)."""
    from conftest import tiny_llama
    from gymloop.trainer.logprobs import CompletionLogprobs, make_batch
    from gymloop.trainer.objectives import TokenNLL
    from gymloop.trainer.trainer import Trainer

    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(6, tok.vocab_size, (int(n),), generator=gen).tolist() for n in (14, 6, 11, 9, 13)]
    masks = [[0] * 3 + [1] * (len(s) - 3) for s in seqs]
    after = []
    for micro in (0, 2):
        model = tiny_llama(tok.vocab_size, seed=3)
        batch = make_batch(seqs, masks, None, tok.pad_token_id)
        metrics = Trainer(model, lr=1e-2, micro_batch=micro).step(batch, TokenNLL(CompletionLogprobs(model)))
        after.append(([p.grad.clone() for p in model.parameters()], metrics))
    (one, m_one), (parts, m_parts) = after
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-8) for a, b in zip(one, parts))
    assert m_parts["train_loss"] == pytest.approx(m_one["train_loss"], rel=1e-6)
    assert m_parts["grad_norm"] == pytest.approx(m_one["grad_norm"], rel=1e-5)
    assert m_one["grad_norm"] > 0


def test_sft_loss_normalizer_divides_the_summed_nll():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, m = sft_loss(logp, mask)
    assert loss.item() == pytest.approx(14 / 4) and m["nll"] == pytest.approx(14 / 4) and m["tokens"] == 4
    loss, m = sft_loss(logp, mask, normalizer=10.0)
    assert loss.item() == pytest.approx(1.4) and m["nll"] == pytest.approx(14 / 4)
