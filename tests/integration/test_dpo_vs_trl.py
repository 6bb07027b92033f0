"""The DPO loss of fine-tuning jobs against TRL's `DPOTrainer` on the same batch: TRL tokenizes,
collates and computes its loss with its own reference model; gymloop renders the same rows with
its chat template (finetune/methods.py) and computes algorithms/dpo.py's loss. They agree to
1e-5. TRL is only the bench extra's peer: the test skips without it (`make bench` installs it
and runs this file first)."""
from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
# TRL's and peft's own use of names transformers has deprecated: nothing of ours to act on
pytestmark = [pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")]
datasets = pytest.importorskip("datasets")

from gymloop.algorithms.dpo import DPOLoss, sequence_logps  # noqa: E402
from gymloop.finetune.examples import Examples, completion_example  # noqa: E402
from gymloop.trainer.logprobs import token_logprobs  # noqa: E402


def rows():
    pairs = [(12, 30), (7, 45), (33, 1), (50, 49), (8, 8), (21, 63)]
    return [{"prompt": [{"role": "user", "content": f"{a}+{b}="}],
             "chosen": [{"role": "assistant", "content": str(a + b)}],
             "rejected": [{"role": "assistant", "content": str(a + b + 1 + a % 3) * (1 + b % 2)}]} for a, b in pairs]


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_matches_trl_on_the_same_batch(tiny_model_dir, tmp_path, beta):
    from gymloop.models.checkpoint import load_model

    model, tok = load_model(tiny_model_dir)
    data = rows()
    args = trl.DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=len(data), beta=beta, report_to=[],
                         use_cpu=True, max_length=None, precompute_ref_log_probs=False, disable_tqdm=True)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(data),
                             processing_class=tok.hf)
    torch.manual_seed(0)
    with torch.no_grad():                 # the policy moves away from its reference, so log-ratios are not 0
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.model.eval()
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, next(iter(trainer.get_train_dataloader()))).item()
        ex = Examples.of([completion_example(tok, r["prompt"], r[side], None) for side in ("chosen", "rejected") for r in data],
                         tok.pad_token_id)
        b = ex.batch(range(len(ex)))
        seq = sequence_logps(token_logprobs(trainer.model, b), b.loss_mask)
        ref = sequence_logps(token_logprobs(trainer.ref_model, b), b.loss_mask)
        n = len(data)
        ours, metrics = DPOLoss(beta=beta)(seq[:n], seq[n:], ref[:n], ref[n:])
    assert abs(metrics["reward_margin"]) > 1e-3                 # a batch on which the loss is not log 2
    assert ours.item() == pytest.approx(theirs, abs=1e-5)
