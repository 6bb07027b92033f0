"""The demo's loop chapters (`gymloop demo --only loop`, configs/demo-loop.yaml, and `--only agent`,
configs/demo-agent.yaml): the continuous loop, whole, on one machine.

    pre-train nano-tools (cached) -> serve it (OpenAI-compatible API, store-following)
    -> each round: production traffic through the official `openai` client (tools episodes,
       the environment's verifier posts each verdict as feedback) -> one loop round (curriculum
       with the production failures, GRPO, gate, promotion; the server swaps weights live)
    -> mid-run the tool API changes (tools@v1 -> tools@v3: get_stock/add_stock become
       lookup_item/restock, item/count become sku/quantity): every call by an old name is an
       error, production success collapses, the loop records a drift event, trains on the new
       failures, and production success recovers.

The agent's prompt does not list its tools (`schemas: false`): it knows them from training, as a
fine-tuned production agent with a short prompt does. Nothing the model sees changes with the
API, so the old behaviour fails by construction, whatever the base. Recovery is learnable because
nano-tools saw v3 transcripts too (40% of its tool transcripts) and samples the new API now and
then, never greedily (bases/nano.py).

Production asks train-split tasks (they become training tasks when they fail); the gate's
suites are held-out tasks, so promotion is judged on problems never trained on.

The agent chapter (`--only agent`) is the same story with a real model and tools in the request:
SmolLM2-135M-Instruct taught to call tools by a supervised job (`smollm2-calls`,
demos/smollm2_calls.py) serves the `calls` environment, whose schemas travel in every request;
the drift (calls@v1 -> calls@v2) renames every tool and argument in those schemas. A model that
reads them can adapt; what the supervised job made it memorise fights it.
"""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, model_validator

from ..config import EnvSpec, _Strict
from ..accounting.ledger import load_profiles
from ..seeds import round_seed
from ..loop.config import LoopConfig
from ..loop.rounds import run_loop, suite_envs, write_loop_files
from ..tracking.run_dir import new_run_path, write_json


class LoopDemoConfig(_Strict):
    """A loop chapter of the demo (configs/demo-loop.yaml, configs/demo-agent.yaml): what production
    asks and when its tool API changes; each round is a `gymloop run` round of `loop`."""

    model: str = Field("nano-tools", description="Base model served and trained (bases/registry.py MODELS).")
    env: Literal["tools", "calls"] = Field("tools", description="What production asks (STORY_ENVS): tools (a "
                                           "multi-turn inventory API) or calls (function calling, the schemas "
                                           "in the request).")
    rounds_before: int = Field(1, ge=0, description="Loop rounds while the tool API is the first one (0: its "
                               "production is measured once, nothing is trained).")
    rounds_after: int = Field(5, ge=1, description="Loop rounds after it changed.")
    api_before: int = Field(1, ge=1, le=3, description="Tool API version before the change.")
    api_after: int = Field(3, ge=1, le=3, description="Tool API version after it (tools@v3 renames the tools "
                           "and their arguments: an old call is an error; calls@v2 renames them in the schemas).")
    schemas: bool = Field(False, description="Show the tool schemas in the agent's prompt (see the module "
                          "docstring: without them an API change cannot be read off the prompt).")
    requests_per_round: int = Field(64, ge=10, description="Production episodes between rounds (also the drift "
                                    "detector's window).")
    concurrency: int = Field(16, ge=1, description="Concurrent production clients.")
    store: str | None = Field(None, description="The store the server and the loop share: an empty PostgreSQL "
                              "database's URL, or a SQLite file (default: story.db in the run directory).")
    loop: LoopConfig = Field(default_factory=LoopConfig, description="Each round's loop config: sampling, GRPO, "
                             "gate, curriculum, drift, seed, engine_dtype. The chapter sets its model, store, "
                             "run directory, environment (the API version in force), rounds and drift window.")

    @model_validator(mode="after")
    def _known_versions(self) -> "LoopDemoConfig":
        known = STORY_ENVS[self.env].changes
        for v in (self.api_before, self.api_after):
            if v not in known:
                raise ValueError(f"{self.env} has API versions {sorted(known)}, not {v}")
        return self

    @property
    def max_new_tokens(self) -> int:
        """Tokens per model turn, in training, evaluation and production alike."""
        return self.loop.sampling.max_new_tokens


