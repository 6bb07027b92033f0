"""NeMo Gym resources servers through gymloop, for real: examples that ship inside the nemo-gym
wheel (with their data), served unchanged from NeMo Gym's runtime (`make nemo-gym`), gymloop as
the agent. The server's verify scores gymloop's episodes exactly as when called directly; gold and
wrong episodes of example_multi_step score 1 and 0; example_tool_call_multireward's summed reward
maps from its range, each component logged; a GRPO run trains on example_single_tool_call; bad
options, a missing runtime and a dead server are clear errors, never a reward of 0."""
from __future__ import annotations

import json
import signal
import os
import subprocess

import pytest

from conftest import needs_runtime
from gymloop import runtimes
from gymloop.envs import make_env
from gymloop.envs.base import play, play_turns
from gymloop.models.toolcalls import format_call

MULTI = "resources_servers.example_multi_step.app:ExampleMultiStepResourcesServer"
SINGLE = "resources_servers.example_single_tool_call.app:SimpleWeatherResourcesServer"
MULTIREWARD = "resources_servers.example_tool_call_multireward.app:ToolCallMultiRewardResourcesServer"
# its /seed_session takes a field of the row (initial_count): a 422 without it
COUNTER = "resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer"


@pytest.fixture(scope="module")
def multi():
    needs_runtime("nemo-gym")
    env = make_env("nemo_gym", server=MULTI)
    yield env
    env.close()


def gold(row: dict) -> list[str]:
    return [format_call("get_synonym_value", {"synonym": s}) for s in row["expected_synonyms"]] + [
        format_call("extract_synonym_values", {"synonym_values": row["expected_synonym_values"]}), "Done."]


