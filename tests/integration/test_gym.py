"""The gym: tool-call parsing, versioned tools and drift, code in the sandbox, JSONL tasks."""
from __future__ import annotations

import json
import re

import pytest

from gymloop.engine import Generation, GenerationBatch
from gymloop.envs import REGISTRY, make_env, play
from gymloop.envs.jsonl import load_tasks
from gymloop.envs.registry import NEEDS_FILE
from gymloop.models.toolcalls import format_call, parse_tool_calls
from gymloop.envs.validate import validate
from gymloop.rollout.evaluate import evaluate
from gymloop.rollout.episodes import collect
from gymloop.sandbox import find_bwrap

needs_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")


# --- tool calls -------------------------------------------------------------------------
def test_parse_tool_calls_robustly():
    p = parse_tool_calls('I will look. <tool_call>{"name": "get_stock", "arguments": {"item": "fig"}}</tool_call>')
    assert [(c.name, c.arguments) for c in p.calls] == [("get_stock", {"item": "fig"})] and not p.errors
    assert p.text == "I will look."
    p = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert p.calls[0].arguments == {"a": 1}
    for bad, msg in [('<tool_call>{"name": "f", </tool_call>', "not valid JSON"),
                     ('<tool_call>[1, 2]</tool_call>', 'string "name"'),
                     ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object"),
                     ('<tool_call>{"name": "f"}', "unclosed")]:
        p = parse_tool_calls(bad)
        assert not p.calls and msg in p.errors[0], (bad, p.errors)


@pytest.mark.parametrize("reply", [
    '<tool_call>{"name": "get_stock", "arguments": {"item": "fig"</tool_call>',    # malformed JSON
    '<tool_call>{"name": "launch_missiles", "arguments": {}}</tool_call>',         # unknown tool
    '<tool_call>{"name": "get_stock", "arguments": {"sku": "fig"}}</tool_call>',   # wrong argument
    "<tool_call>" + "x" * 100_000,                                                  # 100 KB of output
    "7" * 100_000,
])
def test_bad_model_output_gets_an_error_observation_not_a_crash(reply):
    env = make_env("tools")
    task = env.sample_tasks(1, "train", 0)[0]
    msgs = env.reset(task) + [{"role": "assistant", "content": reply}]
    step = env.step(task, msgs, reply)
    if not step.done:
        payload = json.loads(step.observation[0]["content"])      # the template wraps it in <tool_response>
        assert "error" in payload
    score = env.verify(task, msgs)
    assert score.reward == 0.0 and score.error is None


# --- versioned tools and drift ----------------------------------------------------------
def test_tool_api_versions_differ_and_are_recorded(tok):
    v1, v2, v3 = make_env("tools", version=1), make_env("tools@v2"), make_env("tools@v3")
    assert (v1.name, v2.name, v3.name) == ("tools@v1", "tools@v2", "tools@v3")
    t1, t2, t3 = (e.sample_tasks(5, "heldout", 0) for e in (v1, v2, v3))
    # the schema reaches the model through the chat template's tool rendering
    prompt = lambda e, t: tok.decode(tok.prompt_ids(e.reset(t), tools=e.tools(t)), skip_special_tokens=False)  # noqa: E731
    p1, p2, p3 = prompt(v1, t1[0]), prompt(v2, t2[0]), prompt(v3, t3[0])
    assert "get_stock(item) add_stock(item,count)" in p1 and "get_stock(item) add_stock(item,count)" in p2
    assert "lookup_item(sku) restock(sku,quantity)" in p3 and "get_stock" not in p3
    assert all(t.info["version"] == 2 for t in t2) and all(t.info["version"] == 3 for t in t3)
    for env, tasks, v in ((v2, t2, 2.0), (v3, t3, 3.0)):
        _, s = play(env, tasks[0], env.gold_turns(tasks[0]))
        assert s.reward == 1.0 and s.components["version"] == v
        # from v2 on, the result format is different
        call = env.gold_turns(tasks[0])[0]
        step = env.step(tasks[0], env.reset(tasks[0]) + [{"role": "assistant", "content": call}], call)
        assert '"quantity"' in step.observation[0]["content"] and '"count"' not in step.observation[0]["content"]
    call = v1.gold_turns(t1[0])[0]
    step = v1.step(t1[0], v1.reset(t1[0]) + [{"role": "assistant", "content": call}], call)
    assert '"count"' in step.observation[0]["content"]


