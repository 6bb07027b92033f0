"""The loop on an agent program (`gymloop demo --only program`, configs/demo-program.yaml): the
continuous loop of chapter 2, where production is a team's own program, unchanged, and what the
loop learns from is its sessions' feedback alone.

    serve nano-tools -> each pass: production runs the program (an OpenAI Agents SDK clerk,
       examples/agents/inventory.py) against the server, one session per task (its calls carry
       x-gymloop-session and the task in x-gymloop-task), and posts the program's own verdict on
       the session -> one loop round on the `agent` environment (failed sessions' tasks re-run by
       the program under GRPO, the gate on held-out tasks through the program, promotion; the
       server swaps weights live)
    -> mid-run the inventory service renames its tools (get_stock/add_stock -> lookup_item/restock):
       the team deploys the program on the new API, production collapses (the model calls the old
       names, which the program no longer has), and the loop recovers from the sessions' feedback.

No task id of a gymloop environment is involved: a session's task is what the program named.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Callable

from pydantic import Field

from ..config import EnvSpec, _Strict
from ..accounting.ledger import load_profiles
from ..seeds import round_seed
from ..loop.config import LoopConfig
from ..loop.rounds import run_loop, suite_envs, write_loop_files
from ..tracking.run_dir import new_run_path, write_json
from .loop import _wait_for, story_summary


class ProgramDemoConfig(_Strict):
    """The loop chapter on an agent program: the program before and after its tool API changed, its
    tasks, and each round's loop config."""

    model: str = Field("nano-tools", description="Base model served and trained (bases/registry.py MODELS).")
    harness_before: str = Field("inventory:run_v1", description="The program production runs before the API "
                                "change ('module:function', as the agent environment's harness).")
    harness_after: str = Field("inventory:run", description="... and after it (the team's new deployment).")
    path: str = Field("examples/agents", description="The directory the program's module is in.")
    tasks: str = Field("examples/agents/inventory-tasks.jsonl", description="The program's tasks (train: what "
                       "production asks and fresh training draws; heldout: the gate's).")
    rounds_before: int = Field(1, ge=0, description="Loop rounds while the first API is in force (0: its "
                               "production is measured once, nothing is trained).")
    rounds_after: int = Field(4, ge=1, description="Loop rounds after the change.")
    requests_per_round: int = Field(64, ge=10, description="Production sessions between rounds.")
    concurrency: int = Field(16, ge=1, description="Production sessions at once.")
    store: str | None = Field(None, description="The store the server and the loop share (default: story.db in "
                              "the run directory).")
    loop: LoopConfig = Field(default_factory=LoopConfig, description="Each round's loop config (sampling, GRPO, "
                             "gate, curriculum, drift, seed): the chapter sets its model, store, run directory, "
                             "environment (the program in force) and rounds.")


def agent_spec(cfg: ProgramDemoConfig, harness: str, root: Path) -> EnvSpec:
    """The `agent` environment of the program in force."""
    return EnvSpec(name="agent", options={"harness": harness, "path": str(root / cfg.path),
                                          "tasks": str(root / cfg.tasks), "concurrency": 64, "timeout_s": 60})


def production(base_url: str, key: str, model: str, runner, tasks: list, concurrency: int,
               label: str) -> dict:
    """One pass of production: the program runs each task as a session of its own (its calls carry
    the session and the task), then its own verdict is posted as the session's feedback."""
    import httpx
    from openai import AsyncOpenAI

    async def main() -> list[float | None]:
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=120) as http:
            async def one(i: int, task: dict) -> float | None:
                sid = f"{label}-{i}-{secrets.token_hex(4)}"
                client = AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, http_client=http,
                                     default_headers={"x-gymloop-session": sid, "x-gymloop-task": json.dumps(task)})
                async with gate:
                    try:
                        out = await runner(task, client, model)
                    except Exception:  # noqa: BLE001 - a failed program is counted, not a verdict
                        return None
                reward = out["reward"] if isinstance(out, dict) else float(out)
                r = await http.post(base_url + "/v1/feedback", json={"session_id": sid, "reward": reward},
                                    headers={"authorization": f"Bearer {key}"})
                r.raise_for_status()
                return reward

            return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))

    rewards = asyncio.run(main())
    done = [r for r in rewards if r is not None]
    return {"episodes": len(done), "errors": len(rewards) - len(done),
            "production_success": sum(r >= 1 for r in done) / max(len(done), 1)}


