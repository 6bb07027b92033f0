"""The GPU path (`device: cuda`; Ray trainer actors with `trainer_gpus`): the same checks as on
the CPU, on the GPU. Skipped without one; on a GPU machine `make test TORCH=torch` runs them.

- the engine's log-probs equal a full forward pass on the GPU (both backends);
- a trainer step on the GPU takes the CPU's step (gradient norm, weights);
- a short `gymloop train` run with `device: cuda` learns the digit task, synchronous and with a
  collector thread, and its checkpoint loads on the CPU;
- the same on Ray with the rollout worker and the trainer actor on the GPU.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from gymloop.engine import NativeEngine, SamplingParams
from gymloop.trainer.logprobs import make_batch, token_logprobs
from gymloop.trainer.trainer import Trainer

from conftest import tiny_llama
from conftest import DigitEnv, digit_cfg, use_env

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda.is_available())")

PROMPTS = [[3, 10, 11, 12], [3, 20, 21, 22, 23, 24, 25, 26], [3, 30]]


@pytest.mark.parametrize("backend", ["llama", "hf"])
def test_engine_logprobs_match_full_forward_on_gpu(tok, backend):
    model = tiny_llama(tok.vocab_size, kv_heads=2).cuda()
    eng = NativeEngine(model, tok.pad_token_id, backend=backend)
    assert eng.device.type == "cuda"
    out = eng.generate(PROMPTS * 4, SamplingParams(max_new_tokens=12, temperature=0.7, seed=1))
    worst = 0.0
    for p, g in zip(PROMPTS * 4, out.generations):
        batch = make_batch([p + g.token_ids], [[0] * len(p) + [1] * len(g.token_ids)], None, 0).to("cuda")
        with torch.no_grad():
            ref = token_logprobs(model, batch, 0.7)[0, len(p):].cpu()
        worst = max(worst, (ref - torch.tensor(g.logprobs)).abs().max().item())
    assert worst <= 1e-4, worst


def test_a_trainer_step_on_gpu_is_the_cpu_step(tok):
    cpu = tiny_llama(tok.vocab_size, seed=3)
    gpu = copy.deepcopy(cpu).cuda()
    seqs = [[5, 6, 7, 8, 9], [5, 9, 9], [7, 8, 9, 10]]
    batch = make_batch(seqs, [[0, 1, 1, 1, 1], [0, 1, 1], [0, 0, 1, 1]], None, 0)
    with torch.no_grad():
        batch.old_logp = token_logprobs(cpu, batch) * batch.loss_mask
    adv = torch.tensor([1.0, -0.5, -0.5])
    from gymloop.algorithms import PolicyLoss
    from gymloop.trainer.objectives import PolicyObjective

    a = Trainer(cpu, lr=1e-3).step(batch, PolicyObjective(PolicyLoss(), adv))
    b = Trainer(gpu, lr=1e-3).step(batch, PolicyObjective(PolicyLoss(), adv))       # the batch arrives on the CPU
    assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"]
    worst = max((x - y.cpu()).abs().max().item() for x, y in zip(cpu.state_dict().values(), gpu.state_dict().values()))
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_short_run_on_gpu_learns(tmp_path, tiny_model_dir, monkeypatch, staleness):
    from gymloop.models.checkpoint import load_model
    from gymloop.orchestrator.train import train

    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    cfg = digit_cfg(tmp_path, tiny_model_dir, steps=30, max_staleness=staleness, collector="thread")
    cfg = cfg.model_copy(update={"device": "cuda"})
    s = train(cfg, progress=False, echo=lambda m: None)
    recs = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in recs if r["kind"] == "train"]
    assert sum(rewards[-5:]) / 5 >= sum(rewards[:5]) / 5 + 0.3, rewards
    assert s["final"]["pass1"] >= 0.9
    model, _ = load_model(Path(s["run_dir"]) / "checkpoint")        # saved from the GPU, loads on the CPU
    assert next(model.parameters()).device.type == "cpu"


def test_ray_rollout_worker_and_trainer_on_the_gpu_learn(tmp_path, tiny_model_dir, monkeypatch):
    """One GPU shared by a rollout worker and a trainer actor (halves): the Ray path on a GPU."""
    ray = pytest.importorskip("ray")
    import conftest

    from gymloop.orchestrator.train import train

    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    ray.cloudpickle.register_pickle_by_value(conftest)
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        cfg = digit_cfg(tmp_path, tiny_model_dir, steps=30)
        cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={
            "backend": "ray", "workers": 1, "worker_cpus": 0.5, "worker_gpus": 0.5,
            "trainers": 1, "trainer_cpus": 0.5, "trainer_gpus": 0.5})})
        s = train(cfg, progress=False, echo=lambda m: None)
        assert s["final"]["pass1"] >= 0.9
    finally:
        ray.shutdown()