class V1Policy:
    """A scripted agent that learned tools@v1 and nothing else, served as an engine.

    It reads the rendered conversation (as a model would), calls the v1 tools, and answers
    with the `count` it was given; on any other reply it answers 0. It runs through the real
    rollout path: token ids across turns, observations appended and masked.
    """

    version = 0

    def __init__(self, tok):
        self.tok = tok

    def _reply(self, text: str) -> str:
        user = text.rsplit("<|user|>", 1)[1]
        item = re.search(r"(?:many|Add \d+) (\w+)", user).group(1)
        add = re.search(r"Add (\d+)", user)
        if "<|tool|>" not in text:
            if add:
                return format_call("add_stock", {"item": item, "count": int(add.group(1))})
            return format_call("get_stock", {"item": item})
        last = json.loads(re.findall(r"<tool_response>(.*?)</tool_response>", text)[-1])
        return str(last.get("count", 0))

    def generate(self, prompts, params):
        gens = []
        for p in prompts:
            ids = self.tok.encode(self._reply(self.tok.decode(p, skip_special_tokens=False)))
            ids.append(self.tok.hf.eos_token_id)
            gens.append(Generation(ids, [0.0] * len(ids), "stop"))
        return GenerationBatch(gens, sum(map(len, prompts)), sum(len(g.token_ids) for g in gens), 0.0, 0)


def test_drift_v1_policy_scores_lower_on_v2(tok):
    policy = V1Policy(tok)
    results = {}
    for name in ("tools@v1", "tools@v2", "tools@v3"):
        env = make_env(name)
        res = evaluate(policy, tok, env, env.sample_tasks(40, "heldout", 0), max_new_tokens=64, max_turns=3)
        results[res.env] = res.mean_reward
    assert set(results) == {"tools@v1", "tools@v2", "tools@v3"}      # eval output names the version
    assert results["tools@v1"] == 1.0 and results["tools@v2"] <= 0.2 and results["tools@v3"] <= 0.2, results


def test_multi_turn_rollout_keeps_sampled_ids_and_masks_observations(tok):
    env = make_env("tools")
    rolls, _ = collect(V1Policy(tok), tok, env, env.sample_tasks(3, "train", 0), 1,
                       __import__("gymloop").SamplingParams(max_new_tokens=64), max_turns=3)
    for r in rolls:
        assert r.turns == 2 and r.reward == 1.0
        assert len(r.token_ids) == len(r.mask) == len(r.logprobs)
        model = [t for t, m in zip(r.token_ids, r.mask) if m]
        obs = [t for t, m in zip(r.token_ids, r.mask) if not m]
        assert tok.decode(obs, skip_special_tokens=False).startswith("<|tool|><tool_response>")
        assert "<tool_call>" in tok.decode(model)
        # the observation is appended after the model's own tokens, never re-tokenized
        assert r.token_ids[: r.mask.index(0)] == model[: r.mask.index(0)]


# --- validation, code, humaneval -----------------------------------------------------------
@needs_bwrap
@pytest.mark.parametrize("name", [n for n in REGISTRY.names() if n not in NEEDS_FILE] + ["tools@v2", "tools@v3"])
def test_validate_every_builtin_environment(name):
    env = make_env(name)
    v = validate(env, n=12)
    assert v.ok, v.errors
    assert v.gold_passed == v.tasks == 12 and v.wrong_rejected == v.wrong_checked == 12
    getattr(env, "close", lambda: None)()


