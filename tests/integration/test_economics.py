"""The ledger and the report: sums consistent with the wall clock, prices applied, metrics
derived from counted tokens and stored scores; bad profiles fail naming the field."""
from __future__ import annotations

import json
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gymloop.config import TrainConfig
from gymloop.accounting.ledger import ProfileError, load_profiles


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir):
    from gymloop.orchestrator.train import train

    root = tmp_path_factory.mktemp("eco")
    cfg = TrainConfig.model_validate({
        "model": str(tiny_model_dir), "run_dir": str(root), "sampling": {"max_new_tokens": 4},
        "grpo": {"steps": 8, "prompts_per_step": 4, "group_size": 4, "drop_zero_signal": False},
        "eval": {"tasks": 20, "every": 2, "max_new_tokens": 4}})
    t0 = time.perf_counter()
    summary = train(cfg, progress=False, echo=lambda m: None)
    return summary, time.perf_counter() - t0


def test_phase_seconds_sum_to_the_wall_clock(tiny_run):
    """Every second of the run is in a phase (what no phase timed is "other"), so the phases add
    up to the run's own clock, and to no more than the clock around it."""
    summary, measured = tiny_run
    eco = summary["economics"]
    total = sum(p["seconds"] for p in eco["phases"].values())
    assert total == pytest.approx(summary["wall_seconds"], abs=1e-9) and total <= measured
    assert all(p["seconds"] >= 0 for p in eco["phases"].values()) and "other" in eco["phases"]
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
    from gymloop.models.checkpoint import load_model

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


def test_cost_to_maintain_sums_rounds_until_the_score_is_back():
    from gymloop.accounting.ledger import cost_to_maintain

    rounds = [{"round": r, "dollars": 0.01 * r, "served": {"tools@v2": s}, "production": {"tools@v2": p}}
              for r, s, p in [(1, 0.8, 0.9), (2, 0.3, 0.2), (3, 0.5, 0.6), (4, 0.79, 0.85)]]
    events = [{"round": 2, "env": "tools@v2", "kind": "eval", "before": 0.8, "after": 0.3},
              {"round": 2, "env": "tools@v2", "kind": "production", "before": 0.1, "after": 0.8},
              {"round": 4, "env": "tools@v2", "kind": "eval", "before": 0.95, "after": 0.79}]
    eval_drift, prod_drift, unrecovered = cost_to_maintain(rounds, events, epsilon=0.02)
    # back within epsilon (0.79 >= 0.8 - 0.02) in round 4: rounds 2..4 paid for it
    assert eval_drift["recovered_round"] == 4
    assert eval_drift["dollars"] == pytest.approx(sum(r["dollars"] for r in rounds[1:]))
    # production: pre-drift success 1 - 0.1 = 0.9; 0.85 is not within 0.02 of it
    assert prod_drift["pre_drift"] == pytest.approx(0.9) and prod_drift["recovered_round"] is None
    assert prod_drift["status"] == "not yet"
    assert unrecovered["dollars"] == pytest.approx(rounds[3]["dollars"]) and unrecovered["status"] == "not yet"
    # production measured after the last round counts: back at 0.9, paid for by rounds 2..4
    _, late, _ = cost_to_maintain(rounds, events, epsilon=0.02, production_after={"tools@v2": 0.9})
    assert late["recovered_round"] == 4 and late["status"] == "recovered after round 4"
    assert late["dollars"] == pytest.approx(sum(r["dollars"] for r in rounds[1:]))


@pytest.fixture(scope="module")
def drift_loop(tmp_path_factory, tiny_model_dir):
    """A two-round loop on the learnable digit task whose served model had scored 0.9 before the
    world changed: round 1 sees the drop (a drift event), trains, and is promoted."""
    from conftest import DigitEnv, digit_loop_cfg

    import gymloop.envs
    from gymloop.loop.rounds import run_loop
    from gymloop.store import Store

    root = tmp_path_factory.mktemp("loop")
    gymloop.envs.REGISTRY.register("digit", lambda **kw: DigitEnv(), "a test environment")
    try:
        cfg = digit_loop_cfg(root, tiny_model_dir, name="drifty", rounds=2, gate={"delta": 0.2, "epsilon": 0.05})
        store = Store(cfg.store)
        store.versions.add(str(tiny_model_dir), parent=None, status="promoted", scores={"digit": 0.9})
        rounds = run_loop(cfg, echo=lambda m: None)
    finally:
        gymloop.envs.REGISTRY.unregister("digit")
    return cfg, store, rounds, json.loads((Path(cfg.run_dir) / "drifty" / "summary.json").read_text())