def direct_verify(row: dict, response: dict) -> dict:
    """The server's own verify, called in its runtime on the class itself (no HTTP, no gymloop)."""
    script = f"""
import asyncio, json, sys
from unittest.mock import MagicMock
from nemo_gym.server_utils import ServerClient
from resources_servers.example_multi_step.app import (ExampleMultiStepResourcesServer as S,
    ExampleMultiStepResourcesServerConfig as C, ExampleMultiStepVerifyRequest as R)
server = S(config=C(host="127.0.0.1", port=0, entrypoint="", name=""), server_client=MagicMock(spec=ServerClient))
got = asyncio.run(server.verify(R.model_validate(json.loads(sys.stdin.read()))))
print(json.dumps(got.model_dump(mode="json")))
"""
    out = subprocess.run([str(runtimes.python("nemo-gym")), "-c", script], input=json.dumps({**row, "response": response}),
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_gold_and_wrong_episodes_score_as_the_servers_own_verify_says(multi, monkeypatch):
    import gymloop.envs.nemo_gym as ng

    sent = []
    real = ng.response_of
    monkeypatch.setattr(ng, "response_of", lambda *a: sent.append(real(*a)) or sent[-1])
    for task in multi.tasks:
        row = multi.row(task)
        wrong = [format_call("extract_synonym_values", {"synonym_values": row["expected_synonym_values"][::-1] + [1]}),
                 "Done."]
        for turns, expected in ((gold(row), 1.0), (wrong, 0.0)):
            _, score = play(multi, task, turns)
            own = direct_verify(row, sent[-1])
            assert score.reward == own["reward"] == expected
            assert score.components["set_overlap"] == own["set_overlap"]
            assert score.components["accuracy"] == float(own["accuracy"])


def test_tool_calls_reach_the_server_and_its_answers_the_model(multi):
    task = multi.tasks[0]
    row = multi.row(task)
    messages = play_turns(multi, task, gold(row)[:1] + ["Done."])
    tool = [m for m in messages if m["role"] == "tool"][0]
    assert json.loads(tool["content"]) == {"synonym_value": sum(map(ord, row["expected_synonyms"][0]))}
    assert multi.tools(task)[0]["function"]["name"] == "get_synonym_value"
    assert messages[0]["role"] == "system"                 # the row's input, as NeMo Gym wrote it
    multi.verify(task, messages)


def test_a_reward_of_three_components_maps_from_its_range_each_component_logged():
    needs_runtime("nemo-gym")
    env = make_env("nemo_gym", server=MULTIREWARD, reward_range=[0, 3])
    try:
        task = env.tasks[0]
        call = format_call("get_weather", env.row(task)["expected_call"]["arguments"])
        # (correctness, schema_valid, format) as the server's README defines them
        cases = {"the call alone": ([call], (1, 1, 1)),
                 "another city": ([format_call("get_weather", {"city": "Atlantis"})], (0, 1, 1)),
                 "the call and prose": ([f"Let me check. {call}"], (1, 1, 0)),
                 "no arguments": ([format_call("get_weather", {})], (0, 0, 1)),
                 "prose only": (["It is sunny."], (0, 0, 0))}
        for what, (turns, parts) in cases.items():
            messages, score = play(env, task, turns)
            assert messages[-1]["role"] == "assistant", what        # one turn: the call is the answer
            got = tuple(score.components[k] for k in ("correctness", "schema_valid", "format"))
            assert got == parts and score.components["reward"] == sum(parts), what
            assert score.reward == sum(parts) / 3, what
    finally:
        env.close()
    with pytest.raises(ValueError, match="reward_range must be"):
        make_env("nemo_gym", server=MULTIREWARD, reward_range=[3, 0])


def test_validate_says_there_is_no_gold_reply(capsys):
    from gymloop.cli import main

    needs_runtime("nemo-gym")
    assert main(["envs", "validate", "nemo_gym", "--options", json.dumps({"server": MULTI}), "--n", "2"]) != 0
    assert "no gold replies" in capsys.readouterr().err


def test_grpo_trains_on_an_example(tmp_path, tok):
    """A few GRPO steps on example_single_tool_call, every episode through the server."""
    from conftest import few_grpo_steps, tiny_llama
    from gymloop.models.checkpoint import save_model

    needs_runtime("nemo-gym")
    model = save_model(tiny_llama(tok.vocab_size, seed=4, positions=2048), tok, tmp_path / "tiny")
    few_grpo_steps(tmp_path, model, {"name": "nemo_gym", "options": {"server": SINGLE, "heldout_fraction": 0.4},
                                     "max_turns": 2}, prompts=2, eval_tasks=2)


def test_a_server_whose_seed_session_takes_fields_is_seeded_with_the_row(tmp_path, tok):
    """example_session_state_mgmt starts each session's counter at the row's initial_count: the
    gold calls reach the row's expected_count only if /seed_session got the row."""
    from conftest import few_grpo_steps, tiny_llama
    from gymloop.models.checkpoint import save_model

    needs_runtime("nemo-gym")
    env = make_env("nemo_gym", server=COUNTER)
    try:
        for task in env.tasks[:3]:
            row = env.row(task)
            adds = [format_call("increment_counter", {"count": int(n)})
                    for n in row["responses_create_params"]["input"][0]["content"].split() if n.isdigit()]
            assert play(env, task, adds + ["Done."])[1].reward == 1.0
            assert play(env, task, adds[:1] + ["Done."])[1].reward == 0.0
    finally:
        env.close()
    model = save_model(tiny_llama(tok.vocab_size, seed=4, positions=2048), tok, tmp_path / "tiny")
    few_grpo_steps(tmp_path, model, {"name": "nemo_gym", "options": {"server": COUNTER, "heldout_fraction": 0.4},
                                     "max_turns": 2}, prompts=2, eval_tasks=2)


def test_bad_options_a_missing_runtime_and_a_dead_server_are_clear_errors(monkeypatch):
    from gymloop.envs.nemo_gym import NemoGymError

    with pytest.raises(ValueError, match="one of options server"):
        make_env("nemo_gym")
    with pytest.raises(ValueError, match="module:Class"):
        make_env("nemo_gym", server="resources_servers.example_multi_step")
    needs_runtime("nemo-gym")
    with pytest.raises(NemoGymError, match="(?s)did not start.*No module named 'no_such'"):
        make_env("nemo_gym", server="no_such.app:Server")
    env = make_env("nemo_gym", server=MULTI)
    try:
        task = env.tasks[0]
        msgs = env.reset(task)
        os.killpg(env.process.proc.pid, signal.SIGKILL)     # the server and its watchdog
        env.process.proc.wait()
        msgs.append({"role": "assistant", "content": gold(env.row(task))[0]})
        with pytest.raises(NemoGymError, match="did not answer"):
            env.step(task, msgs, msgs[-1]["content"])
    finally:
        env.close()
    monkeypatch.setenv("GYMLOOP_NEMO_GYM_PYTHON", "/no/such/python")
    with pytest.raises(runtimes.RuntimeMissing, match="run `gymloop envs install nemo-gym`"):
        make_env("nemo_gym", server=MULTI)