@needs_bwrap
def test_humaneval_all_canonical_pass_and_stubs_fail():
    from gymloop.envs.humaneval import HumanEvalEnv

    env = HumanEvalEnv()
    tasks = env.sample_tasks(164, "heldout", 0)
    gold = env.verify_batch([(t, [*t.prompt, {"role": "assistant", "content": env.gold_reply(t)}]) for t in tasks])
    stub = env.verify_batch([(t, [*t.prompt, {"role": "assistant", "content": env.wrong_turns(t)[0]}]) for t in tasks])
    env.close()
    assert sum(s.reward == 1.0 for s in gold) == 164 and not any(s.error for s in gold)
    assert sum(s.reward == 1.0 for s in stub) == 0 and not any(s.error for s in stub)
    with pytest.raises(ValueError, match="evaluation-only"):
        env.sample_tasks(3, "train", 0)


@needs_bwrap
def test_code_partial_credit_and_hostile_solutions():
    env = make_env("code", levels=[1])
    task = env.sample_tasks(1, "train", 0)[0]
    score = lambda code: env.verify(task, [*task.prompt, {"role": "assistant", "content": code}])  # noqa: E731
    assert score(env.gold_reply(task)).reward == 1.0
    (args0, want0), _ = task.answer[0], None
    s = score(f"def solve(*a):\n    return {want0!r} if list(a) == {list(args0)!r} else None\n")
    assert 0.0 < s.reward < 1.0 and s.components["all_passed"] == 0.0
    s = score("while True: pass")
    assert s.reward == 0.0 and "timed out" in s.reason and s.error is None
    s = score("import os\nos.system('rm -rf /')\ndef solve(x): return 1")
    assert s.error is None
    s = score("syntax error here(")
    assert s.reward == 0.0 and "import failed" in s.reason
    env.close()


def test_jsonl_bad_line_is_named_and_good_lines_load(tmp_path):
    f = tmp_path / "tasks.jsonl"
    f.write_text("\n".join([
        json.dumps({"id": "a", "env": "arith", "prompt": "1+1=", "answer": 2}),
        "{not json",
        json.dumps({"id": "b", "env": "arith"}),
        json.dumps({"id": "c", "env": "arith", "prompt": [{"role": "user", "content": "2+2="}], "answer": 4,
                    "split": "heldout", "source": "production"}),
        json.dumps({"id": "d", "env": "arith", "prompt": "x", "split": "test"}),
        json.dumps({"id": "e", "env": "arith", "prompt": "x", "colour": "red"}),
    ]) + "\n")
    tasks, errors = load_tasks(f)
    assert [t.id for t in tasks] == ["a", "c"]
    assert tasks[1].split == "heldout" and tasks[1].source == "production"
    assert [e.split(":")[1] for e in errors] == ["2", "3", "5", "6"]
    assert "missing field(s) ['prompt']" in errors[1] and "unknown field(s) ['colour']" in errors[3]


def test_cli_envs(tmp_path, capsys):
    from gymloop.cli import main

    assert main(["envs", "list"]) == 0
    assert "tools" in capsys.readouterr().out
    assert main(["envs", "validate", "tools@v2", "--n", "5"]) == 0
    assert "tools@v2   ok" in capsys.readouterr().out
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "a", "env": "arith", "prompt": "1+1="}\nbad\n')
    assert main(["envs", "load", str(f)]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"loaded": 1, "errors": 1} and ":2:" in captured.err


def test_reasoning_gym_adapter():
    pytest.importorskip("reasoning_gym", reason="pip install reasoning-gym")
    env = make_env("reasoning_gym", dataset="basic_arithmetic", size=200)
    assert env.name == "rg:basic_arithmetic"
    t = env.sample_tasks(1, "heldout", 0)[0]
    reply = lambda text: env.verify(t, [*t.prompt, {"role": "assistant", "content": text}])  # noqa: E731
    assert reply(f"Let me think. Answer: {t.answer}").reward == 1.0
    assert reply("Answer: 123456789").reward < 1.0
    with pytest.raises(ValueError, match="'nope'"):
        make_env("reasoning_gym", dataset="nope")


