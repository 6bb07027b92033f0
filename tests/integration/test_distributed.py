"""Data-parallel training: 2 processes (gloo) follow the same loss curve as 1 process on the
same global batch, because each rank divides by the global token count and gradients are summed;
with whole replicas (DDP) and with sharded ones (FSDP), for every policy loss and correction."""
from __future__ import annotations

import copy
import multiprocessing as mp
import os
import socket

import pytest
import torch

from gymloop.algorithms import LOSSES, PolicyLoss
from gymloop.trainer.logprobs import make_batch, token_logprobs
from gymloop.trainer.trainer import Trainer
from gymloop.trainer.objectives import PolicyObjective

from conftest import tiny_llama

STEPS = 6


def global_batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    seqs, masks = [], []
    for i in range(8):
        n = 6 + (i * 3) % 7                      # uneven lengths: token counts differ per rank
        seqs.append(torch.randint(7, vocab, (n,), generator=g).tolist())
        masks.append([0] * 3 + [1] * (n - 3))
    adv = torch.randn(8, generator=g)
    return seqs, masks, adv


# every loss with its usual aggregation and clip ranges; a correction on the default loss
LOSS_CASES = {
    "grpo": PolicyLoss(),
    "gspo": PolicyLoss(name="gspo", clip_low=3e-4, clip_high=4e-4, agg="seq-mean"),
    "cispo": PolicyLoss(name="cispo", clip_low=1.0, clip_high=0.28),
    "grpo-seq-mean": PolicyLoss(agg="seq-mean"),
    "grpo-tis": PolicyLoss(correction="tis", correction_high=1.2),
    "grpo-icepop": PolicyLoss(correction="icepop", correction_low=0.8, correction_high=1.25),
}


def run_steps(model, seqs, masks, adv, rank: int = 0, world: int = 1, loss: PolicyLoss = LOSS_CASES["grpo"]):
    rows = list(range(rank, len(seqs), world))
    batch = make_batch([seqs[i] for i in rows], [masks[i] for i in rows], None, 0)
    with torch.no_grad():
        # behaviour log-probs a little off the trainer's (another engine's kernels), by row, so
        # that the corrections weigh and mask some tokens
        pos = torch.arange(batch.loss_mask.shape[1], dtype=torch.float)
        off = torch.stack([0.3 * torch.sin(pos * 1.7 + 3.1 * i) for i in rows])
        batch.old_logp = (token_logprobs(model, batch) + off) * batch.loss_mask
    trainer = Trainer(model, lr=5e-3, max_grad_norm=0.5)
    losses = []
    for _ in range(STEPS):
        m = trainer.step(batch, PolicyObjective(loss, adv[rows]))
        value = torch.tensor(m["loss"])
        if world > 1:
            torch.distributed.all_reduce(value)  # each rank's loss is its share of the global mean
        losses.append(float(value))
    return losses, trainer


def _worker(rank, port, state, vocab, out, fsdp, cases):
    """Rank `rank` of 2: each loss case in turn from the same weights, rank 0 sending its results."""
    from gymloop.trainer import sharding

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for case in cases:      # one pair of processes for every case: starting one costs more than a case
            model = tiny_llama(vocab)
            model.load_state_dict(state)
            if fsdp:
                sharding.shard(model, 2)
            seqs, masks, adv = global_batch(vocab)
            losses, trainer = run_steps(model, seqs, masks, adv, rank, 2, LOSS_CASES[case])
            weights = sharding.full_weights(model)           # a collective under FSDP: both ranks
            opt = trainer.state()["opt"]
            if rank == 0:   # plain lists: a tensor sent through a queue needs its sender alive
                moments = [opt["state"][i]["exp_avg"].flatten().tolist() for i in sorted(opt["state"])]
                out.put((case, losses, {k: v.flatten().tolist() for k, v in weights.items()}, moments,
                         sharding.is_sharded(model)))
        torch.distributed.barrier()   # neither leaves while the other's gloo threads still talk to it
    finally:
        torch.distributed.destroy_process_group()
    # A rank that got here succeeded; its interpreter's teardown once aborted ("terminate called
    # without an active exception", exit -6) in a thread's destructor after the result was sent.
    # Flush the queue, then leave without running C++ static destructors.
    out.close()
    out.join_thread()
    os._exit(0)


