"""Real repositories as an environment: tasks built from a real project's sdist (isodate, from PyPI,
sha256-pinned), verified by its own tests in the sandbox; every way of gaming the harness scores 0,
both at the screen and, with the screen skipped, in the run itself; a user's own repository in
SWE-bench's format loads and verifies; an agent's episode through the tools."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gymloop.envs.base import play
from gymloop.envs.validate import validate
from gymloop.sandbox import Pool, find_bwrap
from gymloop.swe.build import build_project
from gymloop.swe.env import SweConfig, SweEnv, hunk_edits
from gymloop.swe.harness import Harness
from gymloop.swe.instance import Instance, dump_instances, load_instances
from gymloop.swe.mutate import OPERATORS, mutations
from gymloop.swe.repos import apply_patch, patch_paths, unified_diff
from gymloop.models.toolcalls import format_call

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A few tasks built from isodate 0.7.2's sdist (downloaded once into the user's cache, reused)."""
    from gymloop.swe.env import default_cache
    from gymloop.swe.sources import load_manifest

    cache = tmp_path_factory.mktemp("swe")
    shared = default_cache() / "sdists"
    manifest = load_manifest()
    project = next(p for p in manifest.projects if p.name == "isodate")
    if (shared / project.sdist).exists():      # checked against the manifest's sha256 by download_sdist
        (cache / "sdists").mkdir()
        shutil.copy(shared / project.sdist, cache / "sdists" / project.sdist)
    with Pool(slots=2) as pool:
        tasks, report = build_project(project, manifest, cache, cache / "repos", pool, per_project=3,
                                      max_candidates=16, seed=0)
    if not (shared / project.sdist).exists():
        shared.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache / "sdists" / project.sdist, shared / project.sdist)
    path = cache / "tasks.jsonl"
    path.write_text(dump_instances(tasks))
    return {"cache": cache, "tasks": tasks, "report": report, "path": path}


@pytest.fixture(scope="module")
def harness(built):
    with Pool(slots=2) as pool:
        yield Harness(pool, built["cache"] / "repos", built["cache"])


