"""gymloop's bridge to a verifiers environment (the v0 API: `load_environment(**args)` -> an
Environment with a dataset and a Rubric), run by verifiers' runtime python (its own venv), so it
imports nothing of gymloop. The environment's own code builds its dataset and scores with its
own rubric; gymloop speaks to this process in JSON lines.

    python -P verifiers_bridge.py ENV_ID ARGS_JSON [--path DIR ...]

It prints {"ready": true, "multi_turn": ...} and answers each request line {"id", "op", ...}:
- rows {split: train|eval}: the split's rows (prompt messages, answer, info, example_id);
- score {split, index, completion}: the rubric's reward and metrics for that row's completion.
"""
from __future__ import annotations

import asyncio
import json
import sys
import threading


def jsonable(value):
    """Messages and rows as plain JSON (verifiers keeps pydantic messages)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def main() -> None:
    env_id, args = sys.argv[1], json.loads(sys.argv[2])
    for i, a in enumerate(sys.argv):
        if a == "--path":
            sys.path.insert(0, sys.argv[i + 1])
    out, lock = sys.stdout, threading.Lock()
    sys.stdout = sys.stderr                  # what the environment prints stays off the protocol
    import verifiers as vf
    from verifiers.types import ClientConfig

    env = vf.load_environment(env_id, **args)
    splits = {"train": env.dataset if env.dataset is not None else env.eval_dataset,
              "eval": env.eval_dataset if env.eval_dataset is not None else env.dataset}
    rows = {k: [dict(r) for r in d] for k, d in splits.items()}
    # the state's client is never called: gymloop generated the completion being scored
    nowhere = ClientConfig(api_base_url="http://127.0.0.1:9/v1", api_key_var="GYMLOOP_UNUSED")

    def reply(obj: dict) -> None:
        with lock:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    async def handle(req: dict) -> dict:
        if req["op"] == "rows":
            return {"rows": jsonable([{k: r.get(k) for k in ("prompt", "answer", "info", "example_id")}
                                      for r in rows[req["split"]]])}
        if req["op"] == "score":
            state = await env.init_state(dict(rows[req["split"]][req["index"]]), client=nowhere, model="gymloop")
            state["completion"] = req["completion"]
            await env.rubric.score_rollout(state)
            return {"reward": state["reward"], "metrics": state["metrics"]}
        raise ValueError(f"unknown op {req['op']!r}")

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def run(req: dict) -> None:
        try:
            reply({"id": req["id"], "ok": True, **await handle(req)})
        except Exception as exc:  # noqa: BLE001 - the environment's error, sent to gymloop
            reply({"id": req["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"})

    multi = isinstance(env, vf.MultiTurnEnv) and not isinstance(env, vf.SingleTurnEnv)
    reply({"ready": True, "multi_turn": multi, "kind": type(env).__name__})
    for line in sys.stdin:
        if line.strip():
            asyncio.run_coroutine_threadsafe(run(json.loads(line)), loop)


if __name__ == "__main__":
    main()