def _result(out, procs, timeout_s: float = 120.0):
    """Rank 0's result; fails at once (not after the timeout) when a rank has crashed."""
    import queue

    from conftest import eventually

    def got():
        try:
            return (out.get(timeout=1),)          # a wait on the queue itself, a second at a time
        except queue.Empty:
            return None

    def crashed():
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        return dead and f"a rank exited with {dead}"
    return eventually(got, timeout_s, "rank 0's result", every_s=0, unless=crashed)[0]


def test_every_loss_is_a_case():
    assert set(LOSSES) <= {c.name for c in LOSS_CASES.values()}


@pytest.mark.parametrize("fsdp,cases", [(False, list(LOSS_CASES)), (True, ["grpo"])], ids=["ddp", "fsdp"])
def test_two_processes_match_one_process(tok, fsdp, cases):
    """DDP (whole model per rank, one all-reduce) and FSDP (1/2 of parameters, gradients and
    optimizer state per rank): the loss curve, the weights and Adam's moments of one process;
    DDP for every loss case, FSDP for the default loss."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    state = copy.deepcopy(tiny_llama(tok.vocab_size, seed=4).state_dict())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, state, tok.vocab_size, out, fsdp, cases)) for r in range(2)]
    for p in procs:
        p.start()
    for case in cases:
        got, losses, weights, moments, sharded = _result(out, procs)
        assert got == case and sharded == fsdp
        model = tiny_llama(tok.vocab_size, seed=4)
        single, trainer = run_steps(model, *global_batch(tok.vocab_size), loss=LOSS_CASES[case])
        assert max(abs(a - b) for a, b in zip(single, losses)) <= 1e-4, (case, single, losses)
        assert len(set(round(x, 6) for x in single)) > 1, case             # the loss really moved
        worst = max((torch.tensor(weights[k]) - v.flatten()).abs().max().item() for k, v in model.state_dict().items())
        assert worst <= 1e-4, (case, worst)
        # the optimizer state comes back whole, in the unsharded layout (an unsharded trainer loads it)
        mine = trainer.state()["opt"]["state"]
        assert len(moments) == len(mine)
        assert max((torch.tensor(m) - mine[i]["exp_avg"].flatten()).abs().max().item()
                   for m, i in zip(moments, sorted(mine))) <= 1e-5, case
    for p in procs:
        p.join(60)
        assert p.exitcode == 0


def test_shard_batch_pads_short_ranks_with_rows_that_train_nothing(tok):
    from gymloop.cluster.ray_trainer import merge_metrics, shard_batch

    seqs = [[5, 6, 7, 8], [5, 6, 9], [7, 7, 7, 7, 7]]
    batch = make_batch(seqs, [[0, 1, 1, 1], [0, 1, 1], [0, 0, 1, 1, 1]], None, 0)
    adv = torch.tensor([1.0, -1.0, 0.5])
    (b0, a0), (b1, a1) = shard_batch(batch, adv, 2, min_rows=2)
    assert b0.input_ids.tolist() == [seqs[0] + [0], seqs[2]] and a0.tolist() == [1.0, 0.5]
    assert b1.input_ids.tolist() == [seqs[1] + [0], seqs[0]]            # row 2: padding, a copy of row 0
    assert b1.loss_mask.tolist() == [[0, 1, 1, 0], [0, 0, 0, 0]] and a1.tolist() == [-1.0, 0.0]
    (t0, _), = shard_batch(batch.select(slice(1, 2)), adv[1:2], 1)
    assert t0.input_ids.tolist() == [seqs[1]]                           # cut to its longest row
    assert batch.loss_mask.sum() == 8                                   # the original is untouched
    merged = merge_metrics([{"loss": 0.25, "ratio_max": 1.1, "clip_frac": 0.5},
                            {"loss": 0.5, "ratio_max": 1.3, "clip_frac": 0.0}])
    assert merged == {"loss": 0.75, "ratio_max": 1.3, "clip_frac": 0.25}
