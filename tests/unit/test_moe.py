"""Mixture-of-experts models: the engine's log-probs, router replay, the router's auxiliary loss
in training, costs on active parameters, and nano-moe end to end at toy size."""
from __future__ import annotations

import torch

from gymloop.accounting.ledger import Ledger, Profile
from gymloop.algorithms import PolicyLoss
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.models.parameters import count_parameters, moe_blocks
from gymloop.models.routing import routers, routing
from gymloop.trainer.logprobs import make_batch, token_logprobs
from gymloop.trainer.trainer import Trainer, rollouts_to_batch
from gymloop.trainer.objectives import PolicyObjective


def tiny_moe(vocab: int, seed: int = 0, experts: int = 4, top_k: int = 2):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, num_local_experts=experts, num_experts_per_tok=top_k, max_position_embeddings=256,
        tie_word_embeddings=True, sliding_window=None, router_aux_loss_coef=0.02)).eval()


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]          # uneven: left padding in the engine


def _sample(model, tok, record=True, seed=0, n=6):
    engine = NativeEngine(model, tok.pad_token_id, record_routing=record)
    gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=n, seed=seed)).generations
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    batch = make_batch(seqs, [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(PROMPTS, gens)],
                       [[0.0] * len(p) + g.logprobs for p, g in zip(PROMPTS, gens)], tok.pad_token_id)
    return engine, gens, seqs, batch


def test_the_engine_says_which_backend_and_its_logprobs_equal_a_forward_pass(tok):
    model = tiny_moe(tok.vocab_size)
    engine, gens, seqs, batch = _sample(model, tok, record=False)
    assert engine.backend_name == "hf" and "mixtral" in engine.native_unsupported
    lp = token_logprobs(model, batch)
    worst = max(abs(lp[i, len(p) + j].item() - x) for i, (p, g) in enumerate(zip(PROMPTS, gens))
                for j, x in enumerate(g.logprobs))
    assert worst <= 1e-4, worst


def test_parameters_and_active_parameters_by_hand(tok):
    model = tiny_moe(tok.vocab_size)
    total, active = count_parameters(model)
    blocks = moe_blocks(model)
    assert len(blocks) == 2
    experts = sum(p.numel() for b in blocks for p in b.experts.parameters())
    assert experts == 2 * 4 * (2 * 48 * 32 + 32 * 48)            # gate_up [E, 2I, H] + down [E, H, I] per layer
    assert total == sum(p.numel() for p in model.parameters())
    assert active == total - experts // 2                          # top-2 of 4: half the experts idle
    dense = tiny_moe(tok.vocab_size, experts=2, top_k=2)           # all experts used: nothing idle
    assert count_parameters(dense)[0] == count_parameters(dense)[1]


def test_cost_per_token_is_computed_on_active_parameters(tok):
    """FLOPs, and with them the projected cost of a generated token, follow the active count."""
    model = tiny_moe(tok.vocab_size)
    total, active = count_parameters(model)
    gpu = Profile(kind="gpu", usd_per_hour=3.6, peak_flops=1e15, assumption="test")
    ledger = Ledger("cpu", Profile(kind="cpu", usd_per_hour=0.1, peak_flops=1e11, assumption="test"), active)
    ledger.add("generation", 2.0, prompt_tokens=300, generated_tokens=700)
    proj = ledger.project({"gpu": gpu}, utilisation=0.5)["gpu"]
    flops = 2 * active * (300 + 700)
    assert ledger.entries["generation"].flops == flops
    expect = flops / (1e15 * 0.5) * 3.6 / 3600 / 700 * 1e6
    assert abs(proj["usd_per_1m_generated_tokens"] - expect) <= 1e-12 * expect
    on_total = 2 * total * 1000 / (1e15 * 0.5) * 3.6 / 3600 / 700 * 1e6
    assert proj["usd_per_1m_generated_tokens"] < on_total          # not on all parameters