def test_the_v3_drift_breaks_old_tool_calls_by_construction(tok):
    """v3 renamed the tools and their arguments: an old-name call is an error observation, the
    episode scores 0; without schemas in the prompt, nothing the model sees changes."""
    v1, v3 = make_env("tools", version=1, schemas=False), make_env("tools", version=3, schemas=False)
    for t1 in v1.sample_tasks(20, "train", 0):
        t3 = v3.task_from_id(t1.id.replace("tools@v1", "tools@v3"))
        assert tok.prompt_ids(v1.reset(t1), tools=v1.tools(t1)) == tok.prompt_ids(v3.reset(t3), tools=v3.tools(t3))
        old = v1.gold_turns(t1)                       # the v1 habit, replayed against v3
        msgs, score = play(v3, t3, old)
        payload = json.loads(msgs[3]["content"])
        assert "unknown tool" in payload["error"] and "lookup_item" in payload["error"]
        assert score.reward == 0.0 and score.error is None and score.components["tool_calls_valid"] == 0.0
        assert play(v3, t3, v3.gold_turns(t3))[1].reward == 1.0     # the new API works
    # with schemas, the prompt says what changed
    s1, s3 = make_env("tools@v1"), make_env("tools@v3")
    t = s1.sample_tasks(1, "train", 0)[0]
    assert s1.tools(t) != s3.tools(s3.task_from_id(t.id)) and v1.tools(t) == []


# --- calls: function calling from schemas, held-out tools never trained on ----------------------
def test_calls_holds_out_whole_tools_and_checks_name_and_arguments():
    env = make_env("calls")
    train, held = env.sample_tasks(60, "train", 0), env.sample_tasks(60, "heldout", 0)
    offered = lambda tasks: {n for t in tasks for n in t.info["tools"]}      # noqa: E731
    assert offered(train) and offered(held) and not offered(train) & offered(held)
    for t in train[:10] + held[:10]:
        assert env.task_from_id(t.id) == t
        assert [s["function"]["name"] for s in env.tools(t)] == t.info["tools"] and t.answer["name"] in t.info["tools"]
        gold = env.verify(t, list(t.prompt) + [{"role": "assistant", "content": env.gold_reply(t)}])
        wrong = env.verify(t, list(t.prompt) + [{"role": "assistant", "content": env.wrong_turns(t)[0]}])
        assert (gold.reward, gold.components["valid"]) == (1.0, 1.0)
        assert (wrong.reward, wrong.components["valid"], wrong.reason) == (0.0, 1.0, "wrong arguments")
    t = held[0]
    upper = {k: v.upper() if isinstance(v, str) else v for k, v in t.answer["arguments"].items()}
    assert env.verify(t, [{"role": "assistant", "content": format_call(t.answer["name"], upper)}]).reward == 1.0
    two = format_call(t.answer["name"], t.answer["arguments"]) * 2
    assert env.verify(t, [{"role": "assistant", "content": two}]).reason == "2 calls, expected 1"


def test_calls_v2_renames_tools_and_arguments_in_the_schemas_too():
    v1, v2 = make_env("calls", heldout="requests"), make_env("calls@v2", heldout="requests")
    assert (v1.name, v2.name) == ("calls", "calls@v2")
    t1, t2 = v1.sample_tasks(40, "train", 3), v2.sample_tasks(40, "train", 3)
    # the same requests, asked of renamed tools: nothing in a request tells the versions apart
    assert [t.prompt for t in t1] == [t.prompt for t in t2]
    for a, b in zip(t1, t2):
        assert a.answer["name"] != b.answer["name"] and set(a.answer["arguments"]).isdisjoint(b.answer["arguments"])
        assert sorted(map(str, a.answer["arguments"].values())) == sorted(map(str, b.answer["arguments"].values()))
        schema = {s["function"]["name"]: s for s in v2.tools(b)}[b.answer["name"]]
        assert set(schema["function"]["parameters"]["properties"]) == set(b.answer["arguments"])
        old = v2.verify(b, [{"role": "assistant", "content": v1.gold_reply(a)}])     # the memorised call
        assert (old.reward, old.components["valid"]) == (0.0, 0.0)
        assert v2.verify(b, [{"role": "assistant", "content": v2.gold_reply(b)}]).reward == 1.0
        assert v2.task_from_id(b.id) == b
    # heldout=requests: the production agent's own tools, requests never asked in training
    held = v2.sample_tasks(40, "heldout", 4)
    assert {n for t in held for n in t.info["tools"]} <= {t.name for t in v2.split_tools["train"]}
    assert not {t.prompt[-1]["content"] for t in held} & {t.prompt[-1]["content"] for t in v2.sample_tasks(150, "train", 5)}


