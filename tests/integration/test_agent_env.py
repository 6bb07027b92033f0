"""The `agent` environment: a program that makes its own model calls, unchanged, as the rollout.
Real programs (tests/fixtures/agent_programs: a plain openai loop, the Agents SDK on both its
models, a command) call a real endpoint on a real engine (a tiny model that has learnt the clerk's
conversation); training sees the exact ids the engine sampled; a program's failures are errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from conftest import few_grpo_steps, needs_vllm
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.envs import make_env
from gymloop.models.checkpoint import load_model
from gymloop.rollout.episodes import collect

PROGRAMS = Path(__file__).parent.parent / "fixtures" / "agent_programs"
sys.path.insert(0, str(PROGRAMS))      # the module the harness option names: the test reads what it kept
# near-greedy: the tiny model then answers as it learnt (the run's sampling, whatever the program asks)
PARAMS = SamplingParams(max_new_tokens=80, temperature=0.05)


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("agent") / "tasks.jsonl"
    rows = [{"id": "apple-1", "item": "apple"}, {"id": "apple-2", "item": "apple", "note": "kept as is"},
            {"id": "apple-h", "item": "apple", "split": "heldout"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def policy(tool_model_dir):
    model, tok = load_model(tool_model_dir)
    return NativeEngine(model, tok.pad_token_id, decode=tok.decode), tok


def agent_env(tasks_file: str, **options):
    if "harness" in options:
        options = {"path": str(PROGRAMS), **options, "harness": "clerk:" + options["harness"]}
    return make_env("agent", **{"tasks": tasks_file, "timeout_s": 60, "concurrency": 4, **options})


def run(env, policy, n: int = 2, params: SamplingParams = PARAMS):
    engine, tok = policy
    try:
        return collect(engine, tok, env, env.sample_tasks(2, "train", seed=0), n, params)
    finally:
        env.close()


def test_plain_openai_loop_trains_on_exactly_the_ids_it_was_served(tasks_file, policy):
    import clerk

    env = agent_env(tasks_file, harness="chat_loop")
    rollouts, stats = run(env, policy)
    assert len(rollouts) == 4 and stats.errors == 0 and all(r.ok for r in rollouts)
    # the clerk calls get_stock, gets 7, answers 7: two calls, one sequence, reward 1
    assert [(r.calls, len(r.segments), r.reward) for r in rollouts] == [(2, 0, 1.0)] * 4
    assert stats.calls == 8 and stats.segments == 4
    served = [clerk.SAMPLED.pop(k) for k in list(clerk.SAMPLED)]
    trained = {tuple(t for t, m in zip(r.token_ids, r.mask) if m) for r in rollouts}
    # every sampled position of every episode holds the ids (and log-probs) the server returned
    assert trained == {tuple(x for c in s for x in c["token_ids"]) for s in served}
    for r in rollouts:
        lps = [lp for lp, m in zip(r.logprobs, r.mask) if m]
        assert any(lps == [x for c in s for x in c["logprobs"]] for s in served)
    assert rollouts[0].task.info["item"] == "apple" and rollouts[1].version == 0


@pytest.mark.parametrize("harness", ["sdk_chat", "sdk_responses"])
def test_an_agents_sdk_agent_unchanged(tasks_file, policy, harness):
    rollouts, stats = run(agent_env(tasks_file, harness=harness), policy)
    assert stats.errors == 0, [r.score.error for r in rollouts]
    assert [(r.calls, len(r.segments), r.reward) for r in rollouts] == [(2, 0, 1.0)] * 4
    tok = policy[1]
    trained = tok.decode([t for t, m in zip(rollouts[0].token_ids, rollouts[0].mask) if m])
    assert trained.startswith("<tool_call>") and "get_stock" in trained and trained.endswith("7")
    if harness == "sdk_responses":
        assert rollouts[0].score.components == {"reward": 1.0, "answered": 1.0}


def test_a_command_in_its_own_process(tasks_file, policy):
    env = agent_env(tasks_file, command=[sys.executable, str(PROGRAMS / "command.py")])
    rollouts, stats = run(env, policy)
    assert stats.errors == 0 and [(r.calls, r.reward) for r in rollouts] == [(2, 1.0)] * 4


def test_a_program_that_rewrites_its_history_leaves_two_segments(tasks_file, policy):
    rollouts, stats = run(agent_env(tasks_file, harness="rewriter"), policy)
    assert stats.errors == 0
    for r in rollouts:
        assert r.calls == 2 and len(r.segments) == 1
        (seg,) = r.segments
        assert len(r.sequences()) == 2 and sum(seg.mask) == len(seg.token_ids)   # the second call's sample alone
    assert stats.segments == 8


@pytest.mark.parametrize("options, error", [
    ({"harness": "raises"}, "the program raised KeyError: 'the tool registry lost its entry'"),
    ({"harness": "out_of_range"}, "reward 3 is outside [0, 1]"),
    ({"harness": "other_model"}, "the program raised NotFoundError"),
    ({"harness": "silent"}, "the program made no model call"),
    ({"harness": "slow", "timeout_s": 3}, "the program ran past timeout_s 3"),
    ({"command": [sys.executable, str(PROGRAMS / "command.py"), "--exit", "3"]},
     "the program exited with 3: something broke"),
    ({"command": [sys.executable, str(PROGRAMS / "command.py"), "--no-reward"]},
     "its last stdout line is not JSON: 'the clerk is done'"),
    ({"command": [sys.executable, str(PROGRAMS / "command.py"), "--reward", "-0.5"]}, "reward -0.5 is outside [0, 1]"),
    ({"command": ["/no/such/program"]}, "cannot start '/no/such/program'"),
])
def test_a_failing_program_is_an_error_never_a_reward(tasks_file, policy, options, error):
    rollouts, stats = run(agent_env(tasks_file, **options), policy, n=1)
    assert stats.errors == 2 and not any(r.ok for r in rollouts)
    for r in rollouts:
        assert error in r.score.error and r.score.error.startswith(f"task {r.task.id}:")


def test_options_are_checked_before_anything_runs(tasks_file, tmp_path):
    with pytest.raises(ValueError, match="exactly one of harness"):
        make_env("agent", tasks=tasks_file)
    with pytest.raises(ValueError, match="does not exist"):
        make_env("agent", harness="clerk:chat_loop", tasks=str(tmp_path / "none.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n{"item": "pear"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a task is a JSON object with an 'id'"):
        make_env("agent", harness="clerk:chat_loop", tasks=str(bad))
    env = make_env("agent", harness="clerk:no_such", path=str(PROGRAMS), tasks=tasks_file)
    with pytest.raises(ValueError, match="cannot import it"):
        env.runner()


def test_grpo_steps_through_an_agents_sdk_program(tmp_path, tool_model_dir, tasks_file):
    summary, trained = few_grpo_steps(tmp_path, tool_model_dir, {"name": "agent", "options": {
        "harness": "clerk:sdk_chat", "path": str(PROGRAMS), "tasks": tasks_file, "concurrency": 4}},
        steps=2, prompts=2, new_tokens=80, eval_tasks=1)
    for rec in trained:
        assert rec["agent_errors"] == 0 and rec["agent_calls"] >= 1 and rec["agent_segments"] >= 1
        # the SDK agent asks for temperature 0 and 128 tokens: every call sampled as the run does instead
        assert rec["agent_sampling_overridden"] == rec["agent_calls"] * 8
        assert "approx_kl_behaviour" in rec
    assert summary["final"] is not None and summary["heldout_tasks"] == 1


def test_on_vllm_the_trained_ids_are_vllms_samples(tasks_file, tool_model_dir_vllm):
    needs_vllm()
    import clerk
    from gymloop.engine.vllm import VLLMEngine

    model, tok = load_model(tool_model_dir_vllm)
    engine = VLLMEngine.start(tool_model_dir_vllm, tok.pad_token_id, decode=tok.decode)
    try:
        clerk.SAMPLED.clear()
        rollouts, stats = run(agent_env(tasks_file, harness="chat_loop"), (engine, tok))
    finally:
        engine.close()
    assert stats.errors == 0 and all(r.calls == 2 and not r.segments for r in rollouts)
    served = {tuple(x for c in s for x in c["token_ids"]) for s in clerk.SAMPLED.values()}
    assert {tuple(t for t, m in zip(r.token_ids, r.mask) if m) for r in rollouts} == served


def test_envs_validate_runs_the_program_and_names_each_failure(tasks_file, tool_model_dir, capsys):
    from gymloop.cli import main

    options = {"harness": "clerk:chat_loop", "path": str(PROGRAMS), "tasks": tasks_file}
    assert main(["envs", "validate", "agent", "--model", str(tool_model_dir), "--n", "2",
                 "--options", json.dumps(options)]) == 0
    out = capsys.readouterr().out
    assert "2/2 episodes ran to a reward" in out and "apple-1" in out
    assert main(["envs", "validate", "agent", "--model", str(tool_model_dir), "--n", "2",
                 "--options", json.dumps({**options, "harness": "clerk:raises"})]) == 1
    out = capsys.readouterr().out
    assert "FAILED  0/2" in out and "the program raised KeyError" in out


def test_a_production_session_with_feedback_becomes_a_training_task(clerk, tool_model_dir, tasks_file, tmp_path, tok):
    """The same program serves users through `gymloop serve`: its calls carry a session id (and
    the task it works on); feedback on the session makes its task a training task, which GRPO
    re-runs the program on."""
    import clerk as programs
    from openai import OpenAI

    from gymloop.rollout.capture import Call, merge
    from gymloop.config import EnvSpec, TrainConfig
    from gymloop.loop.config import CurriculumConfig
    from gymloop.loop.curriculum import curriculum
    from gymloop.orchestrator.train import train

    store = clerk["store"]
    task = {"id": "apple-in-production", "item": "apple"}
    client = OpenAI(base_url=clerk["base"], api_key=clerk["key"], max_retries=0,
                    default_headers={"x-gymloop-session": "sess-1", "x-gymloop-task": json.dumps(task)})
    reward = programs.chat_loop(task, client, "clerk")
    calls = store.sessions.calls("sess-1")
    assert store.sessions.get("sess-1")["task"] == task and len(calls) == 2
    served = programs.SAMPLED.pop(clerk["key"])
    assert [c["token_ids"] for c in calls] == [s["token_ids"] for s in served]
    (seg,) = merge([Call(**c) for c in calls], tok)       # one sequence: the second call continued the first
    assert [t for t, m in zip(seg.token_ids, seg.mask) if m] == [t for s in served for t in s["token_ids"]]
    # the user says the session failed (the stock had changed since: feedback knows what the program could not)
    http = httpx.post(clerk["base"] + "/feedback", json={"session_id": "sess-1", "reward": 0.0},
                      headers={"authorization": f"Bearer {clerk['key']}"})
    assert http.status_code == 200 and reward == 1.0
    assert httpx.post(clerk["base"] + "/feedback", json={"session_id": "nope", "reward": 0.0},
                      headers={"authorization": f"Bearer {clerk['key']}"}).status_code == 404
    bad = httpx.post(clerk["base"] + "/chat/completions", json={"model": "clerk", "messages": [
        {"role": "user", "content": "hi"}]}, headers={"authorization": f"Bearer {clerk['key']}",
                                                     "x-gymloop-session": "s", "x-gymloop-task": "[1]"})
    assert bad.status_code == 400 and "x-gymloop-task" in bad.json()["error"]["message"]
    # the loop's curriculum: the failed session's task, as the program named it, is a production task
    spec = EnvSpec(name="agent", options={"harness": "clerk:chat_loop", "path": str(PROGRAMS), "tasks": tasks_file})
    env = make_env(spec.name, **spec.options)
    try:
        source, stats = curriculum(CurriculumConfig(production_share=1.0), spec, 2, 0, store, 1, env=env)
        assert stats["production_failures"] == 1 and stats["production_per_step"] == 1
        first = source(1)
        assert first[0].info == task and first[0].source == "production"
        cfg = TrainConfig.model_validate({
            "model": str(tool_model_dir), "run_dir": str(tmp_path / "runs"), "env": spec.model_dump(),
            "sampling": {"max_new_tokens": 80}, "eval": {"tasks": 0},
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "lr": 1e-3, "drop_zero_signal": False}})
        summary = train(cfg, progress=False, echo=lambda m: None, task_source=source, env=env)
        assert summary["steps"] == 1
    finally:
        env.close()


def test_judged_sessions_train_sft_and_dpo_rounds_on_their_sampled_tokens(clerk, tool_model_dir, tmp_path):
    """A loop's sft / dpo round takes an agent program's judged sessions as rows of the tokens
    they sampled (no re-rendering of what the model wrote)."""
    import clerk as programs
    from openai import OpenAI

    from gymloop.accounting.ledger import load_profiles
    from gymloop.loop.config import RoundMethod
    from gymloop.loop.from_traces import session_rows, train_on_traces
    from gymloop.models.checkpoint import load_tokenizer
    from gymloop.store import Store

    task = {"id": "apple-twice", "item": "apple"}
    store = Store(tmp_path / "judged.db")
    for sid, reward in (("good", 1.0), ("bad", 0.0)):
        client = OpenAI(base_url=clerk["base"], api_key=clerk["key"], max_retries=0,
                        default_headers={"x-gymloop-session": f"judged-{sid}"})
        programs.chat_loop(task, client, "clerk")
        store.sessions.add_calls(sid, f"trace-{sid}", None, clerk["store"].sessions.calls(f"judged-{sid}"), task)
        store.sessions.add_feedback(sid, reward)
    served = programs.SAMPLED.pop(clerk["key"])[-2:]          # the "bad" session's two calls
    tok = load_tokenizer(tool_model_dir)
    (sft,) = session_rows(store, "sft", tok)                   # the good session, one sequence
    assert sft["session_id"] == "good" and len(sft["tokens"]["ids"]) == len(sft["tokens"]["mask"])
    (pair,) = session_rows(store, "dpo", tok)
    bad = pair["non_preferred_tokens"]
    assert [t for t, m in zip(bad["ids"], bad["mask"]) if m] == [t for c in served for t in c["token_ids"]]
    profile = load_profiles()["cpu-2vcpu"]
    for method in ("sft", "dpo"):
        out, stats, _ = train_on_traces(store, RoundMethod(method=method, min_examples=1, batch_size=2),
                                        str(tool_model_dir), tmp_path / method, 0, profile)
        assert stats["session_examples"] == 1 and stats["steps"] >= 1 and out != str(tool_model_dir), stats


def test_grpo_through_a_program_on_vllm(tmp_path, tool_model_dir_vllm, tasks_file):
    """GRPO steps whose episodes are the program's calls to vLLM, the trainer's weights sent to it
    after every step."""
    needs_vllm()
    _, trained = few_grpo_steps(tmp_path, tool_model_dir_vllm, {"name": "agent", "options": {
        "harness": "clerk:chat_loop", "path": str(PROGRAMS), "tasks": tasks_file}},
        steps=2, prompts=2, new_tokens=80, eval_tasks=1, engine_backend="vllm")
    assert all(r["agent_errors"] == 0 and r["agent_calls"] >= 1 for r in trained)
    # the behaviour log-probs are vLLM's, the trainer's recomputation agrees (one float32 model)
    assert all(r["approx_kl_behaviour"] < 1e-3 for r in trained), [r["approx_kl_behaviour"] for r in trained]
