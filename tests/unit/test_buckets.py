"""Weights as flat byte buckets: exact round trip, bucket size respected, tied tensors sent once."""
from __future__ import annotations

import torch

from gymloop.sync.buckets import pack, unpack


def test_pack_unpack_round_trip_with_buckets_and_tied_tensors():
    torch.manual_seed(0)
    emb = torch.randn(50, 8)
    state = {"embed": emb, "w": torch.randn(8, 8), "b": torch.arange(5, dtype=torch.int64),
             "h": torch.randn(100).to(torch.bfloat16), "empty": torch.empty(0), "head": emb}
    unique = [emb, state["w"], state["b"], state["h"], state["empty"]]
    nbytes = sum(t.numel() * t.element_size() for t in unique)
    buckets, layout = pack(state, bucket_bytes=512)
    assert sum(b.nbytes for b in buckets) == nbytes                 # the tied tensor travels once
    assert len(buckets) > 1 and all(b.nbytes <= max(512, emb.numel() * 4) for b in buckets)
    out = unpack(buckets, layout)
    assert set(out) == set(state)
    for k, v in state.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k
    assert out["embed"].data_ptr() == out["head"].data_ptr()
    # read-only buckets (as an object store hands them out) unpack without copying
    for b in buckets:
        b.setflags(write=False)
    again = unpack(buckets, layout)
    assert torch.equal(again["w"], state["w"])
