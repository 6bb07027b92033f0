"""Metric loggers: the same records as metrics.jsonl reach TensorBoard and an offline W&B run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymloop.config import TrainConfig


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, tiny_model_dir):
    from gymloop.orchestrator.train import train

    pytest.importorskip("tensorboard", reason="pip install 'gymloop[loggers]' (make test installs it)")
    pytest.importorskip("wandb", reason="pip install 'gymloop[loggers]' (make test installs it)")
    root = tmp_path_factory.mktemp("loggers")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_SILENT", "true")
    mp.delenv("WANDB_API_KEY", raising=False)
    try:
        cfg = TrainConfig.model_validate({
            "model": str(tiny_model_dir), "run_dir": str(root), "sampling": {"max_new_tokens": 4},
            "grpo": {"steps": 4, "prompts_per_step": 4, "group_size": 4, "drop_zero_signal": False},
            "eval": {"tasks": 10, "every": 2, "max_new_tokens": 4},
            "logging": {"tensorboard": True, "wandb": True, "wandb_mode": "offline"}})
        summary = train(cfg, progress=False, echo=lambda m: None)
    finally:
        mp.undo()
    run = Path(summary["run_dir"])
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return run, records


def test_tensorboard_gets_every_scalar_of_the_jsonl(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, records = logged_run
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    rewards = [(e.step, e.value) for e in acc.Scalars("train/reward")]
    expected = [(r["step"], r["reward"]) for r in records if r["kind"] == "train"]
    assert [s for s, _ in rewards] == [s for s, _ in expected]
    assert [v for _, v in rewards] == pytest.approx([v for _, v in expected])
    evals = [(e.step, e.value) for e in acc.Scalars("eval/pass1")]
    assert evals == [(r["step"], pytest.approx(r["pass1"])) for r in records if r["kind"] == "eval"]


def wandb_records(path: Path) -> list[bytes]:
    """The records of a .wandb file: a 7-byte header, then LevelDB's log format (32 KiB blocks of
    chunks: crc32 (4), length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last))."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, out, pending = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:                  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def test_wandb_offline_run_holds_the_metrics(logged_run):
    from wandb.proto import wandb_internal_pb2

    run, records = logged_run
    [offline] = list((run / "wandb").glob("offline-run-*"))
    [log_file] = list(offline.glob("run-*.wandb"))
    logged = []
    for data in wandb_records(log_file):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            if "train/reward" in row:
                logged.append((row["_step"], row["train/reward"]))
    expected = [(r["step"], r["reward"]) for r in records if r["kind"] == "train"]
    assert [s for s, _ in logged] == [s for s, _ in expected]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected])


def test_a_chart_labels_its_x_axis_at_round_values():
    import re

    from gymloop.tracking.report import _line_chart

    labels = lambda svg: re.findall(r'class="xtick">([^<]+)<', svg)  # noqa: E731
    assert labels(_line_chart("pass@1", [0, 100, 250, 600], [0.1, 0.5, 0.6, 0.8], "pass@1")) == ["0", "200", "400", "600"]
    assert labels(_line_chart("rounds", [1, 2, 3], [0.2, 0.4, 0.9], "pass@1", xlabel="round")) == ["1", "2", "3"]