def test_loop_rounds_are_in_the_ledger_and_add_up(drift_loop):
    cfg, store, rounds, summary = drift_loop
    costs = store.ledger.round_costs("drifty")
    assert sorted(costs) == [1, 2]
    price = load_profiles()[cfg.cost.profile].usd_per_hour
    for r, row in zip(rounds, summary["rounds"]):
        phases = costs[r["round"]]
        assert {"generation", "training", "gate_evaluation"} <= set(phases)
        seconds = sum(p["seconds"] for p in phases.values())
        assert seconds == pytest.approx(r["finished"] - r["started"], abs=1e-6)     # "other" included
        assert row["dollars"] == pytest.approx(seconds * price / 3600)
    assert summary["post_training_dollars"] == pytest.approx(sum(r["dollars"] for r in summary["rounds"]))
    # projections: the rounds' FLOPs on every other profile, labelled as such
    flops = sum(p["flops"] for c in costs.values() for p in c.values())
    assert flops > 0 and summary["flops"] == pytest.approx(flops)
    others = {k: v for k, v in load_profiles().items() if k != cfg.cost.profile}
    assert set(summary["projections"]) == set(others)
    for name, p in summary["projections"].items():
        seconds = flops / (others[name].peak_flops * cfg.cost.utilisation)
        assert p["projection"] is True and p["seconds"] == pytest.approx(seconds)
        assert p["dollars"] == pytest.approx(seconds * others[name].usd_per_hour / 3600)


def test_drift_recovery_is_costed_from_the_store(drift_loop):
    cfg, store, rounds, summary = drift_loop
    assert rounds[0]["status"] == "promoted" and rounds[0]["metrics"]["after"]["digit"] >= 0.9 - cfg.gate.epsilon
    [event] = store.versions.drift_events()
    assert (event["round"], event["kind"], event["before"]) == (1, "eval", 0.9)
    [maintain] = summary["cost_to_maintain"]
    assert maintain["recovered_round"] == 1 and maintain["status"] == "recovered in round 1"
    assert maintain["dollars"] == pytest.approx(summary["rounds"][0]["dollars"])
    first = summary["rounds"][0]
    gained = 100 * (first["after"]["digit"] - first["before"]["digit"])
    assert first["promotion_points_per_dollar"] == pytest.approx(gained / first["dollars"])
    assert summary["intelligence_per_dollar"] == pytest.approx(summary["points_gained"] / summary["post_training_dollars"])


def test_loop_report_draws_every_chart(drift_loop):
    from gymloop.cli import main

    cfg, *_ = drift_loop
    loop_dir = Path(cfg.run_dir) / "drifty"
    assert main(["report", str(loop_dir)]) == 0
    page = (loop_dir / "report.html").read_text()
    dom = _Dom()
    dom.feed(page)
    # the production chart has no data in this loop (no traffic); the others are drawn
    assert len(dom.figures) == 7 and set(dom.figures) - set(dom.marks) == {"Production success rate per round"}
    assert "recovered in round 1" in page and "drift digit" in page and "Projections to other hardware" in page


def test_demo_serves_production_traffic_and_prints_what_summary_json_says(tmp_path, tiny_model_dir):
    from gymloop.cli import before_after_table
    from gymloop.demos.learn import run_demo
    from gymloop.store import Store

    cfg = TrainConfig.model_validate({
        "model": str(tiny_model_dir), "run_dir": str(tmp_path), "sampling": {"max_new_tokens": 4},
        "grpo": {"steps": 2, "prompts_per_step": 4, "group_size": 2, "drop_zero_signal": False},
        "eval": {"tasks": 10, "every": 0, "max_new_tokens": 4}})
    summary = run_demo(cfg, progress=False, echo=lambda m: None, requests=24)
    run = Path(summary["run_dir"])
    on_disk = json.loads((run / "summary.json").read_text())
    sv = on_disk["serving"]
    store = Store(sv["store"])
    rows = store.ledger.rows("serving")
    assert sv["errors"] == [] and sv["episodes"] == 24 and sv["requests"] == store.count("traces") == 24
    assert sv["feedback"] == 24 and store.count("feedback") == 24
    assert sv["served_tokens"] == sum(r["served_tokens"] for r in rows) > 0
    assert sv["cost_per_1m_served_tokens"] == pytest.approx(
        sum(r["dollars"] for r in rows) / sum(r["served_tokens"] for r in rows) * 1e6)
    rewards = [t["reward"] for t in store.traces.graded()]          # one verdict per episode (24 above)
    assert len(rewards) == 24
    assert sv["production_success"] == pytest.approx(sum(r >= 1 for r in rewards) / len(rewards))
    text = before_after_table(on_disk)
    assert f"${sv['cost_per_1m_served_tokens']:.4f} per 1M served tokens" in text
    eco = on_disk["economics"]
    assert f"post-training ${eco['post_training_dollars']:.4f}" in text
    ipd = eco["intelligence_per_dollar"]
    assert ("n/a" if ipd is None else f"{ipd:,.0f} held-out points per $") in text
    assert "cost per 1M served tokens" in (run / "report.html").read_text()