def run_program_demo(cfg: ProgramDemoConfig, run_dir: str | Path = "runs", progress: bool = True,
                     echo: Callable[[str], None] = print, root: Path = Path(".")) -> dict:
    """The chapter (see the module docstring); `root`: the directory the config's paths are in."""
    from ..agents.programs import load_function
    from ..bases.registry import resolve_model
    from ..envs import make_env
    from ..serve import ServeConfig
    from ..serve.background import serving

    t0 = time.perf_counter()
    out = new_run_path(run_dir, "program")
    base = str(resolve_model(cfg.model, progress=progress))
    key = "sk-story-" + secrets.token_hex(8)
    echo(f"story directory: {out}")
    root = root.resolve()
    if not (root / cfg.path).is_dir():
        raise FileNotFoundError(f"the program chapter runs {cfg.path}/ of a gymloop checkout; {root / cfg.path} "
                                "is not there (run it from a checkout)")
    passes = ([(cfg.harness_before, True)] * cfg.rounds_before or [(cfg.harness_before, False)]) + \
        [(cfg.harness_after, True)] * cfg.rounds_after + [(cfg.harness_after, False)]
    rows: list[dict] = []
    db = cfg.store or str(out / "story.db")
    r = 0
    with serving(ServeConfig(model=base, model_name="gymloop-agent", db=db, api_keys=[key], poll_s=0.5,
                             default_max_tokens=cfg.loop.sampling.max_new_tokens,
                             engine_dtype=cfg.loop.engine_dtype)) as (url, batcher, store):
        if store.versions.list():
            raise ValueError(f"the story needs an empty store; {store.url} already holds model versions")
        store.versions.add(base, parent=None, status="promoted", scores={})
        for i, (harness, trains) in enumerate(passes):
            if i and harness != passes[i - 1][0]:
                echo(f"the inventory API changes: the team deploys {harness} (tools renamed); the loop is told nothing")
            _wait_for(batcher, store.versions.promoted()["version"])
            spec = agent_spec(cfg, harness, root)
            env = make_env(spec.name, **spec.options)
            tasks = [dict(t.info) for t in env.sample_tasks(cfg.requests_per_round, "train",
                                                            seed=round_seed(cfg.loop.seed, i + 1))]
            env.close()
            traffic = production(url, key, "gymloop-agent", load_function(harness, str(root / cfg.path)), tasks,
                                 cfg.concurrency, f"pass{i + 1}")
            row = {"round": r + 1 if trains else None, "api": harness, "served_version": batcher.version, **traffic}
            echo(f"production {f'before round {r + 1}' if trains else 'measured'}: {harness}, served "
                 f"v{batcher.version}, success {traffic['production_success']:.1%} of {traffic['episodes']} sessions")
            if trains:
                r += 1
                loop_cfg = cfg.loop.model_copy(update=dict(
                    model=base, store=db, run_dir=str(out), name="story", rounds=r, suites=[], env=spec))
                last = run_loop(loop_cfg, progress=progress, echo=echo)[-1]
                row.update(status=last["status"], candidate_version=last["metrics"]["version"],
                           before=last["metrics"]["before"], after=last["metrics"]["after"],
                           drift=[e["kind"] for e in last["metrics"]["drift"]],
                           production_tasks_per_step=last["metrics"]["curriculum"].get("production_per_step"))
            rows.append(row)
        write_loop_files(store, loop_cfg, suite_envs(loop_cfg.gate_run())[0].name, out / "story",
                         load_profiles(loop_cfg.cost.profiles_file))
        sessions = {"sessions": store.count("sessions"), "calls": store.count("session_calls"),
                    "judged": store.count("session_feedback")}
    loop = json.loads((out / "story" / "summary.json").read_text())
    loop["cost_per_1m_served_tokens"] = store.ledger.stats()["cost_per_1m_served_tokens"]
    summary = {**story_summary(cfg, rows, loop, time.perf_counter() - t0), **sessions}
    write_json(out / "story.json", summary)
    return {**summary, "dir": str(out), "report": str(out / "story" / "report.html")}
