"""gymloop's answers against OpenAI's published OpenAPI document (tests/openai_spec.py): every
operation gymloop implements, called over HTTP on a real `gymloop serve`, each answer validated
against the component the document names for that operation and status."""
from __future__ import annotations

import io
import json

import httpx
import pytest

from conftest import agent_rows, eventually, running_server
from gymloop.serve import build, shutdown
from gymloop.serve.config import ServeConfig
from openai_spec import ERROR, event_problems, problems, problems_with

KEY = "sk-conformance"
ROWS = [{"messages": [{"role": "user", "content": f"{i}+1="}, {"role": "assistant", "content": str(i + 1)}]}
        for i in range(12)]
GRADER = {"type": "string_check", "name": "eq", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
          "operation": "eq"}


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("conf")
    cfg = ServeConfig(model=str(tiny_model_dir), model_name="tiny", db=str(root / "s.db"), api_keys=[KEY],
                      jobs_dir=str(root / "jobs"), poll_s=0.2)
    app, _, _ = build(cfg)
    with running_server(app) as base:
        with httpx.Client(base_url=base + "/v1", headers={"authorization": f"Bearer {KEY}"}, timeout=120) as c:
            yield c
    shutdown(app)


# OpenAI's document has /pause and /resume, but its FineTuningJob.status enum lacks "paused": a
# paused job says so (any other status would be false), the one deviation allowed, by name.
PAUSED = "status: 'paused' is not one of ['validating_files', 'queued', 'running', 'succeeded', 'failed', 'cancelled']"


def _ok(r: httpx.Response, path: str, method: str) -> dict:
    assert r.status_code == 200, r.text
    body = r.json()
    assert [p for p in problems(path, method, body) if p != PAUSED] == [], (path, method)
    return body


def test_the_check_can_fail():
    bad = {"id": "file-1", "object": "file", "bytes": "3", "created_at": 1, "filename": "a", "purpose": "fine-tune"}
    assert any("bytes" in p for p in problems("/files/{file_id}", "get", bad))
    assert problems_with(ERROR, {"error": {"message": "m", "type": "t", "param": None, "code": None}}) == []
    assert problems_with(ERROR, {"error": {"message": 1}}) != []
    assert event_problems({"type": "response.output_text.delta", "sequence_number": 0}) != []
    assert event_problems({"type": "response.nope"}) != []


