"""verifiers environments through gymloop, for real: a v0 environment (tests/fixtures/vf_reverse,
written against verifiers' own API, its dataset built offline) loaded by verifiers'
`load_environment` in verifiers' runtime (`make verifiers`) and scored by its own Rubric. Its
rewards through gymloop equal its reward functions called directly; validate scores its answers
1.0 and wrong replies less; a GRPO run trains on it; bad options, a missing runtime, an unknown
environment and a dead bridge are clear errors. A multi-turn ToolEnv (tests/fixtures/vf_lookup)
runs its own rollout, gymloop answering each turn: its tools run on gymloop's tool calls, its
record of the episode scores as verifiers' own rollout of the same turns does, GRPO trains on it."""
from __future__ import annotations

import json
import signal
import os
import time
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import needs_runtime
from gymloop import runtimes
from gymloop.envs import make_env
from gymloop.envs.base import play

FIXTURES = str(Path(__file__).parent.parent / "fixtures")
OPTIONS = {"env": "vf-reverse", "path": FIXTURES}
LOOKUP = {"env": "vf-lookup", "path": FIXTURES}


@pytest.fixture(scope="module")
def env():
    needs_runtime("verifiers")
    e = make_env("verifiers", **OPTIONS)
    yield e
    e.close()


def direct(pairs: list[tuple[str, str]]) -> list[dict]:
    """The rubric's reward functions called directly in verifiers' runtime, weighted as it weights them."""
    script = """
import json, sys
sys.path.insert(0, sys.argv[1])
import verifiers as vf
group = vf.load_environment("vf-reverse").rubric          # the env's rubric and its own monitor rubric
funcs = [(f, w) for r in group.rubrics for f, w in zip(r.funcs, r.weights) if f.__name__ in ("lcs", "exact")]
out = []
for reply, answer in json.loads(sys.argv[2]):
    completion = [{"role": "assistant", "content": reply}]
    parts = {f.__name__: float(f(completion=completion, answer=answer)) for f, _ in funcs}
    out.append({"reward": sum(parts[f.__name__] * w for f, w in funcs), **parts})
print(json.dumps(out))
"""
    got = subprocess.run([str(runtimes.python("verifiers")), "-c", script, FIXTURES, json.dumps(pairs)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(got.strip().splitlines()[-1])


def test_the_rubric_through_gymloop_scores_as_its_functions_called_directly(env):
    tasks = env.sample_tasks(4, "heldout", 0) + env.sample_tasks(4, "train", 0)
    replies = [t.answer if i % 3 == 0 else t.answer[:i % 4] + "zz" if i % 3 == 1 else "" for i, t in enumerate(tasks)]
    ours = env.verify_batch([(t, play(env, t, [r])[0]) for t, r in zip(tasks, replies)])
    theirs = direct([(r, t.answer) for t, r in zip(tasks, replies)])
    for s, d in zip(ours, theirs):
        assert s.components["reward"] == d["reward"] and s.reward == min(1.0, d["reward"])
        assert s.components["exact"] == d["exact"] and s.components["lcs"] == d["lcs"]
    assert {s.reward for s in ours} != {ours[0].reward}                    # not one score for every reply
    # a reply the token limit cut is never stepped: verify sends it over, as a truncated response
    cut = env.reset(tasks[0]) + [{"role": "assistant", "content": tasks[0].answer}]
    score = env.verify(tasks[0], cut)
    assert score.reward == 1.0 and score.components["num_turns"] == 1.0


def test_validate_replies_with_the_answer_and_a_wrong_reply(capsys):
    from gymloop.cli import main

    needs_runtime("verifiers")
    assert main(["envs", "validate", "verifiers", "--options", json.dumps(OPTIONS), "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "gold 6/6 scored 1.0" in out and "known-wrong 6/6 scored < 1.0" in out


def test_envs_install_with_adds_a_users_environment_package_to_the_runtime(tmp_path):
    from gymloop.cli import main
    from gymloop.envs.verifiers import VerifiersError

    needs_runtime("verifiers")
    # a copy: pip builds a path in place, and the fixture stays clean
    pkg = shutil.copytree(Path(FIXTURES) / "vf_reverse", tmp_path / "vf_reverse",
                          ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    try:
        assert main(["envs", "install", "verifiers", "--with", str(pkg)]) == 0
        env = make_env("verifiers", env="vf-reverse")            # no path: imported from the runtime
        try:
            assert len(env.rows["train"]) == 40 and len(env.rows["heldout"]) == 20
        finally:
            env.close()
    finally:
        subprocess.run([str(runtimes.python("verifiers")), "-m", "pip", "uninstall", "-y", "-q", "vf-reverse"], check=True)
    with pytest.raises(VerifiersError, match="did not start"):
        make_env("verifiers", env="vf-reverse")


def rollout_directly(turns: list[dict], split: str, index: int) -> dict:
    """verifiers' own rollout of vf-lookup's row with a scripted model (each turn's content and
    tool calls), scored by its rubric, in verifiers' runtime: no gymloop code involved."""
    script = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import verifiers as vf
from verifiers.clients import Client
from verifiers.types import Response, ResponseMessage, ToolCall

turns = json.loads(sys.argv[2])

class Scripted(Client):
    def setup_client(self, config): return None
    async def to_native_tool(self, tool): return tool
    async def to_native_prompt(self, messages): return messages, {}
    async def raise_from_native_response(self, r): return None
    async def from_native_response(self, r): return r
    async def close(self): return None
    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
        if not turns:
            raise vf.OverlongPromptError("out of turns")
        t = turns.pop(0)
        calls = [ToolCall(**c) for c in t["tool_calls"]] or None
        return Response(id="r", created=0, model="m", message=ResponseMessage(
            content=t["content"], tool_calls=calls, is_truncated=False, finish_reason="tool_calls" if calls else "stop"))

async def main():
    env = vf.load_environment("vf-lookup")
    rows = env.dataset if sys.argv[3] == "train" else env.eval_dataset
    state = await env.rollout(dict(rows[int(sys.argv[4])]), client=Scripted(None), model="m")
    await env.rubric.score_rollout(state)
    print(json.dumps({"reward": state["reward"], "metrics": state["metrics"],
                      "completion": [m.model_dump(mode="json", exclude_none=True) for m in state["completion"]]}))

asyncio.run(main())
"""
    got = subprocess.run([str(runtimes.python("verifiers")), "-c", script, FIXTURES, json.dumps(turns), split, str(index)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(got.strip().splitlines()[-1])


def test_a_multi_turn_tool_environment_runs_its_own_rollout_and_scores_as_verifiers_does():
    from gymloop.models.toolcalls import format_call, parse_tool_calls

    needs_runtime("verifiers")
    env = make_env("verifiers", **LOOKUP)
    try:
        task = env.sample_tasks(1, "heldout", 0)[0]
        word = task.prompt[-1]["content"].split()[5].rstrip("?")
        assert env.multi_turn and [t["function"]["name"] for t in env.tools(task)] == ["lookup"]
        call = format_call("lookup", {"word": word})
        scripts = {"looked up, then the code": [call, task.answer], "looked up, then a wrong code": [call, "000"],
                   "the code at once": [task.answer], "a call, then the turn limit": [call],
                   "an unknown word": [format_call("lookup", {"word": "zebra"}), task.answer]}
        for what, turns in scripts.items():
            messages, ours = play(env, task, turns)
            # the same turns as verifiers receives them: the text, and the calls gymloop parsed
            sent = [{"content": p.text, "tool_calls": [{"id": f"call_{1 + 2 * i}_{k}", "name": c.name,
                                                        "arguments": json.dumps(c.arguments)}
                                                       for k, c in enumerate(p.calls)]}
                    for i, p in enumerate(map(parse_tool_calls, turns))]
            theirs = rollout_directly(sent, "eval", task.info["index"])
            assert ours.reward == theirs["reward"] and ours.error is None, what
            assert {k: v for k, v in ours.components.items() if k != "reward"} == theirs["metrics"], what
            said = [m for m in theirs["completion"] if m["role"] == "tool"]
            assert [m["content"] for m in messages if m["role"] == "tool"] == [m["content"] for m in said], what
        assert play(env, task, scripts["looked up, then the code"])[1].reward == 1.0
        assert play(env, task, scripts["a call, then the turn limit"])[1].components["num_turns"] == 1.0
        assert len(play(env, task, [task.answer, "never sent"])[0]) == 2      # its stop condition: no call
    finally:
        env.close()


@pytest.mark.parametrize("options,turns", [(OPTIONS, 1), (LOOKUP, 3)], ids=["single-turn", "multi-turn"])
def test_grpo_trains_on_it(tmp_path, tiny_model_dir, options, turns):
    from conftest import few_grpo_steps

    needs_runtime("verifiers")
    summary, _ = few_grpo_steps(tmp_path, tiny_model_dir, {"name": "verifiers", "options": options, "max_turns": turns})
    assert summary["base"]["tasks"] == 4 and summary["final"]["tasks"] == 4
    assert summary["final"]["components"]["num_turns"] >= 1     # its monitor rubric's: every reply reached it


def test_a_loop_trains_and_gates_on_it_with_one_bridge_for_all_its_rounds(tmp_path, tiny_model_dir):
    """Two loop rounds on the multi-turn vf-lookup: the target environment (its bridge) is built
    once for the loop, serves each round's curriculum, training and gate, and closes with it."""
    from conftest import digit_loop_cfg
    from gymloop.loop.rounds import run_loop

    needs_runtime("verifiers")

    def bridges() -> int:
        out = subprocess.run(["ps", "-ww", "-eo", "stat,args"], capture_output=True, text=True).stdout.splitlines()
        return sum("verifiers_bridge.py vf-lookup" in ln and "watchdog.py" not in ln and not ln.startswith("Z")
                   for ln in out)

    before, seen = bridges(), []
    cfg = digit_loop_cfg(tmp_path, tiny_model_dir, {"steps": 2, "prompts_per_step": 4, "group_size": 4, "lr": 1e-3},
                         rounds=2, env={"name": "verifiers", "options": LOOKUP, "max_turns": 3},
                         eval={"tasks": 4, "max_new_tokens": 8}, sampling={"max_new_tokens": 8})
    rounds = run_loop(cfg, echo=lambda m: seen.append(bridges()))
    assert [r["round"] for r in rounds] == [1, 2] and all("verifiers" in r["metrics"]["after"] for r in rounds)
    assert seen and max(seen) - before == 1                   # one bridge, the loop's, through both rounds
    assert bridges() == before


def test_bad_options_a_missing_runtime_an_unknown_environment_and_a_dead_bridge_are_errors(monkeypatch):
    from gymloop.envs.verifiers import VerifiersError

    with pytest.raises(ValueError, match="needs option env"):
        make_env("verifiers")
    needs_runtime("verifiers")
    t0 = time.monotonic()
    with pytest.raises(VerifiersError, match="did not start") as failed:
        make_env("verifiers", env="no-such-env")
    # at once (not after a time-out), in one line: the cause, then where the whole log is
    message = str(failed.value)
    assert "\n" not in message and "no-such-env" in message and "(its log: " in message
    assert Path(message.rsplit("(its log: ", 1)[1].rstrip(")")).exists()
    assert time.monotonic() - t0 < 60      # a bound for a loaded machine; the wait it replaces was 120 s
    env = make_env("verifiers", **OPTIONS)
    try:
        task = env.sample_tasks(1, "train", 0)[0]
        os.killpg(env.bridge.proc.pid, signal.SIGKILL)      # the bridge and its watchdog
        env.bridge.proc.wait()
        with pytest.raises(VerifiersError, match="exited"):
            env.verify(task, play(env, task, ["x"])[0])
    finally:
        env.close()
    monkeypatch.setenv("GYMLOOP_VERIFIERS_PYTHON", "/no/such/python")
    with pytest.raises(runtimes.RuntimeMissing, match="run `gymloop envs install verifiers`"):
        make_env("verifiers", **OPTIONS)