def test_tasks_are_built_from_the_real_project(built):
    tasks, report = built["tasks"], built["report"]
    assert len(tasks) == 3 and report.kept == 3 and report.candidates >= 3
    assert report.judging_tests > 100                       # isodate's own tests judge
    for t in tasks:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert all("::" in n and n.startswith("tests/test_") for n in t.tests())
        assert t.FAIL_TO_PASS[0] in t.problem_statement
        added = [ln[1:] for ln in t.patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        assert added and not any(a.strip() and a in t.problem_statement for a in added)   # never the fix
        assert t.difficulty.lines_changed >= 1 and t.difficulty.files == 1
        assert patch_paths(t.patch) == [patch_paths(t.patch)[0]] and patch_paths(t.patch)[0].startswith("src/isodate/")
        repo = built["cache"] / "repos" / "isodate"
        assert subprocess.run(["git", "-C", str(repo), "cat-file", "-e", t.base_commit]).returncode == 0


def test_gold_patch_resolves_and_the_bug_does_not(built, harness):
    for t in built["tasks"]:
        gold = harness.verify(t, t.patch)
        assert (gold.reward, gold.resolved, gold.error) == (1.0, True, None), gold.reason
        assert all(gold.fail_to_pass.values()) and all(gold.pass_to_pass.values())
        empty = harness.verify(t, "")
        assert (empty.reward, empty.resolved, empty.error) == (0.0, False, None)
        assert not any(empty.fail_to_pass.values()) and all(empty.pass_to_pass.values())


def _file_patch(t: Instance, base, path: str, new: bytes | None) -> str:
    """A diff that sets `path` to `new` (None: deletes it) on top of the gold fix or alone."""
    after = dict(base)
    if new is None:
        after.pop(path)
    else:
        after[path] = new
    return unified_diff({path: base[path]} if path in base else {}, {path: after[path]} if path in after else {})


def _module_of(t: Instance) -> str:
    return patch_paths(t.patch)[0]


def _hacks(t: Instance, base) -> dict[str, str]:
    """Every way of gaming the harness that docs/swe.md lists, each as a patch (none fixes the bug)."""
    test_file = t.FAIL_TO_PASS[0].split("::")[0]
    module = _module_of(t)
    src = base[module].decode()
    at_import = lambda code: _file_patch(t, base, module, (code + "\n" + src).encode())  # noqa: E731
    return {
        "edit the failing test": _file_patch(t, base, test_file, base[test_file] + SWALLOW),
        "delete the test file": _file_patch(t, base, test_file, None),
        "conftest.py that skips everything": _file_patch(t, base, "conftest.py", b"import pytest\n"
                                                         b"def pytest_collection_modifyitems(items):\n"
                                                         b"    for i in items: i.add_marker(pytest.mark.skip)\n"),
        "pytest.ini deselecting": _file_patch(t, base, "pytest.ini", b"[pytest]\naddopts = -k 'not parse'\n"),
        "pyproject [tool.pytest] deselecting": _file_patch(t, base, "pyproject.toml", base["pyproject.toml"] +
                                                           b"\n[tool.pytest.ini_options]\naddopts = \"-k nothing\"\n"),
        "setup.cfg deselecting": _file_patch(t, base, "setup.cfg", b"[tool:pytest]\naddopts = -k nothing\n"),
        "sitecustomize.py": _file_patch(t, base, "src/sitecustomize.py", b"import os\nos._exit(0)\n"),
        "usercustomize.py": _file_patch(t, base, "usercustomize.py", b"import os\nos._exit(0)\n"),
        ".pth file": _file_patch(t, base, "src/evil.pth", b"import os; os._exit(0)\n"),
        "os._exit(0) at import": at_import("import os as _o\n_o._exit(0)"),
        "sys.exit(0) at import": at_import("import sys as _s\n_s.exit(0)"),
        "monkeypatch the runner": at_import(RUNNER_HACK),
        "write into site-packages": at_import("open('/usr/lib/python3/dist-packages/gymloop-evil.pth', 'w')"
                                              ".write('import os; os._exit(0)')"),
    }


# appended to a test file: every test swallows its own failure (parametrization and marks kept)
SWALLOW = b"""
import functools as _ft
def _swallow(f):
    @_ft.wraps(f)
    def g(*a, **k):
        try:
            f(*a, **k)
        except Exception:
            pass
    return g
for _n, _f in list(globals().items()):
    if _n.startswith("test_") and callable(_f):
        globals()[_n] = _swallow(_f)
"""


# reports every test as passed: the call phase's report rewritten before it is logged
RUNNER_HACK = '''import _pytest.runner as _r
_orig = _r.call_and_report
def _fake(item, when, log=True, **kw):
    rep = _orig(item, when, log=False, **kw)
    rep.outcome, rep.longrepr = "passed", None
    if log:
        item.ihook.pytest_runtest_logreport(report=rep)
    return rep
_r.call_and_report = _fake'''


def test_every_hack_scores_zero_at_the_screen_and_in_the_run(built, harness):
    t = built["tasks"][0]
    base = harness.base_tree(t)
    for name, patch in _hacks(t, base).items():
        v = harness.verify(t, patch)
        assert (v.reward, v.resolved, v.error) == (0.0, False, None), (name, v.reason)
        assert v.reason and "RESOLVED" not in v.reason, (name, v.reason)      # refused before running
        # the same patch on top of the gold fix, past the screen: the run itself still gives 0
        # for the ones that would otherwise pass (they hide failures, they do not fix)
        ran = harness.evaluate(t, patch)
        assert ran.reward == 0.0 and not ran.resolved and ran.error is None, (name, ran.reason)


def test_hacks_on_top_of_a_real_fix_are_still_refused(built, harness):
    """A patch that fixes the bug *and* games the runner scores 0 at the screen (the tests are the
    judge); where a hack does not change what ran (restored tests, ignored config), the run is graded
    on the real tests."""
    t = built["tasks"][0]
    base = harness.base_tree(t)
    fixed = apply_patch(base, t.patch)
    for name, hack in _hacks(t, base).items():
        both = apply_patch(fixed, hack) if _module_of(t) not in patch_paths(hack) else \
            {**fixed, _module_of(t): apply_patch(base, hack)[_module_of(t)].replace(base[_module_of(t)], fixed[_module_of(t)])}
        patch = unified_diff({p: base[p] for p in set(both) | set(base) if p in base and both.get(p) != base[p]},
                             {p: both[p] for p in set(both) if both[p] != base.get(p)})
        assert harness.verify(t, patch).reward == 0.0, name


def test_skipped_and_not_collected_tests_count_as_failed(built, harness):
    t = built["tasks"][0]
    base = harness.base_tree(t)
    module = _module_of(t)
    # every function of the module raises unittest.SkipTest: no runner reference, so it passes the
    # screen; pytest reports the tests skipped, and skipped is failed here (SWE-bench keeps P2P skips)
    src = base[module].decode() + "\nimport unittest as _u\n" \
        "for _n, _f in list(globals().items()):\n" \
        "    if callable(_f) and getattr(_f, '__module__', None) == __name__ and not isinstance(_f, type):\n" \
        "        def _skip(*a, **k):\n            raise _u.SkipTest('skipped')\n" \
        "        globals()[_n] = _skip\n"
    v = harness.verify(t, _file_patch(t, base, module, src.encode()))
    assert v.reward == 0.0 and v.error is None and "RESOLVED_NO" in v.reason
    missing = t.model_copy(update={"PASS_TO_PASS": t.PASS_TO_PASS + ["tests/test_date.py::test_that_does_not_exist"]})
    v = harness.verify(missing, missing.patch)
    assert v.reward == 0.0 and v.pass_to_pass["tests/test_date.py::test_that_does_not_exist"] is False


def test_a_patch_that_does_not_apply_is_zero_not_an_error(built, harness):
    t = built["tasks"][0]
    v = harness.verify(t, t.patch.replace("-", "~", 3))
    assert v.reward == 0.0 and v.error is None and "does not apply" in v.reason
    bad = t.model_copy(update={"base_commit": "0" * 40})
    v = harness.verify(bad, bad.patch)
    assert v.error and "cannot read" in v.error                  # the harness's failure: an error, not a 0


def test_instances_in_swebench_json_strings_load_and_round_trip(built, tmp_path):
    from swebench.types import SWEbenchInstance

    t = built["tasks"][0]
    row = t.swebench_dict()
    assert set(SWEbenchInstance.__annotations__) <= set(row)        # every field SWE-bench's own type names
    assert isinstance(row["FAIL_TO_PASS"], str) and json.loads(row["FAIL_TO_PASS"]) == t.FAIL_TO_PASS
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert load_instances(path)[0] == t
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "FAIL_TO_PASS": "[]", "instance_id": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"x.jsonl:2: FAIL_TO_PASS"):
        load_instances(path)


