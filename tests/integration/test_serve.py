"""The server end to end: the official openai client against a real uvicorn server."""
from __future__ import annotations

import concurrent.futures as cf
import threading

import httpx
import pytest

from gymloop.serve import ServeConfig, build, shutdown

from conftest import eventually, free_port, running_server

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    db = tmp_path_factory.mktemp("serve") / "store.db"
    cfg = ServeConfig(model=str(tiny_model_dir), model_name="tiny", db=str(db), api_keys=[KEY],
                      max_request_bytes=64 * 1024, max_tokens_limit=64)
    app, batcher, store = build(cfg)
    with running_server(app) as base:
        yield {"base": base, "store": store, "batcher": batcher, "cfg": cfg}
    shutdown(app)


@pytest.fixture()
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server["base"] + "/v1", api_key=KEY, max_retries=0)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    h = httpx.get(server["base"] + "/healthz").json()
    assert h["status"] == "ok" and h["model_version"] == 0


def test_chat_completion_is_traced_before_the_response(server, client):
    before = server["store"].count("traces")
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "12+30="}],
                                       max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens >= 1
    assert r.system_fingerprint == "gymloop-v0"
    trace = server["store"].traces.get(r.id)
    assert trace is not None and trace["response"]["choices"][0]["message"]["content"] == r.choices[0].message.content
    assert server["store"].count("traces") == before + 1


def test_n_samples_a_group_with_logprobs_plain_and_streamed(server, client):
    """n > 1 (an RL driver's group): n choices, each with its log-probs, usage counting every
    choice, one trace holding them all; streamed, every chunk names its choice."""
    msgs = [{"role": "user", "content": "3+4="}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, n=8,
                                       logprobs=True, top_logprobs=2, seed=5)
    assert [c.index for c in r.choices] == list(range(8))
    assert all(c.logprobs.content and all(len(t.top_logprobs) == 2 for t in c.logprobs.content) for c in r.choices)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1            # samples of a group, not one repeated
    trace = server["store"].traces.get(r.id)
    assert [c["message"]["content"] for c in trace["response"]["choices"]] == [c.message.content for c in r.choices]
    assert trace["completion_tokens"] == r.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, n=3,
                                                  stream=True))
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)}
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1, 2}
    stored = server["store"].traces.get(chunks[0].id)["response"]["choices"]
    assert [c["message"]["content"] for c in stored] == [texts[i] for i in range(3)]


def test_token_ids_for_rl_drivers_are_the_ones_sampled(server, client, tok):
    """vLLM's `return_token_ids`, which RL drivers (verifiers, NeMo RL) read instead of
    re-tokenizing: the rendered prompt's ids and each choice's sampled ids, one log-prob each."""
    msgs = [{"role": "user", "content": "3+4="}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, n=3, seed=2,
                                       logprobs=True, extra_body={"return_token_ids": True})
    extra = r.model_extra
    assert extra["prompt_token_ids"] == tok.prompt_ids(msgs)
    for c in r.choices:
        ids = c.model_extra["token_ids"]
        assert len(ids) == len(c.logprobs.content) and len(ids) > 0
        assert tok.decode(ids) == c.message.content or tok.decode(ids).startswith(c.message.content)
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)
    plain = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    assert "prompt_token_ids" not in (plain.model_extra or {}) and "token_ids" not in (plain.choices[0].model_extra or {})
    c = client.completions.create(model="tiny", prompt="12+30=", max_tokens=4, extra_body={"return_token_ids": True})
    assert c.choices[0].model_extra["prompt_token_ids"] == tok.encode("12+30=")
    assert tok.decode(c.choices[0].model_extra["token_ids"]).startswith(c.choices[0].text)