@dataclass(frozen=True)
class StoryEnv:
    """What a story's production runs: the environment's options for an API version, turns per
    episode, and what each version changed (for the narration)."""

    options: Callable[[LoopDemoConfig, int], dict]
    max_turns: int
    changes: dict[int, str]


STORY_ENVS: dict[str, StoryEnv] = {
    "tools": StoryEnv(lambda cfg, v: {"version": v, "schemas": cfg.schemas}, 3, {
        1: "the first API", 2: 'results now come back as {"sku", "quantity"}',
        3: "get_stock/add_stock renamed lookup_item/restock, arguments sku/quantity: an old call is an error"}),
    # held-out requests on production's own tools: the gate measures what production asks
    "calls": StoryEnv(lambda cfg, v: {"version": v, "heldout": "requests"}, 1, {
        1: "the first API", 2: "every tool and argument renamed in the request's schemas, e.g. get_weather(city) "
                               "-> weather_now(location)"}),
}


def round_config(cfg: LoopDemoConfig, out: Path, base: str, version: int, rounds: int, db: str) -> LoopConfig:
    """The loop config of the chapter's rounds so far: `cfg.loop` on the story's model, store and
    run directory, its environment at API `version`, its drift window one round of traffic (the
    round after the API change compares with the one before)."""
    story_env = STORY_ENVS[cfg.env]
    return cfg.loop.model_copy(update=dict(
        model=base, store=db, run_dir=str(out), name="story", rounds=rounds, suites=[],
        env=EnvSpec(name=cfg.env, options=story_env.options(cfg, version), max_turns=story_env.max_turns),
        drift=cfg.loop.drift.model_copy(update={"window": cfg.requests_per_round})))


def _wait_for(batcher, version: int, timeout_s: float = 60.0) -> None:
    """Until the server answers with `version` (it follows the store's promotions)."""
    deadline = time.monotonic() + timeout_s
    while batcher.version != version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"server still on v{batcher.version}, not v{version}, after {timeout_s:.0f} s")
        time.sleep(0.05)


