"""OpenEnv environments through gymloop, for real: OpenEnv's own example (the environment
`openenv init` writes, unchanged) served from OpenEnv's runtime (`make openenv`), driven by
OpenEnv's own client in gymloop's bridge. Its rewards through gymloop equal the environment's
own called directly; a GRPO run trains on it; bad options, a missing runtime, an app that does not
import and a bridge that dies are clear errors, never a reward of 0."""
from __future__ import annotations

import json
import signal
import os
import subprocess

import pytest

from conftest import needs_runtime
from gymloop import runtimes
from gymloop.envs import make_env
from gymloop.envs.base import play

REPLIES = ["hello world!", "hi", "a longer message than the others", ""]


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    """OpenEnv's example environment, as `openenv init echo_env` writes it (not edited)."""
    needs_runtime("openenv")
    root = tmp_path_factory.mktemp("openenv")
    subprocess.run([str(runtimes.python("openenv").parent / "openenv"), "init", "echo_env"], cwd=root, check=True,
                   capture_output=True)
    return {"app": "echo_env.server.app:app", "path": str(root)}


@pytest.fixture(scope="module")
def env(echo):
    e = make_env("openenv", **echo, reward_range=[0, 4], sessions=64)
    yield e
    e.close()


def direct_returns(echo, replies: list[str]) -> list[float]:
    """The environment's own code, called directly in its runtime: each reply's step reward."""
    script = ("import json, sys\nsys.path.insert(0, sys.argv[1])\n"
              "from echo_env.server.echo_env_environment import EchoEnvironment\n"
              "from echo_env.models import EchoAction\n"
              "env = EchoEnvironment(); env.reset()\n"
              "print(json.dumps([env.step(EchoAction(message=m)).reward for m in json.loads(sys.argv[2])]))\n")
    out = subprocess.run([str(runtimes.python("openenv")), "-c", script, echo["path"], json.dumps(replies)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_reward_through_gymloop_is_the_environments_own(env, echo):
    assert env.action_field == "message"            # the action's one field of its own: the reply's text
    task = env.sample_tasks(1, "train", 0)[0]
    messages, score = play(env, task, REPLIES)
    own = direct_returns(echo, REPLIES)
    assert score.components["return"] == sum(own) and score.components["steps"] == len(REPLIES)
    assert score.reward == min(1.0, sum(own) / 4)
    # the model read the server's observations: each step's echo of the reply before it
    assert [json.loads(m["content"])["echoed_message"] for m in messages if m["role"] == "user"][1:] == REPLIES[:-1]


def test_sessions_are_episodes_and_run_side_by_side(env):
    """A GRPO group: episodes of one task interleaved, each its own session and return."""
    task = env.sample_tasks(1, "train", 1)[0]
    a, b = env.reset(task), env.reset(task)
    for msgs, text in ((a, "x" * 30), (b, "y")):
        msgs.append({"role": "assistant", "content": text})
        env.step(task, msgs, text)
    assert env.verify(task, a).components["return"] == pytest.approx(3.0)
    assert env.verify(task, b).components["return"] == pytest.approx(0.1)


def test_validate_says_there_is_no_gold_reply(echo, capsys):
    from gymloop.cli import main

    assert main(["envs", "validate", "openenv", "--options", json.dumps(echo), "--n", "2"]) != 0
    assert "no gold replies" in capsys.readouterr().err


def test_grpo_trains_on_it(tmp_path, tiny_model_dir, echo):
    """A few GRPO steps on the echo environment, every episode through OpenEnv's server."""
    from conftest import few_grpo_steps

    summary, trained = few_grpo_steps(tmp_path, tiny_model_dir, {
        "name": "openenv", "options": {**echo, "reward_range": [0, 1.2], "sessions": 16}, "max_turns": 1},
        steps=3, new_tokens=24, eval_tasks=8)
    assert any(r["reward"] > 0 for r in trained) and summary["base"]["tasks"] == 8


def test_bad_options_a_missing_runtime_and_a_dead_server_are_clear_errors(echo, monkeypatch):
    from gymloop.envs.openenv import OpenEnvError

    with pytest.raises(ValueError, match="one of options app"):
        make_env("openenv")
    with pytest.raises(ValueError, match="module:attribute"):
        make_env("openenv", app="echo_env")
    with pytest.raises(OpenEnvError, match="(?s)did not start.*No module named 'no_such_env'"):
        make_env("openenv", app="no_such_env.server.app:app", path=echo["path"])
    env = make_env("openenv", **echo)              # served as it is: one session at a time
    try:
        task = env.sample_tasks(1, "train", 2)[0]
        msgs = env.reset(task)
        with pytest.raises(OpenEnvError, match="(?s)(CAPACITY_REACHED|ConnectionClosed).*give option sessions"):
            env.reset(task)
        os.killpg(env.bridge.proc.pid, signal.SIGKILL)      # the bridge and its watchdog
        msgs.append({"role": "assistant", "content": "hi"})
        with pytest.raises(OpenEnvError, match="exited"):
            env.step(task, msgs, "hi")
    finally:
        env.close()
    monkeypatch.setenv("GYMLOOP_OPENENV_PYTHON", "/no/such/python")
    with pytest.raises(runtimes.RuntimeMissing, match="run `gymloop envs install openenv`"):
        make_env("openenv", **echo)