def test_completions_raw_text_with_logprobs(server, client):
    """/v1/completions: the prompt is raw text (no chat template), n samples with their tokens'
    log-probs and the top-k per position, one trace."""
    r = client.completions.create(model="tiny", prompt="12+30=", max_tokens=5, temperature=1.0, n=3, logprobs=2,
                                  seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.object == "text_completion"
    for c in r.choices:
        lp = c.logprobs
        assert "".join(lp.tokens).startswith(c.text) and len(lp.token_logprobs) == len(lp.tokens)
        assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    assert r.usage.prompt_tokens == len(server["store"].traces.get(r.id)["request"]["prompt"])   # 1 token a char
    with pytest.raises(Exception, match="stream"):
        client.completions.create(model="tiny", prompt="x", stream=True)


def test_responses_api_with_the_openai_client(server, client):
    """The Responses API through the official client: a response is a trace, the next one continues
    it with previous_response_id (its conversation carried over, instructions not), GET returns it,
    another key cannot see it."""
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object",
                                                                        "properties": {"city": {"type": "string"}}}}]
    first = client.responses.create(model="tiny", input="12+30=", instructions="Answer briefly.", tools=tools,
                                    max_output_tokens=6, temperature=0)
    assert first.object == "response" and first.output[0].type == "message"
    assert first.output_text == first.output[0].content[0].text and first.usage.output_tokens >= 1
    trace = server["store"].traces.get(first.id)
    assert trace["response"]["output"][0]["content"][0]["text"] == first.output_text
    assert trace["request"]["gymloop_messages"][0] == {"role": "system", "content": "Answer briefly."}
    second = client.responses.create(model="tiny", previous_response_id=first.id, max_output_tokens=4,
                                      input=[{"role": "user", "content": [{"type": "input_text", "text": "again"}]}])
    carried = server["store"].traces.get(second.id)["request"]["gymloop_messages"]
    assert carried == [{"role": "user", "content": "12+30="}, {"role": "assistant", "content": first.output_text},
                       {"role": "user", "content": "again"}]
    assert client.responses.retrieve(first.id).output_text == first.output_text
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        client.responses.retrieve("resp_nope")
    assert server["store"].traces.get(first.id)["key_id"] is not None
    events = list(client.responses.create(model="tiny", input="12+30=", max_output_tokens=6, temperature=0,
                                          stream=True))
    done = events[-1].response
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == done.output_text
    assert done.output_text == first.output_text and server["store"].traces.get(done.id) is not None


def test_streamed_completion_matches_plain(server, client):
    msgs = [{"role": "user", "content": "7+8="}]
    plain = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0,
                                                  stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert server["store"].traces.get(chunks[0].id) is not None


def test_logprobs_are_returned_and_are_the_models(server, client):
    """logprobs: true gives each generated token's log-prob (what an RL user calls the API for),
    equal to a full forward pass of the served weights; top_logprobs lists the k most likely,
    the sampled one among them when it is the argmax."""
    import torch

    from gymloop.models.checkpoint import load_model
    from gymloop.engine import NativeEngine, SamplingParams
    from gymloop.trainer.logprobs import make_batch, token_logprobs

    msgs = [{"role": "user", "content": "12+30="}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob for c in content)
    assert all(abs(c.logprob - c.top_logprobs[0].logprob) < 1e-6 for c in content)      # greedy: the argmax
    model, tok = load_model(server["cfg"].model)
    prompt = tok.prompt_ids(msgs)
    # the same greedy generation in this process gives the token ids the API does not return
    gen = NativeEngine(model, tok.pad_token_id).generate(
        [prompt], SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=tok.eos_token_ids)).generations[0]
    assert [c.token for c in content] == [tok.decode([t]) for t in gen.token_ids]
    b = make_batch([prompt + gen.token_ids], [[0] * len(prompt) + [1] * len(gen.token_ids)], None, tok.pad_token_id)
    with torch.no_grad():
        ref = token_logprobs(model, b)[0, len(prompt):]
    assert max(abs(float(a) - c.logprob) for a, c in zip(ref, content)) <= 1e-4
    plain = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content


def test_feedback(server, client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], max_tokens=4)
    h = {"Authorization": f"Bearer {KEY}"}
    ok = httpx.post(server["base"] + "/v1/feedback", headers=h,
                    json={"trace_id": r.id, "reward": 0.0, "task": {"env": "arith", "version": 1, "task_id": "arith:1+1"}})
    assert ok.status_code == 200
    fb = server["store"].traces.feedback_for(r.id)
    assert fb[0]["reward"] == 0.0 and fb[0]["env"] == "arith" and fb[0]["task_id"] == "arith:1+1"