def test_calls_new_tool_requests_teach_and_measure_the_tools_demonstrations_never_show():
    """heldout=new-tool-requests: both splits use the held-out tools (never in the default training
    split, so never in a demonstration), and no request of the training split is held out."""
    plain, new = make_env("calls"), make_env("calls", heldout="new-tool-requests")
    taught = {t.name for t in plain.split_tools["train"]}
    train, held = new.sample_tasks(120, "train", 1), new.sample_tasks(60, "heldout", 2)
    for tasks in (train, held):
        assert {n for t in tasks for n in t.info["tools"]} <= {t.name for t in plain.split_tools["heldout"]}
        assert not {t.answer["name"] for t in tasks} & taught
    assert not {t.prompt[-1]["content"] for t in held} & {t.prompt[-1]["content"] for t in train}
    assert all(new.task_from_id(t.id) == t for t in held[:10])


def test_calls_components_give_partial_credit_and_weights_turn_them_into_a_signal():
    """A group where no call is right has no GRPO signal from the reward; with reward_weights the
    right tool, and then the right argument names, are worth something (train's score())."""
    from types import SimpleNamespace

    from gymloop.config import GRPOConfig
    from gymloop.orchestrator.train import score

    env = make_env("calls@v2", heldout="requests")
    t = env.sample_tasks(1, "train", 0)[0]
    name, args = t.answer["name"], t.answer["arguments"]
    other = next(n for n in t.info["tools"] if n != name)
    bad_values = {k: v + 1 if isinstance(v, int) else v + "x" for k, v in args.items()}
    replies = [format_call(name, bad_values),                       # right tool and names, wrong values
               format_call(name, {k + "_old": v for k, v in args.items()}),   # right tool, other names
               format_call(other, args), "I cannot help with that."]
    scores = [env.verify(t, [{"role": "assistant", "content": r}]) for r in replies]
    assert [s.reward for s in scores] == [0.0] * 4
    assert [(s.components["tool"], s.components["arguments"]) for s in scores] == [(1, 1), (1, 0), (0, 0), (0, 0)]
    rollouts = [SimpleNamespace(ok=True, reward=s.reward, score=s, mask=[1]) for s in scores]
    assert score(rollouts, GRPOConfig(group_size=4), 48).signal_groups == 0
    shaped = score(rollouts, GRPOConfig(group_size=4, reward_weights={"tool": 0.25, "arguments": 0.25,
                                                                       "correct": 0.5}), 48)
    adv = shaped.advantages.tolist()
    assert shaped.signal_groups == 1 and adv[0] > adv[1] > adv[2] == adv[3]
    with pytest.raises(ValueError, match="does not report"):
        score(rollouts, GRPOConfig(group_size=4, reward_weights={"tool_name": 1.0}), 48)


def test_calls_demonstrations_are_openai_function_calling_rows():
    env = make_env("calls")
    t = env.sample_tasks(1, "train", 0)[0]
    row = env.demonstration(t)
    call = row["messages"][-1]["tool_calls"][0]["function"]
    assert row["tools"] == env.tools(t) and row["messages"][:-1] == list(t.prompt)
    assert (call["name"], json.loads(call["arguments"])) == (t.answer["name"], t.answer["arguments"])


def test_graded_rows_with_tools_put_them_in_the_prompt_and_the_calls_in_the_sample():
    from gymloop.envs.graders import sample_of

    schema = make_env("calls").tools(make_env("calls").sample_tasks(1, "train", 0)[0])
    env = make_env("graded", rows=[{"messages": [{"role": "user", "content": "go"}], "tools": schema}],
                   grader={"type": "string_check", "name": "s", "input": "{{sample.output_text}}",
                           "reference": "x", "operation": "eq"})
    assert env.tools(env.tasks("train")[0]) == schema
    reply = 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    sample = sample_of(reply, tools=True)
    assert sample["output_text"] == "ok" and sample["output_tools"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert "output_tools" not in sample_of(reply) and sample_of(reply)["output_text"] == reply
