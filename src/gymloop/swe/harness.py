"""Verification of a patch against a SWE task: SWE-bench's procedure, and stricter.

    verdict = Harness(pool, repos_root, cache).verify(instance, patch)
    verdict.reward, verdict.resolved, verdict.fail_to_pass, verdict.error

1. `screen(...)` reads the patch before anything runs: a patch that edits or adds tests,
   `conftest.py`, runner or packaging configuration (pytest.ini, tox.ini, setup.cfg,
   pyproject.toml, setup.py), `sitecustomize.py` / `usercustomize.py` / `*.pth`, that exits the
   process at import, or that names the test runner, its report or site-packages scores 0.
2. The patch is applied to `base_commit`'s tree (in memory; `git apply` on the touched files).
3. The test files are restored from `base_commit` (+ `test_patch`): whatever the patch did to
   them never counts.
4. Only the FAIL_TO_PASS and PASS_TO_PASS tests run, in the sandbox, under a runner gymloop
   controls (swe/runner.py: its own pytest, no repository configuration, no `site`).
5. Graded by swebench's rules made stricter (swe/grading.py): skipped, xfailed and not collected
   tests fail; a run whose report is missing (the process exited early) or whose runner was
   swapped scores 0.
docs/swe.md lists each threat with the test that covers it.
"""
from __future__ import annotations

import ast
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from ..sandbox import Limits, Pool
from .grading import grade
from .instance import Instance
from .repos import GitError, PatchError, Tree, apply_patch, patch_paths, read_tree, resolve_repo
from .runner import TestRun, run_tests, runner_zip

# files that steer the test runner or the interpreter: a patch may not touch them
RUNNER_FILES = {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
                "pyproject.toml", "setup.py", "sitecustomize.py", "usercustomize.py", "noxfile.py"}
# names whose appearance in a patch's added lines means it reaches for the runner or the interpreter
TAMPER = re.compile(r"\b(_pytest|pytest|pluggy|gymloop_report|site-packages|dist-packages|getsitepackages|"
                    r"sitecustomize|usercustomize|__stdout__|__stderr__|sys\.modules|settrace|setprofile)\b")
EXIT_CALLS = {"exit", "_exit", "quit", "abort", "kill", "killpg", "raise_signal"}