@pytest.mark.parametrize("send,status,needle", [
    (dict(content=b"{not json"), 400, "not valid JSON"),
    (dict(json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}), 404, "model 'nope' not found"),
    (dict(json={"model": "tiny", "messages": []}), 400, "messages"),
    (dict(json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}), 400, "max_tokens"),
    (dict(json={"model": "tiny", "messages": [{"role": "user", "content": "x" * 70_000}]}), 413, "exceeds the limit"),
    (dict(json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 9}), 400, "temperature"),
    (dict(json={"model": "tiny", "messages": [{"role": "hacker", "content": "x"}]}), 400, "messages.0.role"),
    (dict(json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}), 400,
     "top_logprobs needs logprobs"),
    (dict(json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                "top_logprobs": 21}), 400, "top_logprobs"),
])
def test_bad_requests_are_4xx_and_change_nothing(server, send, status, needle):
    before = server["store"].count("traces")
    r = httpx.post(server["base"] + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}",
                                                                      "Content-Type": "application/json"}, **send)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    assert server["store"].count("traces") == before
    assert httpx.get(server["base"] + "/healthz").status_code == 200


@pytest.mark.parametrize("path,body,status,needle", [
    # what schemathesis found: each answered as its schema says, never a 500
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": ["1+1=", "2+2="]}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "1+1=", "stream": True}, 400, "stream"),
    ("/v1/responses", {"model": "tiny", "input": "x", "stream": 0}, 400, "stream"),
    ("/v1/responses", {"model": "tiny", "input": "x", "max_output_tokens": 2,
                       "tools": [{"type": "function", "name": "f"}]}, 200, ""),
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "1"}]}, 200, ""),
])
def test_schema_valid_requests_are_answered_and_invalid_ones_refused(server, path, body, status, needle):
    r = httpx.post(server["base"] + path, headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert r.status_code == status, r.text
    assert status == 200 or needle in r.json()["error"]["message"]


@pytest.mark.parametrize("body,status,needle", [
    ({"trace_id": "trace-unknown", "reward": 1.0}, 404, "unknown trace id"),
    ({"trace_id": "x", "reward": 1.5}, 400, "reward"),
    ({"trace_id": "x"}, 400, "reward (0..1) or a label"),
    ({"trace_id": "x", "reward": 1, "colour": "red"}, 400, "colour"),
])
def test_bad_feedback(server, body, status, needle):
    before = server["store"].count("feedback")
    r = httpx.post(server["base"] + "/v1/feedback", headers={"Authorization": f"Bearer {KEY}"}, json=body)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    assert server["store"].count("feedback") == before


def test_missing_or_wrong_key_is_401_and_leaves_no_trace(server):
    from openai import AuthenticationError, OpenAI

    before = server["store"].count("traces")
    for key in ("wrong", ""):
        c = OpenAI(base_url=server["base"] + "/v1", api_key=key or "x", max_retries=0)
        if not key:
            r = httpx.post(server["base"] + "/v1/chat/completions",
                           json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 401
            continue
        with pytest.raises(AuthenticationError):
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert server["store"].count("traces") == before


def test_concurrent_load_with_a_swap_in_the_middle(server, client):
    """32 clients x 25 requests, a weight swap while they are in flight: 0 errors, 800 traces, answers
    from the old weights before the swap and from the new after it, never the old after the new."""
    store, batcher = server["store"], server["batcher"]
    before = store.count("traces")
    weights = {k: v.clone() for k, v in batcher.engine.model.state_dict().items()}
    lock, answered = threading.Lock(), [0]
    under_load = threading.Event()        # 100 answers in: the swap starts while the rest are in flight
    swapped_in = threading.Event()        # the swap is done: each client's last 5 requests come after it

    def worker(i):
        out = []
        for j in range(25):
            if j == 20:
                assert swapped_in.wait(timeout=120), "the swap never finished"
            r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"{i}+{j}="}],
                                               max_tokens=6)
            out.append((r.id, r.system_fingerprint))
            with lock:
                answered[0] += 1
                if answered[0] == 100:
                    under_load.set()
        return out

    with cf.ThreadPoolExecutor(32) as ex:
        futures = [ex.submit(worker, i) for i in range(32)]
        assert under_load.wait(timeout=120)
        with lock:
            at_swap = answered[0]
        swapped = batcher.swap(weights, version=7)
        assert swapped.result(timeout=60) == 7
        swapped_in.set()
        per_client = [f.result() for f in futures]
    results = [x for out in per_client for x in out]
    assert at_swap < 800 - 32 * 5                   # the swap was queued with requests still to come
    assert len(results) == 800 and store.count("traces") == before + 800
    assert all(store.traces.get(rid) is not None for rid, _ in results)
    fingerprints = [fp for _, fp in results]
    assert set(fingerprints) == {"gymloop-v0", "gymloop-v7"}
    assert fingerprints.count("gymloop-v0") >= 100 and fingerprints.count("gymloop-v7") >= 32 * 5
    for out in per_client:                          # a client never goes back to the old weights
        seen = [fp for _, fp in out]
        assert seen == sorted(seen, key=lambda fp: fp == "gymloop-v7")
        assert all(fp == "gymloop-v7" for fp in seen[20:])
    assert batcher.batched_requests / batcher.batches > 1.5        # requests really shared batches
    metrics = httpx.get(server["base"] + "/metrics").text
    assert "gymloop_model_version 7" in metrics and 'gymloop_requests_total{status="200"}' in metrics