def _perturbed(model, seed=1, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in routers(model):
            r.weight.add_(scale * torch.randn(r.weight.shape, generator=g))
    return model


def test_router_replay_uses_the_routing_that_produced_the_sample(tok):
    model = tiny_moe(tok.vocab_size)
    engine, gens, seqs, batch = _sample(model, tok)
    for p, g in zip(PROMPTS, gens):
        assert g.routing.shape == (2, len(p) + len(g.token_ids) - 1, 2)
    rolls = [type("R", (), {"prompt_ids": p, "token_ids": g.token_ids, "mask": [1] * len(g.token_ids),
                            "logprobs": g.logprobs, "routing": g.routing.numpy()})() for p, g in zip(PROMPTS, gens)]
    replay = rollouts_to_batch(rolls, tok.pad_token_id, replay=True)
    assert replay.routing.shape == (3, 2, batch.input_ids.shape[1], 2)
    # same weights: replay changes nothing, and the engine's log-probs are the trainer's
    same = token_logprobs(model, replay)
    assert torch.allclose(same, token_logprobs(model, batch), atol=1e-6)
    assert torch.allclose(same * batch.loss_mask, batch.old_logp, atol=1e-4)
    # the weights move (a trainer step would): the routers now choose other experts somewhere
    _perturbed(model)
    covered = replay.routing[:, :, :, 0] >= 0                             # [N, layers, L]
    with routing(model) as own:
        free = token_logprobs(model, batch)
    with routing(model, replay=replay.routing) as used:
        replayed = token_logprobs(model, replay)
    width = batch.input_ids.shape[1]

    def chosen(tape):     # [N, layers, L, k] as the forward pass routed it
        return torch.stack([t.view(3, width, 2) for t in tape.calls[0]], 1)

    assert (chosen(own) != replay.routing)[covered].any()                # without replay: other experts
    assert torch.equal(chosen(used)[covered], replay.routing[covered])    # with it: the sampled ones
    assert not torch.allclose(free, replayed)
    # the router still learns under replay: its weights get a gradient through the replayed scores
    model.zero_grad()
    (-(token_logprobs(model, replay) * replay.loss_mask).sum()).backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(model))


def test_a_trainer_step_adds_the_router_aux_loss_and_moves_the_router(tok):
    model = tiny_moe(tok.vocab_size)
    _, _, _, batch = _sample(model, tok, record=False)
    before = [r.weight.detach().clone() for r in routers(model)]
    m = Trainer(model, lr=1e-2).step(batch, PolicyObjective(PolicyLoss(), torch.tensor([1.0, -1.0, 0.5])))
    assert m["router_aux_loss"] > 0
    assert all(not torch.equal(b, r.weight) for b, r in zip(before, routers(model)))
    dense = Trainer(__import__("conftest").tiny_llama(tok.vocab_size), lr=1e-2)
    assert "router_aux_loss" not in dense.step(batch, PolicyObjective(PolicyLoss(), torch.tensor([1.0, -1.0, 0.5])))


def test_nano_moe_trains_end_to_end_with_router_replay(tmp_path, digit_env):
    """A toy nano-moe (no pre-training) through train(): replay on, a process collector a step
    ahead; the summary carries both parameter counts."""
    import json
    from pathlib import Path

    from conftest import digit_cfg
    from gymloop.bases.nano import build_model, nano_tokenizer, preset
    from gymloop.models.checkpoint import save_model
    from gymloop.orchestrator.train import train

    tok = nano_tokenizer()
    model = build_model(preset("nano-moe", hidden_size=32, heads=4, intermediate_size=32), tok)
    save_model(model, tok, tmp_path / "moe")
    for staleness in (0, 1):
        s = train(digit_cfg(tmp_path / str(staleness), tmp_path / "moe", router_replay=True,
                            max_staleness=staleness, steps=20), progress=False, echo=lambda m: None)
        assert s["active_parameters"] < s["parameters"] == count_parameters(model)[0]
        recs = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in recs if r["kind"] == "train" and r["trained_rollouts"]]
        assert steps and all(r["router_aux_loss"] > 0 for r in steps)
        assert s["final"]["pass1"] > s["base"]["pass1"], (staleness, s["base"]["pass1"], s["final"]["pass1"])
    from gymloop.tracking.report import write_report

    html = write_report(s["run_dir"]).read_text()
    assert f"{s['parameters']:,} / {s['active_parameters']:,}" in html and "per 1M generated tokens" in html
