"""The report and the dashboard in headless Chromium: no console errors, every chart drawn
(checked in the DOM after scripts ran), a screenshot kept in test-artifacts/."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium missing: apt-get install chromium (make test does)")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=6000"]


def chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=120)


def console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines()
            if "CONSOLE" in ln and re.search(r"error|uncaught", ln, re.I)]


class Charts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts, self.marks, self.attrs = [], {}, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure" and "chart" in (a.get("class") or ""):
            self.charts.append(a.get("data-chart"))
        if tag in ("polyline", "rect", "circle") and self.charts:
            self.marks[self.charts[-1]] = self.marks.get(self.charts[-1], 0) + 1
        if tag == "body":
            self.attrs = a


def check_page(url: str, tmp_path: Path, name: str) -> Charts:
    dom = chromium(url, tmp_path / "profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_errors(dom.stderr) == [], console_errors(dom.stderr)
    charts = Charts()
    charts.feed(dom.stdout)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    r = chromium(url, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,1400")
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000
    return charts


def test_report_renders_in_chromium(tmp_path, tiny_model_dir):
    from gymloop.config import TrainConfig
    from gymloop.tracking.report import write_report
    from gymloop.orchestrator.train import train

    cfg = TrainConfig.model_validate({
        "model": str(tiny_model_dir), "run_dir": str(tmp_path / "runs"), "sampling": {"max_new_tokens": 4},
        "grpo": {"steps": 6, "prompts_per_step": 4, "group_size": 4, "drop_zero_signal": False},
        "eval": {"tasks": 20, "every": 2, "max_new_tokens": 4}})
    summary = train(cfg, progress=False, echo=lambda m: None)
    page = write_report(summary["run_dir"])
    charts = check_page(page.as_uri(), tmp_path, "report")
    assert len(charts.charts) == 4 and all(charts.marks.get(c, 0) > 0 for c in charts.charts), charts.marks


def test_loop_report_renders_in_chromium(tmp_path, tiny_model_dir, monkeypatch):
    from conftest import DigitEnv, digit_loop_cfg, use_env

    from gymloop.loop.rounds import run_loop
    from gymloop.store import Store

    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    cfg = digit_loop_cfg(tmp_path, tiny_model_dir, grpo={"steps": 10}, name="seen", rounds=2)
    store = Store(cfg.store)
    store.versions.add(str(tiny_model_dir), parent=None, status="promoted", scores={"digit": 0.9})
    for i in range(6):       # production traffic with verdicts, so the success chart has points
        tid = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                              completion_tokens=1, latency_s=0.1)
        store.traces.add_feedback(tid, reward=float(i % 2), env="digit", task_id=f"d{i}")
    # the test's environment cannot rebuild a task from its id: said, not silently dropped
    with pytest.warns(UserWarning, match="no task_from_id"):
        run_loop(cfg, echo=lambda m: None)
    charts = check_page((tmp_path / "runs" / "seen" / "report.html").as_uri(), tmp_path, "loop-report")
    assert len(charts.charts) == 7 and all(charts.marks.get(c, 0) > 0 for c in charts.charts), charts.marks


def test_dashboard_renders_live_data_in_chromium(tmp_path, tiny_model_dir):
    from openai import OpenAI

    from gymloop.serve import ServeConfig, build, shutdown

    from conftest import running_server
    from test_serve import KEY

    cfg = ServeConfig(model=str(tiny_model_dir), model_name="tiny", db=str(tmp_path / "d.db"), api_keys=[KEY])
    app, batcher, store = build(cfg)
    store.versions.ensure_run("demo", {})
    base_v = store.versions.add(str(tiny_model_dir), parent=None, status="promoted", scores={"arith": 0.2})
    for r, (status, score) in enumerate([("promoted", 0.3), ("rejected", 0.25), ("promoted", 0.4)], 1):
        store.versions.commit_round("demo", r, path=str(tiny_model_dir), parent=base_v, status=status,
                           scores={"arith": score}, started=time.time(),
                           metrics={"after": {"arith": score}, "economics": {"post_training_dollars": 0.001}})
    ctx = running_server(app)
    base = ctx.__enter__()
    try:
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        for i in range(3):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"{i}+1="}], max_tokens=3)
        httpx.post(base + "/v1/chat/completions", json={"model": "tiny", "messages": []})      # a 401
        data = httpx.get(base + "/v1/dashboard").json()
        assert data["stats"]["traces"] == 3 and len(data["rounds"]) == 3 and data["requests"]["401"] == 1
        charts = check_page(base + "/", tmp_path, "dashboard")
        assert charts.attrs.get("data-ready") == "1"
        assert charts.marks.get("target score per round", 0) >= 3      # the line and a dot per promotion
        assert charts.marks.get("requests by status", 0) >= 2           # a bar for 200 and for 401
    finally:
        ctx.__exit__(None, None, None)
        shutdown(app)