def test_chat_completions_conform(api):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    _ok(api.post("/chat/completions", json=chat), "/chat/completions", "post")
    _ok(api.post("/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 2}), "/chat/completions", "post")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    _ok(api.post("/chat/completions", json={**chat, "tools": tools}), "/chat/completions", "post")
    group = _ok(api.post("/chat/completions", json={**chat, "n": 3, "logprobs": True}), "/chat/completions", "post")
    assert len(group["choices"]) == 3
    for stream in ({**chat, "stream": True}, {**chat, "stream": True, "n": 2}):
        with api.stream("POST", "/chat/completions", json=stream) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert {c["choices"][0]["index"] for c in chunks} == set(range(stream.get("n", 1)))
        for c in chunks:
            assert problems("/chat/completions", "post", c, media="text/event-stream") == []
    _ok(api.get("/models"), "/models", "get")
    resp = _ok(api.post("/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 4}), "/responses", "post")
    _ok(api.post("/responses", json={"model": "tiny", "previous_response_id": resp["id"], "max_output_tokens": 4,
                                     "input": [{"role": "user", "content": "more"}]}), "/responses", "post")
    _ok(api.get(f"/responses/{resp['id']}"), "/responses/{response_id}", "get")
    _ok(api.post("/completions", json={"model": "tiny", "prompt": "1+1=", "max_tokens": 4, "n": 2, "logprobs": 2}),
        "/completions", "post")


def test_files_and_fine_tuning_conform(api):
    data = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    f = _ok(api.post("/files", files={"file": ("t.jsonl", io.BytesIO(data))}, data={"purpose": "fine-tune"}),
            "/files", "post")
    bad = _ok(api.post("/files", files={"file": ("b.jsonl", io.BytesIO(b"{nope\n"))}, data={"purpose": "fine-tune"}),
              "/files", "post")
    assert bad["status"] == "error"
    _ok(api.get("/files"), "/files", "get")
    _ok(api.get(f"/files/{f['id']}"), "/files/{file_id}", "get")
    job = _ok(api.post("/fine_tuning/jobs", json={"model": "tiny", "training_file": f["id"], "seed": 1,
                                                   "hyperparameters": {"n_epochs": 1, "batch_size": 4}}),
              "/fine_tuning/jobs", "post")
    job = eventually(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
        _ok(api.get(f"/fine_tuning/jobs/{job['id']}"), "/fine_tuning/jobs/{fine_tuning_job_id}", "get")),
        120, "the job finishes", every_s=0.3)
    assert job["status"] == "succeeded", job
    _ok(api.get("/fine_tuning/jobs"), "/fine_tuning/jobs", "get")
    _ok(api.get(f"/fine_tuning/jobs/{job['id']}/events"), "/fine_tuning/jobs/{fine_tuning_job_id}/events", "get")
    _ok(api.get(f"/fine_tuning/jobs/{job['id']}/checkpoints"), "/fine_tuning/jobs/{fine_tuning_job_id}/checkpoints",
        "get")
    queued = api.post("/fine_tuning/jobs", json={"model": "tiny", "training_file": f["id"]}).json()
    _ok(api.post(f"/fine_tuning/jobs/{queued['id']}/pause"), "/fine_tuning/jobs/{fine_tuning_job_id}/pause", "post")
    _ok(api.post(f"/fine_tuning/jobs/{queued['id']}/resume"), "/fine_tuning/jobs/{fine_tuning_job_id}/resume", "post")
    _ok(api.post(f"/fine_tuning/jobs/{queued['id']}/cancel"), "/fine_tuning/jobs/{fine_tuning_job_id}/cancel", "post")
    _ok(api.delete(f"/files/{bad['id']}"), "/files/{file_id}", "delete")


def test_graders_conform(api):
    _ok(api.post("/fine_tuning/alpha/graders/validate", json={"grader": GRADER}),
        "/fine_tuning/alpha/graders/validate", "post")
    run = {"grader": GRADER, "model_sample": "4", "item": {"answer": "4"}}
    assert _ok(api.post("/fine_tuning/alpha/graders/run", json=run), "/fine_tuning/alpha/graders/run", "post")["reward"] == 1
    broken = {**run, "item": {}}                  # {{item.answer}} is missing: an error, said in metadata
    out = _ok(api.post("/fine_tuning/alpha/graders/run", json=broken), "/fine_tuning/alpha/graders/run", "post")
    assert out["metadata"]["errors"]["invalid_variable_error"] is True


def test_errors_conform(api, tmp_path):
    for r, status in ((httpx.get(str(api.base_url).rstrip("/") + "/models"), 401),
                      (api.get("/files/file-nope"), 404),
                      (api.post("/chat/completions", json={"model": "tiny", "messages": []}), 400)):
        assert r.status_code == status
        assert problems_with(ERROR, r.json()) == []


@pytest.fixture(scope="module")
def tool_api(clerk):
    with httpx.Client(base_url=clerk["base"], headers={"authorization": f"Bearer {clerk['key']}"}, timeout=120) as c:
        yield c


def _events(api: httpx.Client, path: str, body: dict) -> list[dict]:
    with api.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_tool_calls_and_response_events_conform(tool_api):
    """Answers that call tools (chat: tool_calls; responses: function_call items) and every event
    of a streamed response, against the document (a model that calls tools: conftest.tool_model_dir)."""
    row = agent_rows()[1]
    system, question = row["messages"][:2]
    chat = {"model": "clerk", "messages": [system, question], "tools": row["tools"], "temperature": 0, "max_tokens": 80}
    body = _ok(tool_api.post("/chat/completions", json=chat), "/chat/completions", "post")
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    chunks = _events(tool_api, "/chat/completions", {**chat, "stream": True})
    assert any(c["choices"][0]["delta"].get("tool_calls") for c in chunks)
    for c in chunks:
        assert problems("/chat/completions", "post", c, media="text/event-stream") == []
    ask = {"model": "clerk", "instructions": system["content"], "input": question["content"], "temperature": 0,
           "max_output_tokens": 80, "tools": [{"type": "function", **t["function"]} for t in row["tools"]]}
    call = _ok(tool_api.post("/responses", json=ask), "/responses", "post")["output"][0]
    assert call["type"] == "function_call"
    answer = {**ask, "input": [{"type": "message", "role": "user", "content": question["content"]},
                               {k: call[k] for k in ("type", "call_id", "name", "arguments")},
                               {"type": "function_call_output", "call_id": call["call_id"], "output": "7"}]}
    for streamed in (ask, answer):                       # a call only; a text message
        events = _events(tool_api, "/responses", {**streamed, "stream": True})
        assert events[-1]["type"] == "response.completed"
        for e in events:
            assert event_problems(e) == [], e["type"]
            assert problems("/responses", "post", e, media="text/event-stream") == [], e["type"]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "7"
