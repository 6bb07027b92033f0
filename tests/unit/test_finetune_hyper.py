"""A job's "auto" hyper-parameters fit its model: the learning rate of multiplier 1 depends on the
model's size and on LoRA (finetune/job.base_rate); the multiplier reported is the one used."""
from __future__ import annotations

import pytest

from gymloop.finetune.job import BASE_LR, METHOD_HYPER, SMALL_MODEL, base_rate, resolve


def test_the_base_rate_falls_with_size_and_rises_for_lora():
    assert base_rate(None, False) == base_rate(SMALL_MODEL // 2, False) == BASE_LR    # nano-sized: as before
    sizes = [SMALL_MODEL, 135_000_000, 1_700_000_000, 7_000_000_000]
    full = [base_rate(n, False) for n in sizes]
    assert full == sorted(full, reverse=True) and full[1] == pytest.approx(BASE_LR * (SMALL_MODEL / sizes[1]) ** 0.5)
    lora = [base_rate(n, True) for n in sizes]
    assert all(lo >= f for lo, f in zip(lora, full)) and max(lora) <= BASE_LR
    assert lora[-1] == pytest.approx(10 * full[-1])


@pytest.mark.parametrize("method", sorted(METHOD_HYPER))
def test_auto_uses_the_methods_multiplier_of_the_models_rate(method):
    given = {"group_size": 4} if method == "reinforcement" else {}
    small = resolve(method, given, 200)
    big = resolve(method, given, 200, n_params=135_000_000)
    big_lora = resolve(method, {**given, "lora": {"rank": 8}}, 200, n_params=135_000_000)
    auto = METHOD_HYPER[method].auto_lr
    assert small.learning_rate == pytest.approx(BASE_LR * auto)
    assert big.learning_rate == pytest.approx(base_rate(135_000_000, False) * auto)
    assert big_lora.learning_rate == pytest.approx(base_rate(135_000_000, True) * auto)
    for h in (small, big, big_lora):
        assert h.public(method)["learning_rate_multiplier"] == auto
    assert resolve(method, {**given, "learning_rate_multiplier": 3}, 200, 135_000_000).learning_rate == pytest.approx(
        3 * base_rate(135_000_000, False))


@pytest.mark.parametrize("n", [50, 2000])
def test_auto_epochs_are_the_methods_dpo_sees_each_pair_once(n):
    assert resolve("dpo", {}, n).n_epochs == 1
    assert resolve("supervised", {}, n).n_epochs == (5 if n < 100 else 3)
    assert resolve("dpo", {"n_epochs": 4}, n).n_epochs == 4           # given, not auto


def test_auto_answer_length_of_reinforcement_fits_the_model():
    """A real model's answer (a tool call: ~25-40 SmolLM2 tokens) is not cut at nano's 16 tokens."""
    from gymloop.finetune.job import AUTO_ANSWER_TOKENS

    assert resolve("reinforcement", {}, 200).max_new_tokens == AUTO_ANSWER_TOKENS[True] == 16
    assert resolve("reinforcement", {}, 200, n_params=135_000_000).max_new_tokens == AUTO_ANSWER_TOKENS[False] >= 64
    assert resolve("reinforcement", {"max_new_tokens": 40}, 200, n_params=135_000_000).max_new_tokens == 40


def test_parameter_count_reads_the_saved_weights(tiny_model_dir):
    from gymloop.models.checkpoint import load_model, parameter_count

    model, _ = load_model(tiny_model_dir)
    assert parameter_count(tiny_model_dir) == sum(p.numel() for p in model.parameters())


def test_auto_micro_batch_of_supervised_and_reinforcement_fits_the_model():
    """Beyond SMALL_MODEL a job's rows go through forward/backward 4 at a time (the same update;
    what a SmolLM2 step holds for its backward pass fills memory); a given size wins; DPO's pairs
    are not split and do not report one."""
    for method in ("supervised", "reinforcement"):
        assert resolve(method, {}, 200).micro_batch_size == 0
        assert resolve(method, {}, 200, n_params=135_000_000).micro_batch_size == 4
        h = resolve(method, {"micro_batch_size": 2}, 200, n_params=135_000_000)
        assert h.micro_batch_size == 2 and h.public(method)["micro_batch_size"] == 2
    assert "micro_batch_size" not in resolve("dpo", {}, 200, n_params=135_000_000).public("dpo")
