"""Environments from outside gymloop: an installed package's `gymloop.envs` entry point, a
`module:factory` reference, and the generic JSONL environment with its named checkers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import yaml

from gymloop.envs import Registry, make_env, rebuilds_tasks

PLUGIN = textwrap.dedent('''
    """A third-party environment: reply with the word you were given, reversed."""
    import random

    from gymloop.envs import Environment, Score, Task


    class Reverse(Environment):
        name = "reverse"

        def __init__(self, length=3):
            self.length = length

        def sample_tasks(self, n, split, seed):
            rng = random.Random(f"{split}{seed}")
            words = ["".join(rng.choice("abc") for _ in range(self.length)) for _ in range(n)]
            return [Task(id=f"reverse:{w}:{i}", env=self.name, prompt=({"role": "user", "content": w},),
                         answer=w[::-1], split=split) for i, w in enumerate(words)]

        def verify(self, task, messages):
            ok = float(messages[-1]["content"].strip() == task.answer)
            return Score(ok, {"correct": ok}, "reversed" if ok else "not reversed")

        def gold_reply(self, task):
            return task.answer


    def make(**options):
        """reverse a short word (a plugin from the reverse-env package)"""
        return Reverse(**options)
''')


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """The `reverse-env` package built and installed with pip into its own directory."""
    src = tmp_path_factory.mktemp("reverse-env")
    (src / "reverse_env").mkdir()
    (src / "reverse_env" / "__init__.py").write_text(PLUGIN)
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "reverse-env"
        version = "0.1"
        [project.entry-points."gymloop.envs"]
        reverse = "reverse_env:make"
        [tool.setuptools]
        packages = ["reverse_env"]
    '''))
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True)
    return site


def _cli(args: list[str], site, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "gymloop.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_an_installed_plugin_is_listed_validated_and_trained_on(plugin_site, tmp_path, tiny_model_dir):
    listed = _cli(["envs", "list"], plugin_site, tmp_path)
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("reverse "))
    assert "reverse a short word" in line and "[plugin:reverse-env]" in line
    valid = _cli(["envs", "validate", "reverse", "--options", '{"length": 4}'], plugin_site, tmp_path)
    assert valid.returncode == 0 and "ok  gold 20/20 scored 1.0" in valid.stdout, valid.stdout + valid.stderr
    cfg = {"model": str(tiny_model_dir), "name": "plug", "run_dir": str(tmp_path / "runs"),
           "env": {"name": "reverse", "options": {"length": 2}}, "sampling": {"max_new_tokens": 3},
           "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "drop_zero_signal": False},
           "eval": {"tasks": 4, "every": 0, "max_new_tokens": 3}}
    (tmp_path / "plug.yaml").write_text(yaml.safe_dump(cfg))
    trained = _cli(["train", str(tmp_path / "plug.yaml"), "--quiet"], plugin_site, tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    summary = json.loads(next((tmp_path / "runs").glob("plug-*/summary.json")).read_text())
    assert summary["env"] == "reverse" and summary["steps"] == 2 and summary["heldout_tasks"] == 4


def test_a_module_factory_reference_needs_no_registration(plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_site))
    env = make_env("reverse_env:make", length=5)
    assert env.name == "reverse" and len(env.sample_tasks(1, "train", 0)[0].answer) == 5
    with pytest.raises(ValueError, match="cannot import 'nope' from 'reverse_env'"):
        make_env("reverse_env:nope")


def test_unknown_names_and_bad_factories_are_clear_errors():
    reg = Registry()
    with pytest.raises(ValueError, match=r"unknown environment 'nope'; known: \[.*'arith'"):
        reg.make("nope")
    reg.register("bad", lambda **kw: object(), "returns the wrong thing")
    with pytest.raises(ValueError, match="returned object, not a gymloop.envs.Environment"):
        reg.make("bad")
    with pytest.raises(ValueError, match="must be non-empty, without"):
        reg.register("a:b", lambda **kw: None, "x")


def test_config_validation_accepts_registered_environments(monkeypatch):
    from conftest import DigitEnv, use_env

    from gymloop.config import TrainConfig

    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    assert TrainConfig.model_validate({"env": {"name": "digit"}}).env.name == "digit"
    with pytest.raises(ValueError, match="unknown environment 'digits'"):
        TrainConfig.model_validate({"env": {"name": "digits"}})


def _jsonl(tmp_path, rows) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"id": f"q{i}", "env": "quiz", "prompt": f"{i}+{i}=", "answer": 2 * i,
         "split": "heldout" if i % 4 == 0 else "train"} for i in range(12)]


@pytest.mark.parametrize("checker,reply,answer,reward", [
    ("exact", " 14 ", 14, 1.0), ("exact", "14.", 14, 0.0),
    ("last_int", "so it is 14", 14, 1.0), ("last_int", "14 or 15", 14, 0.0),
    ("regex", "the colour is red", "colou?r is (red|blue)", 1.0), ("regex", "green", "red|blue", 0.0),
])
def test_jsonl_checkers(tmp_path, checker, reply, answer, reward):
    rows = [{**ROWS[1], "answer": answer}, ROWS[4]]
    env = make_env("jsonl", path=_jsonl(tmp_path, rows), checker=checker)
    task = env.task_from_id("q1")
    score = env.verify(task, env.reset(task) + [{"role": "assistant", "content": reply}])
    assert score.reward == reward and score.error is None


def test_jsonl_environment_splits_rebuilds_and_refuses_bad_files(tmp_path):
    env = make_env("jsonl", path=_jsonl(tmp_path, ROWS), checker="last_int")
    assert env.name == "jsonl:tasks" and rebuilds_tasks(env)
    assert {t.split for t in env.sample_tasks(3, "heldout", 0)} == {"heldout"}
    assert len(env.sample_tasks(9, "train", 0)) == 9
    with pytest.raises(ValueError, match="asked for 4 heldout tasks"):
        env.sample_tasks(4, "heldout", 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        make_env("jsonl", path=str(bad))
    with pytest.raises(ValueError, match="checker python needs grader"):
        make_env("jsonl", path=_jsonl(tmp_path, ROWS), checker="python")


def test_jsonl_python_grader_runs_in_the_sandbox_and_its_failures_are_errors(tmp_path):
    from gymloop.sandbox import SandboxUnavailable

    grader = tmp_path / "grade.py"
    grader.write_text(textwrap.dedent('''
        import os
        def grade(sample, item):
            if sample["output_text"] == "crash":
                raise RuntimeError("boom")
            if sample["output_text"] == "host":
                return float(os.path.exists("/work/main"))   # the host tree is not visible
            return 0.5 if sample["output_text"].strip() == str(item["answer"]) else 0.0
    '''))
    env = make_env("jsonl", path=_jsonl(tmp_path, ROWS), checker="python", grader=str(grader))
    task = env.task_from_id("q3")
    try:
        scores = env.verify_batch([(task, env.reset(task) + [{"role": "assistant", "content": r}])
                                   for r in ("6", "7", "crash", "host")])
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    finally:
        env.close()
    assert [s.reward for s in scores[:2]] == [0.5, 0.0] and scores[0].error is None
    assert scores[2].error and "boom" in scores[2].error          # an error, never a silent 0
    assert scores[3].reward == 0.0 and scores[3].error is None


def test_a_loop_says_when_its_environment_cannot_rebuild_production_tasks(tmp_path, monkeypatch):
    from conftest import DigitEnv, use_env

    from gymloop.loop.curriculum import curriculum
    from gymloop.loop.config import LoopConfig
    from gymloop.store import Store

    use_env(monkeypatch, "digit", lambda **kw: DigitEnv())
    store = Store(tmp_path / "s.db")
    tid = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                          completion_tokens=1, latency_s=0.0)
    store.traces.add_feedback(tid, reward=0.0, env="digit", task_id="dtrain0:1")
    ok = store.traces.add(model="m", model_version=1, request={}, response={}, prompt_tokens=1,
                         completion_tokens=1, latency_s=0.0)
    store.traces.add_feedback(ok, reward=1.0, env="digit", task_id="dtrain0:2")    # a success, to replay
    cfg = LoopConfig(store=str(tmp_path / "s.db"), env={"name": "digit"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, stats = curriculum(cfg.curriculum, cfg.env, cfg.grpo.prompts_per_step, cfg.seed, store, 1)
    assert stats["production_not_rebuildable"] == 2 and stats["production_per_step"] == 0
    said = [str(w.message) for w in caught if "has no task_from_id" in str(w.message)]
    assert len(said) == 1 and "2 production tasks" in said[0]      # once, with the whole count