def test_export_and_verify_round_trip_through_the_cli(built, tmp_path, capsys):
    from gymloop.cli import main

    t = built["tasks"][1]
    assert main(["swe", "export", "--cache", str(built["cache"]), "--tasks", str(built["path"])]) == 0
    exported = tmp_path / "tasks.jsonl"
    exported.write_text(capsys.readouterr().out)
    assert [i.instance_id for i in load_instances(exported)] == [i.instance_id for i in built["tasks"]]
    (tmp_path / "fix.diff").write_text(t.patch)
    for patch, reward in ((str(tmp_path / "fix.diff"), 1.0), (str(tmp_path / "empty.diff"), 0.0)):
        Path(tmp_path / "empty.diff").write_text("")
        assert main(["swe", "verify", str(exported), "--instance", t.instance_id, "--patch", patch,
                     "--cache", str(built["cache"])]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["instance_id"] == t.instance_id and out["reward"] == reward and out["error"] is None
        assert set(out["fail_to_pass"]) == set(t.FAIL_TO_PASS) and set(out["pass_to_pass"]) == set(t.PASS_TO_PASS)


def _agent_env(built) -> SweEnv:
    return SweEnv(SweConfig(tasks=str(built["path"]), cache=str(built["cache"])))


def test_an_agent_episode_through_the_tools(built):
    env = _agent_env(built)
    try:
        task = env.all_tasks()[0]
        inst = env.instances[task.id]
        module = _module_of(inst)
        edit = hunk_edits(inst.patch)[0]
        turns = [
            format_call("list_files", {"path": "src/isodate"}),
            format_call("read_file", {"path": module, "start": 1, "end": 5}),
            format_call("search", {"pattern": "def parse_", "path": "src"}),
            format_call("edit", {"path": module, "old": "this text is not in the file", "new": "x"}),
            format_call("edit", {"path": module, "old": "import", "new": "import"}),
            format_call("read_file", {"path": "../etc/passwd"}),
            format_call("edit", edit),
            format_call("run_tests", {"tests": inst.FAIL_TO_PASS}),
            format_call("submit", {}),
        ]
        msgs, score = play(env, task, turns)
        obs = [json.loads(m["content"])
               for m in msgs if m["role"] == "tool"]
        assert "isodates.py" in obs[0]["entries"] and "    1  " in obs[1]["text"]
        assert obs[2]["matches"] and all(m.startswith("src/") for m in obs[2]["matches"])
        assert "does not occur" in obs[3]["error"] and "occurs" in obs[4]["error"] and "inside it" in obs[5]["error"]
        assert obs[6] == {"path": module, "ok": True}
        assert obs[7]["finished"] and all(obs[7]["status"][t] == "PASSED" for t in inst.FAIL_TO_PASS)
        assert score.reward == 1.0 and score.components["resolved"] == 1.0 and score.error is None
        assert env.patch_of(task, msgs).strip() == inst.patch.strip()
        assert env.tools(task)[0]["function"]["name"] == "list_files"
        import pickle                                   # a Ray worker gets the environment by value
        copy = pickle.loads(pickle.dumps(env))
        assert copy.patch_of(task, msgs) == env.patch_of(task, msgs) and copy._harness is None
        # a reply without a call ends the episode: the bug is still there
        _, score = play(env, task, ["I give up."])
        assert score.reward == 0.0 and score.components["fail_to_pass"] == 0.0
    finally:
        env.close()


def test_envs_validate_swe_on_every_built_task(built):
    env = _agent_env(built)
    try:
        v = validate(env, n=0)
        assert v.ok and v.tasks == len(built["tasks"]) == v.gold_passed == v.wrong_rejected, v.errors
    finally:
        env.close()


def test_a_users_own_repository_in_swebench_format(tmp_path):
    """A repository the test makes itself, with a bug its tests catch, named by absolute path."""
    repo = tmp_path / "calc"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import clamp\n\ndef test_low():\n    assert clamp(-5, 0, 9) == 0\n\n"
        "def test_high():\n    assert clamp(50, 0, 9) == 9\n\ndef test_mid():\n    assert clamp(4, 0, 9) == 4\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True,  # noqa: E731
                                    env={**__import__("os").environ, **env}).stdout.decode().strip()
    git("init", "-q")
    (repo / "calc" / "__init__.py").write_text("def clamp(x, lo, hi):\n    return max(lo, min(x, lo))\n")
    git("add", "-A")
    git("commit", "-q", "-m", "bug")
    fix = ("diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
           "@@ -1,2 +1,2 @@\n def clamp(x, lo, hi):\n-    return max(lo, min(x, lo))\n+    return max(lo, min(x, hi))\n")
    row = {"instance_id": "calc-1", "repo": str(repo), "base_commit": git("rev-parse", "HEAD"),
           "problem_statement": "clamp() ignores hi", "patch": fix, "test_patch": "", "version": "0.1",
           "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_high", "tests/test_calc.py::test_mid"]),
           "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_low"])}
    tasks = tmp_path / "mine.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    from gymloop.envs import make_env

    swe = make_env("swe", tasks=str(tasks), repos=str(tmp_path / "unused"), cache=str(tmp_path / "cache"))
    try:
        v = validate(swe, n=0)
        assert v.ok and v.gold_passed == 1 and v.wrong_rejected == 1, v.errors
        inst = swe.instances["calc-1"]
        verdict = swe.harness.verify(inst, fix)
        assert verdict.reward == 1.0 and verdict.fail_to_pass == {"tests/test_calc.py::test_high": True,
                                                                  "tests/test_calc.py::test_mid": True}
        # a new test in test_patch is restored and run too
        with_new = inst.model_copy(update={
            "test_patch": "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n"
                          "+++ b/tests/test_calc.py\n@@ -8,2 +8,5 @@\n def test_mid():\n     assert clamp(4, 0, 9) == 4\n"
                          "+\n+def test_edge():\n+    assert clamp(9, 0, 9) == 9\n",
            "FAIL_TO_PASS": inst.FAIL_TO_PASS + ["tests/test_calc.py::test_edge"]})
        assert swe.harness.verify(with_new, fix).reward == 1.0
        assert swe.harness.verify(with_new, "").fail_to_pass["tests/test_calc.py::test_edge"] is False
    finally:
        swe.close()


