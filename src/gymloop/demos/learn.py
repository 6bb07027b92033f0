"""`gymloop demo` chapter 1 (`--only learn`): pre-train nano (cached) -> GRPO on 2-digit
addition -> held-out eval -> serve the trained model behind the OpenAI-compatible API and
send it production traffic through the official `openai` client, with the verifier's
verdicts as feedback -> report.

The serving numbers (requests, served tokens, cost per 1M served tokens, production success)
are read back from the store's ledger and written into the run's summary.json, which the
printed summary and report.html are made from.
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Callable

from ..config import TrainConfig
from ..tracking.run_dir import write_json


def serve_and_measure(run_dir: Path, cfg: TrainConfig, requests: int, concurrency: int = 16) -> dict:
    """Serve the run's checkpoint on loopback, send `requests` held-out episodes, return the
    serving section of the summary (from the store, not from the client's counters)."""
    from ..envs import make_env
    from ..serve import ServeConfig
    from ..serve.background import serving
    from .traffic import send_traffic

    key = "sk-demo-" + secrets.token_hex(8)
    scfg = ServeConfig(model=str(run_dir / "checkpoint"), model_name="gymloop-demo", db=str(run_dir / "serve.db"),
                       api_keys=[key], cost_profile=cfg.cost.profile, threads=cfg.threads)
    env = make_env(cfg.env.name, **cfg.env.options)
    # Production asks questions the model was never trained on: held-out tasks, another seed.
    tasks = env.sample_tasks(requests, "heldout", seed=cfg.seed + 1)
    with serving(scfg) as (base, _, store):
        traffic = send_traffic(base, key, "gymloop-demo", env, tasks, concurrency=concurrency,
                               max_tokens=cfg.eval.max_new_tokens, max_turns=cfg.env.max_turns)
    rows = store.ledger.rows("serving")
    stats = store.ledger.stats()          # serving dollars and cost per 1M served tokens, from the same rows
    return {
        "store": scfg.db, "requests": stats["traces"], "episodes": traffic.episodes,
        "errors": traffic.errors, "production_success": traffic.success_rate,
        "feedback": store.count("feedback"),
        "served_tokens": sum(r["served_tokens"] for r in rows), "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "engine_seconds": sum(r["seconds"] for r in rows), "dollars": stats["serving_dollars"],
        "cost_per_1m_served_tokens": stats["cost_per_1m_served_tokens"],
    }


def run_demo(cfg: TrainConfig, progress: bool = True, echo: Callable[[str], None] = print,
             requests: int = 128) -> dict:
    """Train, serve, report; returns the summary as written to summary.json."""
    from ..tracking.report import write_report
    from ..orchestrator.train import train

    summary = train(cfg, progress=progress, echo=echo)
    run_dir = Path(summary["run_dir"])
    echo(f"serving the trained model: {requests} production requests through the openai client")
    summary["serving"] = serve_and_measure(run_dir, cfg, requests)
    write_json(run_dir / "summary.json", summary)
    write_report(run_dir)
    return json.loads((run_dir / "summary.json").read_text())