def _start_server_process(tmp_path, model_dir, port, db):
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "gymloop.cli", "serve", "--model", str(model_dir),
                             "--model-name", "tiny", "--db", str(db), "--port", str(port), "--api-key", KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    base = f"http://127.0.0.1:{port}"

    def answers():
        try:
            return httpx.get(base + "/healthz", timeout=0.5).json()
        except httpx.HTTPError:
            return None
    eventually(answers, 60, "the server answers /healthz", every_s=0.1,
               unless=lambda: proc.poll() is not None and "the server exited: " + proc.stdout.read().decode()[-2000:])
    return proc, base


def test_kill_9_during_load_loses_no_answered_trace(tmp_path, tiny_model_dir):
    import os
    import signal

    from gymloop.store import Store

    db = tmp_path / "crash.db"
    proc, base = _start_server_process(tmp_path, tiny_model_dir, free_port(), db)
    answered, stop = [], threading.Event()

    def worker(i):
        with httpx.Client(timeout=5) as c:
            while not stop.is_set():
                try:
                    r = c.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                               json={"model": "tiny", "messages": [{"role": "user", "content": f"{i}"}], "max_tokens": 4})
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    answered.append(r.json()["id"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    eventually(lambda: len(answered) > 10, 60, "answers under load before the kill")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)
    stop.set()
    for t in threads:
        t.join(10)
    store = Store(db)
    assert len(answered) > 10
    missing = [a for a in answered if store.traces.get(a) is None]
    assert missing == [], f"{len(missing)} of {len(answered)} answered requests have no trace"


@pytest.mark.parametrize("engine_dtype", ["model", "bfloat16"])
def test_promotion_rejection_and_rollback_reach_the_running_server(tmp_path, tok, capsys, engine_dtype):
    """The store decides what is served: promoted versions are picked up without a restart,
    a candidate that was rejected is never served, and rollback returns to an earlier one.
    In bfloat16, the engine's cast copies are remade from each version served."""
    import torch
    from openai import OpenAI

    from conftest import tiny_llama
    from gymloop.models.checkpoint import save_model
    from gymloop.cli import main

    dirs = {}
    for seed in (11, 12, 13):
        dirs[seed] = save_model(tiny_llama(tok.vocab_size, seed=seed), tok, tmp_path / f"m{seed}")
    db = tmp_path / "promo.db"
    cfg = ServeConfig(model=str(dirs[11]), model_name="tiny", db=str(db), api_keys=[KEY], poll_s=0.1,
                      engine_dtype=engine_dtype)
    app, batcher, store = build(cfg)
    ctx = running_server(app)
    base = ctx.__enter__()
    client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)

    def served_version():
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "3+4="}], max_tokens=4)
        return r.system_fingerprint

    def wait_for(fp):
        return eventually(lambda: served_version() == fp, 30, f"the server answers as {fp}")

    def weights_equal(path):
        from safetensors.torch import load_file

        ref = load_file(str(path / "model.safetensors"))
        own = batcher.engine.model.state_dict()
        q = batcher.engine.backend.layers[0][1]            # what generation multiplies by, in its dtype
        assert q.dtype is (torch.bfloat16 if engine_dtype == "bfloat16" else torch.float32)
        return all(torch.equal(own[k], v) for k, v in ref.items()) and \
            torch.equal(q, ref["model.layers.0.self_attn.q_proj.weight"].to(q.dtype))

    try:
        assert served_version() == "gymloop-v0"
        assert main(["models", "add", str(dirs[12]), "--db", str(db), "--promote"]) == 0     # v1
        assert wait_for("gymloop-v1") and weights_equal(dirs[12])
        bad = store.versions.add(str(dirs[13]), parent=1, status="candidate")          # v2, worse on purpose
        store.versions.set_status(bad, "rejected", scores={"arith": 0.0})
        # two more looks at the store: the second began after the change, whatever the first read
        follower = app.state.services.follower
        assert follower.wait_checks(follower.checks + 2, 30)
        assert served_version() == "gymloop-v1" and weights_equal(dirs[12])
        assert main(["models", "add", str(dirs[13]), "--db", str(db), "--promote"]) == 0     # v3
        assert wait_for("gymloop-v3")
        assert main(["rollback", "1", "--db", str(db)]) == 0
        assert wait_for("gymloop-v1") and weights_equal(dirs[12])
        assert {v["version"]: v["status"] for v in store.versions.list()} == {
            1: "promoted", 2: "rejected", 3: "rolled_back"}
        assert main(["rollback", "2", "--db", str(db)]) == 2                                # never promoted
        assert "never promoted" in capsys.readouterr().err
    finally:
        ctx.__exit__(None, None, None)
        shutdown(app)