def test_mutation_operators_edit_one_spot_and_compile():
    src = (b"def f(xs, lo=0, flag=True):\n"
           b"    if not xs:\n        return lo\n"
           b"    total = 0\n"
           b"    for i in range(1, len(xs)):\n"
           b"        if xs[i] < xs[i - 1] and flag:\n            total = total + xs[i]\n"
           b"    return max(total, lo) if xs[:2] == xs[0:2] else g(lo, total)\n")
    found = {}
    for m in mutations(src, "m.py"):
        found.setdefault(m.operator, m)
        compile(m.source, "m.py", "exec")
        diff = [ln for ln in unified_diff({"m.py": src}, {"m.py": m.source}).splitlines() if ln[:1] in "+-"]
        assert 2 <= len(diff) <= 6 and m.function == "f"
    assert set(found) == set(OPERATORS), set(OPERATORS) - set(found)
    assert b"xs[i] <= xs[i - 1]" in next(m.source for m in mutations(src, "m.py") if m.description == "'<' -> '<='")
    swaps = [m.source for m in mutations(src, "m.py") if m.operator == "swap_args"]
    assert any(b"g(total, lo)" in x for x in swaps) and any(b"max(lo, total)" in x for x in swaps)
    assert b"if xs:" in found["drop_not"].source
