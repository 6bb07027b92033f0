"""The ledger and the report: sums consistent with the wall clock, prices applied, metrics
derived from counted tokens and stored scores; bad profiles fail naming the field."""
from __future__ import annotations

import json
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gymloop.config import TrainConfig
from gymloop.ledger import ProfileError, load_profiles


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir):
    from gymloop.train import train

    root = tmp_path_factory.mktemp("eco")
    cfg = TrainConfig.model_validate({
        "model": str(tiny_model_dir), "run_dir": str(root), "sampling": {"max_new_tokens": 4},
        "grpo": {"steps": 8, "prompts_per_step": 4, "group_size": 4, "drop_zero_signal": False},
        "eval": {"tasks": 20, "every": 2, "max_new_tokens": 4}})
    t0 = time.perf_counter()
    summary = train(cfg, progress=False, echo=lambda m: None)
    return summary, time.perf_counter() - t0


def test_phase_seconds_sum_to_the_wall_clock(tiny_run):
    summary, measured = tiny_run
    eco = summary["economics"]
    total = sum(p["seconds"] for p in eco["phases"].values())
    assert abs(total - measured) / measured <= 0.05, (total, measured)
    assert abs(eco["seconds"] - total) < 1e-9


def test_dollars_are_seconds_times_price(tiny_run):
    eco = tiny_run[0]["economics"]
    price = load_profiles()[eco["profile"]].usd_per_hour
    for p in eco["phases"].values():
        assert p["dollars"] == pytest.approx(p["seconds"] * price / 3600)
    assert eco["dollars"] == pytest.approx(eco["seconds"] * price / 3600)


def test_cost_per_token_and_intelligence_per_dollar_follow_the_records(tiny_run):
    summary, _ = tiny_run
    eco = summary["economics"]
    gen = eco["phases"]["generation"]
    records = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    counted = sum(r["generated_tokens"] for r in records if r["kind"] == "train")
    assert gen["generated_tokens"] == counted > 0
    assert eco["cost_per_1m_generated_tokens"] == pytest.approx(gen["dollars"] / counted * 1e6)
    points = 100 * (summary["final"]["pass1"] - summary["base"]["pass1"])
    assert eco["points_gained"] == pytest.approx(points)
    if eco["post_training_dollars"] > 0:
        assert eco["intelligence_per_dollar"] == pytest.approx(points / eco["post_training_dollars"])
    n = eco["phases"]["training"]
    assert n["flops"] == pytest.approx(6 * summary_params(summary) * n["trained_tokens"])
    for p in eco["projections"].values():
        assert p["projection"] is True and "FLOPs at" in p["assumption"]


def summary_params(summary) -> int:
    from gymloop.checkpoint import load_model

    return sum(p.numel() for p in load_model(summary["model_path"])[0].parameters())


class _Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.figures, self.marks, self.stack = [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure" and a.get("class") == "chart":
            self.figures.append(a["data-chart"])
        if tag in ("polyline", "rect") and self.figures:
            self.marks.append(self.figures[-1])


def test_report_renders_every_chart(tiny_run):
    from gymloop.cli import main

    run = Path(tiny_run[0]["run_dir"])
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    dom = _Dom()
    dom.feed(page)
    assert len(dom.figures) == 4 and set(dom.figures) == set(dom.marks), (dom.figures, dom.marks)
    assert "http://" not in page and "https://" not in page          # self-contained
    assert "intelligence per dollar" in page and "projection" in page.lower()


@pytest.mark.parametrize("body,needle", [
    ("usd_per_hour: -1", "profile 'bad', field 'usd_per_hour'"),
    ("usd_per_hour: 1\n    colour: red", "profile 'bad', field 'colour': unknown field"),
])
def test_bad_profile_names_profile_and_field(tmp_path, body, needle):
    f = tmp_path / "p.yaml"
    f.write_text(f"profiles:\n  bad:\n    kind: gpu\n    peak_flops: 1.0e15\n    assumption: x\n    {body}\n")
    with pytest.raises(ProfileError) as exc:
        load_profiles(f)
    assert needle in str(exc.value)


def test_shipped_profiles_load():
    p = load_profiles()
    assert {"cpu-2vcpu", "h100", "h200", "b200", "gb200"} <= set(p)
    assert all(x.assumption and "2026" in x.assumption for x in p.values())