def test_serving_is_costed_in_the_ledger(server, client):
    store = server["store"]
    served_before = sum(r["served_tokens"] for r in store.ledger.rows("serving"))
    answered = sum(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"{i}"}],
                                                  max_tokens=4).usage.completion_tokens for i in range(5))
    assert answered > 0
    # the ledger is written once per poll tick: wait for the tick that carries these answers
    eventually(lambda: sum(r["served_tokens"] for r in store.ledger.rows("serving")) >= served_before + answered,
               60, "the serving ledger records the answers", every_s=server["cfg"].poll_s / 4)
    stats = store.ledger.stats()
    rows = store.ledger.rows("serving")
    served = sum(r["served_tokens"] for r in rows)
    dollars = sum(r["dollars"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    assert served > 0 and seconds > 0
    from gymloop.accounting.ledger import load_profiles

    price = load_profiles()[server["cfg"].cost_profile].usd_per_hour
    assert dollars == pytest.approx(seconds * price / 3600)
    assert stats["cost_per_1m_served_tokens"] == pytest.approx(dollars / served * 1e6)


def test_serve_engine_dtype_flag_reaches_the_config():
    from gymloop.cli import _server_config, build_parser

    args = build_parser().parse_args(["serve", "--api-key", KEY, "--engine-dtype", "bfloat16"])
    assert _server_config(args).engine_dtype == "bfloat16"
    assert _server_config(build_parser().parse_args(["serve", "--api-key", KEY])).engine_dtype == "model"


def test_serve_refuses_a_model_it_cannot_load_before_it_announces_anything(capsys, tmp_path):
    from gymloop.cli import main

    assert main(["serve", "--model", "no-such-model", "--no-auth", "--db", str(tmp_path / "s.db")]) != 0
    out = capsys.readouterr()
    assert "serving" not in out.out and "model 'no-such-model'" in out.err