def run_loop_demo(cfg: LoopDemoConfig, run_dir: str | Path = "runs", progress: bool = True,
                  echo: Callable[[str], None] = print) -> dict:
    from ..bases.registry import resolve_model
    from ..envs import make_env
    from ..serve import ServeConfig
    from ..serve.background import serving
    from .traffic import send_traffic

    t0 = time.perf_counter()
    out = new_run_path(run_dir, "story")
    base = str(resolve_model(cfg.model, progress=progress))
    key = "sk-story-" + secrets.token_hex(8)
    echo(f"story directory: {out}")
    if cfg.store:
        echo(f"store: {cfg.store}")
    story_env = STORY_ENVS[cfg.env]
    # production passes: (API version, whether a loop round follows); the last only measures
    passes = ([(cfg.api_before, True)] * cfg.rounds_before or [(cfg.api_before, False)]) + \
        [(cfg.api_after, True)] * cfg.rounds_after + [(cfg.api_after, False)]
    rows: list[dict] = []
    db = cfg.store or str(out / "story.db")
    r = 0                                            # loop rounds committed
    with serving(ServeConfig(model=base, model_name="gymloop-agent", db=db,
                             api_keys=[key], poll_s=0.5, default_max_tokens=cfg.max_new_tokens,
                             engine_dtype=cfg.loop.engine_dtype)) as (url, batcher, store):
        if store.versions.list():
            raise ValueError(f"the story needs an empty store; {store.url} already holds model versions")
        # The base is the first served version, so every production answer names a stored version.
        store.versions.add(base, parent=None, status="promoted", scores={})
        for i, (version, trains) in enumerate(passes):
            if i and version != passes[i - 1][0]:
                echo(f"the tool API changes: {cfg.env}@v{cfg.api_before} -> {cfg.env}@v{cfg.api_after} "
                     f"({story_env.changes[cfg.api_after]})")
            _wait_for(batcher, store.versions.promoted()["version"])
            env = make_env(cfg.env, **story_env.options(cfg, version))
            tasks = env.sample_tasks(cfg.requests_per_round, "train", seed=round_seed(cfg.loop.seed, i + 1))
            traffic = send_traffic(url, key, "gymloop-agent", env, tasks, concurrency=cfg.concurrency,
                                   max_tokens=cfg.max_new_tokens, max_turns=story_env.max_turns)
            row = {"round": r + 1 if trains else None, "api": env.name, "served_version": batcher.version,
                   "production_success": traffic.success_rate, "episodes": traffic.episodes,
                   "errors": len(traffic.errors)}
            echo(f"production {f'before round {r + 1}' if trains else 'measured'}: {env.name}, served "
                 f"v{batcher.version}, success {traffic.success_rate:.1%} of {traffic.episodes} episodes")
            if trains:
                r += 1
                loop_cfg = round_config(cfg, out, base, version, r, db)
                rounds = run_loop(loop_cfg, progress=progress, echo=echo)
                last = rounds[-1]
                row.update(status=last["status"], candidate_version=last["metrics"]["version"],
                           before=last["metrics"]["before"], after=last["metrics"]["after"],
                           drift=[e["kind"] for e in last["metrics"]["drift"]])
            rows.append(row)
        # the summary again, now with the production traffic after the last round
        write_loop_files(store, loop_cfg, suite_envs(loop_cfg.gate_run())[0].name, out / "story", load_profiles(loop_cfg.cost.profiles_file))
    loop = json.loads((out / "story" / "summary.json").read_text())
    loop["cost_per_1m_served_tokens"] = store.ledger.stats()["cost_per_1m_served_tokens"]   # incl. the last traffic
    summary = {**story_summary(cfg, rows, loop, time.perf_counter() - t0), "store": store.db.dialect}
    write_json(out / "story.json", summary)
    return {**summary, "dir": str(out), "report": str(out / "story" / "report.html")}


def story_summary(cfg: LoopDemoConfig, rows: list[dict], loop: dict, wall: float) -> dict:
    """Production success before the drift, at its worst after it, and at the end; the share of
    the drop recovered. From the rows the run recorded."""
    n_pre = max(cfg.rounds_before, 1)                # passes on the first API (one when nothing trains on it)
    pre = [x["production_success"] for x in rows[:n_pre]]
    post = [x["production_success"] for x in rows[n_pre:]]
    before, low, final = pre[-1], min(post), post[-1]
    drop = before - low
    return {
        "rows": rows, "wall_seconds": wall,
        "pre_drift_success": before, "post_drift_low": low, "final_success": final,
        "recovered_share": (final - low) / drop if drop > 0 else None,
        "by_version": by_version(rows),
        "promotions": loop["promotions"], "drift_events": loop["drift_events"],
        "cost_to_maintain": loop["cost_to_maintain"],
        "post_training_dollars": loop["post_training_dollars"],
        "cost_per_1m_served_tokens": loop["cost_per_1m_served_tokens"],
        "config": cfg.model_dump(mode="json"),
    }


def by_version(rows: list[dict]) -> list[dict]:
    """Production success of each served version on each tool API, its passes pooled (one pass's
    figure moves by ~5 points with the requests it draws; a version that served several passes
    is measured on all of them), in the order first served."""
    pooled: dict[tuple[str, int], list[float]] = {}
    for x in rows:
        hits_n = pooled.setdefault((x["api"], x["served_version"]), [0.0, 0])
        hits_n[0] += x["production_success"] * x["episodes"]
        hits_n[1] += x["episodes"]
    return [{"api": api, "version": v, "episodes": n, "success": hits / n}        # n >= requests_per_round >= 10
            for (api, v), (hits, n) in pooled.items()]