@dataclass
class Verdict:
    """The JSON that `gymloop swe verify` prints."""

    instance_id: str
    reward: float
    resolved: bool
    fail_to_pass: dict[str, bool] = field(default_factory=dict)
    pass_to_pass: dict[str, bool] = field(default_factory=dict)
    error: str | None = None        # the harness itself failed: not the patch's fault, never a silent 0
    reason: str = ""                # why the reward is what it is, for people
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def is_test_path(path: str) -> bool:
    """A file a test runner treats as a test or test support (tests dirs, test_*.py, *_test.py)."""
    p = PurePosixPath(path)
    return (any(part in ("tests", "test", "testing") for part in p.parts[:-1])
            or p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py")


def restored_paths(instance: Instance, base: Tree) -> set[str]:
    """The files verification takes from base_commit whatever the patch did: the named test files,
    `test_files`, every file under a test file's directory, every conftest.py."""
    named = instance.restored_files()
    dirs = {str(PurePosixPath(p).parent) for p in named if "/" in p}
    return named | {p for p in base if str(PurePosixPath(p).parent) in dirs or PurePosixPath(p).name == "conftest.py"}


def _exits_at_import(source: str) -> int:
    """Calls of exit-like functions that run when the module is imported (module and class
    bodies, outside functions and `if __name__ == "__main__":`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0
    count = 0

    def visit(node):
        nonlocal count
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            count += name in EXIT_CALLS
        if isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
            count += 1
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return count


def screen(patch: str, base: Tree, after: Tree | None, restored: set[str]) -> str | None:
    """Why the patch scores 0 before anything runs, or None. `after`: base with the patch applied
    (None when it does not apply)."""
    paths = patch_paths(patch)
    for p in paths:
        name = PurePosixPath(p).name
        if p in restored or is_test_path(p):
            return f"the patch edits tests ({p}): tests are the judge, not the patch's to change"
        if name in RUNNER_FILES or name.endswith(".pth"):
            return f"the patch touches {p}: runner, packaging or interpreter configuration"
    added = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    for line in added:
        m = TAMPER.search(line)
        if m:
            return f"the patch reaches for the test runner or the interpreter ({m.group(0)!r} in an added line)"
    if after is None:
        return None          # reported as not applying by the caller
    for p in paths:
        if p.endswith(".py") and p in after:
            before_n = _exits_at_import(base[p].decode(errors="replace")) if p in base else 0
            if _exits_at_import(after[p].decode(errors="replace")) > before_n:
                return f"the patch makes {p} exit the process when it is imported"
    return None


def base_tree(instance: Instance, repos_root: Path | None) -> Tree:
    """The instance's repository at base_commit (read from git once and cached, shared read-only)."""
    return read_tree(resolve_repo(instance.repo, repos_root), instance.base_commit)


class Harness:
    """Verifies patches on SWE tasks; one sandbox pool and one runner directory for all of them."""

    def __init__(self, pool: Pool, repos_root: Path | None, cache: Path, limits: Limits | None = None) -> None:
        self.pool, self.repos_root = pool, repos_root
        self.runner = runner_zip(cache)
        self.limits = limits

    def base_tree(self, instance: Instance) -> Tree:
        return base_tree(instance, self.repos_root)

    def run(self, instance: Instance, tree: Tree, tests: list[str]) -> TestRun:
        """Run `tests` over `tree` in the sandbox (the agent's run_tests and verification alike)."""
        return run_tests(self.pool, dict(tree), tests, runner=self.runner, python_path=instance.python_path,
                         limits=self.limits)

    def verify(self, instance: Instance, patch: str) -> Verdict:
        t0 = time.perf_counter()
        v = self._verify(instance, patch)
        v.seconds = time.perf_counter() - t0
        return v

    def _verify(self, instance: Instance, patch: str) -> Verdict:
        try:
            base = self.base_tree(instance)
        except (GitError, ValueError) as exc:
            return Verdict(instance.instance_id, 0.0, False, error=f"cannot read the task's repository: {exc}")
        restored = restored_paths(instance, base)
        try:
            after, not_applied = apply_patch(base, patch), None
        except PatchError as exc:
            after, not_applied = None, str(exc)
        why = screen(patch, base, after, restored)
        if why:
            return Verdict(instance.instance_id, 0.0, False, {t: False for t in instance.FAIL_TO_PASS},
                           {t: False for t in instance.PASS_TO_PASS}, reason=why)
        if after is None:
            return Verdict(instance.instance_id, 0.0, False, reason=not_applied)
        return self._evaluate(instance, base, restored, after)

    def evaluate(self, instance: Instance, patch: str) -> Verdict:
        """Steps 2-5 without the screen: apply, restore the tests, run them, grade. (verify() screens
        first; the tests call this alone to show each threat also fails here.)"""
        base = self.base_tree(instance)
        try:
            after = apply_patch(base, patch)
        except PatchError as exc:
            return Verdict(instance.instance_id, 0.0, False, reason=str(exc))
        return self._evaluate(instance, base, restored_paths(instance, base), after)

    def _evaluate(self, instance: Instance, base: Tree, restored: set[str], tree: Tree) -> Verdict:
        """Restore the tests in the patched `tree`, run them, grade."""
        iid = instance.instance_id
        # the tests as base_commit + test_patch have them, whatever the patch did; a conftest.py the
        # patch added anywhere is dropped (pytest would load it from the test files' parent folders)
        tests_tree = apply_patch({p: base[p] for p in restored if p in base}, instance.test_patch)
        tree = {p: b for p, b in tree.items()
                if p not in restored and not (PurePosixPath(p).name == "conftest.py" and p not in base)} | tests_tree
        run = self.run(instance, tree, instance.tests())
        if run.error:
            return Verdict(iid, 0.0, False, error=f"sandbox: {run.error}")
        g = grade(run.status if run.finished and not run.tampered else {}, instance.FAIL_TO_PASS, instance.PASS_TO_PASS)
        if run.tampered:
            reason = f"the test runner was tampered with ({', '.join(run.tampered)})"
        elif not run.finished:
            reason = ("the tests timed out" if run.timed_out else
                      f"the test process ended before pytest reported (exit code {run.exit_code})")
        else:
            reason = f"{g['status']}: FAIL_TO_PASS {g['f2p']:.0%}, PASS_TO_PASS {g['p2p']:.0%}"
        resolved = g["resolved"] and run.finished and not run.tampered
        return Verdict(iid, 1.0 if resolved else 0.0, resolved, g["fail_to_pass"], g["pass_to_pass"], reason=reason)
