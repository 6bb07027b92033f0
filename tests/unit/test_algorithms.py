"""The algorithm tables: every advantage estimator, loss, correction and shaping against
values computed by hand; dynamic sampling's refills; the listing and the config names."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from gymloop.algorithms import (ADVANTAGES, AGGREGATIONS, CORRECTIONS, LOSSES, PolicyLoss, advantages_for,
                                aggregate, group_advantages, overlong_penalty, table)
from gymloop.algorithms.corrections import icepop, tis
from gymloop.algorithms.losses import cispo_loss, gspo_loss


def test_rloo_and_dr_grpo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # leave-one-out: 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3
    rloo, _ = group_advantages(r, 4, "rloo")
    assert torch.allclose(rloo, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    rloo, _ = group_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, "rloo")
    assert torch.allclose(rloo, torch.tensor([1.0, -0.5, -0.5]))
    dr, _ = group_advantages(r, 4, "dr_grpo")
    assert torch.allclose(dr, torch.tensor([0.5, -0.5, -0.5, 0.5]))
    grpo, _ = group_advantages(r, 4, "grpo")                # population std 0.5
    assert torch.allclose(grpo, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    for name in ADVANTAGES:                                  # a unanimous group is exactly 0 for all
        adv, zero = group_advantages(torch.ones(4), 4, name)
        assert adv.abs().max() == 0 and zero.tolist() == [True]
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages(r, 4, "ppo")


def _two_seqs():
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    old = torch.full((2, 2), -1.0)
    return mask, old


def test_gspo_by_hand():
    mask, old = _two_seqs()
    # seq 0: token log-ratios 0.1, 0.3 -> s = e^0.2 = 1.221 > 1.1 with A = +1: clipped, no gradient
    # seq 1: log-ratios -0.05, +0.05 -> s = 1, A = -1: per-token loss s = 1
    logp = (old + torch.tensor([[0.1, 0.3], [-0.05, 0.05]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    per_tok, clipped = gspo_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1)
    assert torch.allclose(per_tok.detach(), torch.tensor([[-1.1, -1.1], [1.0, 1.0]]), atol=1e-6)
    assert clipped.tolist() == [[True, True], [False, False]]
    loss = aggregate(per_tok, mask, "seq-mean")                 # (-1.1 + 1) / 2
    assert loss.item() == pytest.approx(-0.05, abs=1e-6)
    loss.backward()
    # d/dlogp_t of the sequence objective s_1 = exp(mean_t) is s_1 / |y| = 0.5, over 2 sequences
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0], [0.25, 0.25]]), atol=1e-6)


def test_gspo_gradient_is_the_sequence_objectives():
    """GSPO-token's gradient equals that of the paper's sequence-level objective."""
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    old = -torch.rand(5, 7, generator=g)
    delta = 0.01 * torch.randn(5, 7, generator=g)
    adv = torch.randn(5, generator=g)
    a = (old + delta).requires_grad_(True)
    per_tok, _ = gspo_loss(a, old, adv, mask, clip_low=0.5, clip_high=0.5)       # nothing clipped
    aggregate(per_tok, mask, "seq-mean").backward()
    b = (old + delta).requires_grad_(True)
    s = (((b - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)).exp()
    (-(s * adv)).mean().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_cispo_by_hand():
    mask, old = _two_seqs()
    # token (0, 0): ratio 1.5 > 1.28 with A = +1: the weight is capped at 1.28 but the token keeps
    # its gradient (PPO's clip would drop it); every other token has ratio 1
    logp = (old + torch.tensor([[math.log(1.5), 0.0], [0.0, 0.0]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    per_tok, clipped = cispo_loss(logp, old, adv, mask, clip_low=1.0, clip_high=0.28)
    # per_tok = -w * A * logp, logp = -1 on the ratio-1 tokens: row 0 gives +1, row 1 (A = -1) -1
    expect = torch.tensor([[-1.28 * (-1 + math.log(1.5)), 1.0], [-1.0, -1.0]])
    assert torch.allclose(per_tok.detach(), expect, atol=1e-6)
    assert clipped.tolist() == [[True, False], [False, False]]
    aggregate(per_tok, mask, "token-mean").backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.28, -1.0], [1.0, 1.0]]) / 4, atol=1e-6)


def test_corrections_by_hand():
    mask = torch.ones(1, 3)
    behaviour = torch.zeros(1, 3)
    prox = torch.log(torch.tensor([[3.0, 0.25, 1.0]]))          # k = pi_trainer / pi_behaviour
    k3 = lambda k: k - 1 - math.log(k)  # noqa: E731
    kl = (k3(3.0) + k3(0.25) + 0.0) / 3
    log_w, keep, m = tis(prox, behaviour, mask, low=0.5, high=2.0)
    assert torch.allclose(log_w.exp(), torch.tensor([[2.0, 0.25, 1.0]])) and keep.min() == 1   # capped at 2
    assert m["mismatch_kl"] == pytest.approx(kl, rel=1e-5) and m["masked_frac"] == 0
    log_w, keep, m = icepop(prox, behaviour, mask, low=0.5, high=2.0)
    assert keep.tolist() == [[0.0, 0.0, 1.0]] and torch.allclose(log_w.exp(), torch.tensor([[3.0, 0.25, 1.0]]))
    assert m["masked_frac"] == pytest.approx(2 / 3) and m["mismatch_kl"] == pytest.approx(kl, rel=1e-5)


def test_a_correction_changes_the_ratio_only_where_the_mismatch_is_extreme():
    mask = torch.ones(2, 2)
    behaviour = torch.full((2, 2), -1.0)
    prox = behaviour + torch.log(torch.tensor([[3.0, 1.1], [1.0, 0.25]]))       # k per token
    adv = torch.tensor([1.0, -1.0])
    logp = prox.clone().requires_grad_(True)             # the trainer has not moved since: ratio = k
    plain, _ = PolicyLoss(clip_high=0.2)(logp, behaviour, adv, mask)
    # the behaviour ratio k: 3 (A+, clipped at 1.2), 1.1, | 1, 0.25 (A-, clipped at 0.8)
    assert plain.item() == pytest.approx((-1.2 - 1.1 + 1.0 + 0.8) / 4, abs=1e-6)
    loss, m = PolicyLoss(clip_high=0.2, correction="icepop", correction_low=0.5, correction_high=2.0)(
        logp, behaviour, adv, mask, proximal_logp=prox)
    # k = 3 and k = 0.25 are masked (weigh 0, still counted in the mean); the rest as before
    assert loss.item() == pytest.approx((-1.1 + 1.0) / 4, abs=1e-6) and m["masked_frac"] == pytest.approx(0.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.1], [1.0, 0.0]]) / 4, atol=1e-6)
    tis_loss, m = PolicyLoss(clip_high=0.2, correction="tis", correction_high=2.0)(
        logp, behaviour, adv, mask, proximal_logp=prox)
    assert tis_loss.item() == pytest.approx(plain.item(), abs=1e-6) and m["masked_frac"] == 0   # inside the clip
    tis_loss, _ = PolicyLoss(clip_high=5.0, correction="tis", correction_high=2.0)(
        logp, behaviour, adv, mask, proximal_logp=prox)
    assert tis_loss.item() == pytest.approx((-2.0 - 1.1 + 1.0 + 0.8) / 4, abs=1e-6)      # 3 capped at 2
    same, _ = PolicyLoss(correction="icepop")(behaviour.clone(), behaviour, adv, mask, proximal_logp=behaviour)
    base, _ = PolicyLoss()(behaviour.clone(), behaviour, adv, mask)
    assert same.item() == base.item()                     # no mismatch: no change
    with pytest.raises(ValueError, match="before the step"):
        PolicyLoss(correction="tis")(logp, behaviour, adv, mask)


def test_overlong_penalty_by_hand():
    pen = overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), max_len=10, cache=4)
    assert pen.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(torch.tensor([12]), 10, 0).tolist() == [0.0]
    with pytest.raises(ValueError, match="exceeds"):
        overlong_penalty(torch.tensor([1]), 4, 5)


def test_aggregations_by_hand():
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])     # row 3: padding
    assert aggregate(per_tok, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_tok, mask, "seq-mean").item() == pytest.approx((2 + 4) / 2)
    assert AGGREGATIONS.impl("seq-mean").count(mask).item() == 2                       # padding rows do not count
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        PolicyLoss(agg="sum")


def test_unknown_names_fail_when_the_loss_is_built():
    with pytest.raises(ValueError, match="unknown loss"):
        PolicyLoss(name="ppo")
    with pytest.raises(ValueError, match="unknown correction"):
        PolicyLoss(correction="vtrace")


@dataclass
class FakeRollout:
    reward: float
    ok: bool = True
    mask: list = field(default_factory=lambda: [1])


def test_advantages_for_keeps_groups_and_truncates():
    rolls = [FakeRollout(r) for r in (1, 0, 1, 1, 0, 1, 0, 0)] + [FakeRollout(1, ok=False), FakeRollout(0)]
    adv = advantages_for(rolls, 2, "dr_grpo")
    # groups: (1,0) signal, (1,1) none, (0,1) signal, (0,0) none, (err, 0) one valid member: skipped
    assert adv.groups == 4 and adv.zero_signal_groups == 2 and adv.sizes == [2, 2] and adv.signal_groups == 2
    assert adv.advantages.tolist() == [0.5, -0.5, -0.5, 0.5]
    first = adv.first(1)
    assert first.sizes == [2] and first.rollouts == rolls[:2] and first.advantages.tolist() == [0.5, -0.5]
    shaped = advantages_for(rolls[:2], 2, "dr_grpo", rewards=[0.0, 0.0])          # rewards replaced
    assert shaped.zero_signal_groups == 1 and shaped.rollouts == []


class FakeSource:
    """next(): groups of 2 with no signal; more(): one group with a signal per call."""

    def __init__(self):
        self.draws = []

    def next(self, step):
        from gymloop.rollout.episodes import RolloutStats
        from gymloop.rollout.sources import RolloutBatch
        return RolloutBatch(step, [FakeRollout(1), FakeRollout(1), FakeRollout(0), FakeRollout(0)],
                            RolloutStats(episodes=4, generated_tokens=4))

    def more(self, step, draw):
        from gymloop.rollout.episodes import RolloutStats
        from gymloop.rollout.sources import RolloutBatch
        self.draws.append(draw)
        return RolloutBatch(step, [FakeRollout(1), FakeRollout(0)], RolloutStats(episodes=2, generated_tokens=2))


def test_dynamic_sampling_refills_until_the_batch_has_signal():
    from gymloop.config import GRPOConfig
    from gymloop.orchestrator.train import draw_rollouts

    g = GRPOConfig(prompts_per_step=2, group_size=2, dynamic_sampling=True, max_refills=5)
    src = FakeSource()
    _, rollouts, stats, adv, draws = draw_rollouts(src, 3, g, budget=8)
    assert src.draws == [1, 2] and draws == 2             # two refills gave the two signal groups
    assert adv.signal_groups == 2 and adv.sizes == [2, 2] and len(rollouts) == 8
    assert stats.episodes == 8 and stats.generated_tokens == 8     # every draw is on the ledger
    g = GRPOConfig(prompts_per_step=4, group_size=2, dynamic_sampling=True, max_refills=1)
    src = FakeSource()
    *_, adv, draws = draw_rollouts(src, 3, g, budget=8)
    assert src.draws == [1] and adv.sizes == [2]          # capped: trains on what it has
    g = GRPOConfig(prompts_per_step=2, group_size=2)
    src = FakeSource()
    *_, adv, draws = draw_rollouts(src, 3, g, budget=8)
    assert src.draws == [] and draws == 0 and adv.rollouts == []


def test_refill_keys_never_meet_a_step():
    from gymloop.rollout.sources import refill_key

    keys = {refill_key(s, d) for s in range(1, 50) for d in range(1, 10)}
    assert len(keys) == 49 * 9 and max(keys) < -1
    with pytest.raises(ValueError):
        refill_key(1, 0)


def test_the_listing_names_every_variant():
    rows = table()
    listed = {(kind, name) for kind, name, _ in rows}
    expected = ({("advantage", k) for k in ADVANTAGES} | {("loss", k) for k in LOSSES}
                | {("correction", k) for k in CORRECTIONS} | {("aggregation", k) for k in AGGREGATIONS})
    assert listed == expected and all(line for *_, line in rows)


def test_configs_select_variants_by_name():
    from pydantic import ValidationError

    from gymloop.config import GRPOConfig

    g = GRPOConfig(advantage="rloo", loss="cispo", correction="icepop", loss_agg="seq-mean")
    assert (g.advantage, g.loss, g.correction) == ("rloo", "cispo", "icepop")
    for field_name in ("advantage", "loss", "correction", "loss_agg"):
        with pytest.raises(ValidationError, match=f"unknown {field_name}"):
            GRPOConfig(**{field_name: "nope"})


def test_gymloop_algorithms_lists_them(capsys):
    from gymloop.cli import main

    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    for _, name, line in table():
        assert f" {name} " in out and line in out


VARIANTS = {
    "dr_grpo": {"advantage": "dr_grpo"},
    "rloo": {"advantage": "rloo"},
    "gspo": {"loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean"},
    "cispo": {"loss": "cispo", "clip_low": 1.0},
    "dapo": {"dynamic_sampling": True, "overlong_cache": 1},
    "tis-async": {"max_staleness": 2, "correction": "tis", "collector": "thread"},
    "icepop-async": {"max_staleness": 2, "correction": "icepop", "collector": "thread"},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_learns_the_digit_task(tmp_path, tiny_model_dir, digit_env, variant):
    """Each variant, end to end through train(): it learns the easy task, and logs what it adds."""
    import json
    from pathlib import Path

    from conftest import digit_cfg
    from gymloop.orchestrator.train import train

    s = train(digit_cfg(tmp_path, tiny_model_dir, **VARIANTS[variant]), progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "train"]
    assert s["base"]["pass1"] < 0.5 <= 0.9 <= s["final"]["pass1"], (variant, s["base"]["pass1"], s["final"]["pass1"])
    if "correction" in VARIANTS[variant]:
        assert all("mismatch_kl" in r and "masked_frac" in r for r in steps if r["trained_rollouts"])
        assert max(r["staleness"] for r in steps) <= 2
        # stale rollouts: the behaviour policy is not the trainer's, and it shows
        assert max(r["mismatch_kl"] for r in steps if r["trained_rollouts"]) > 0
    if VARIANTS[variant].get("dynamic_sampling"):
        assert any(r["refills"] > 0 for r in steps)
