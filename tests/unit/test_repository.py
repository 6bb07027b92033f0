"""The repository stands on its own: no file names a document that is not in it, and the tests
wait on conditions and events, never on a fixed delay (the sleeps left are listed, each with why)."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# a document's name as prose or code names it: a path ending in a document's suffix
DOCUMENT = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:md|rst|pdf))\b")


def tracked() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    # committed, or about to be (not ignored)
    return subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.split("\n")


def cited_documents(text: str) -> set[str]:
    return set(DOCUMENT.findall(text))


def missing_documents(files: dict[str, str], present: set[str]) -> dict[str, set[str]]:
    """file -> the documents it names that are not in the repository (by path from the root,
    from the file's own folder, or by a file name that exists somewhere in it)."""
    names = {Path(p).name for p in present}
    out = {}
    for path, text in files.items():
        here = Path(path).parent
        gone = {d for d in cited_documents(text)
                if d not in present and str(here / d) not in present and Path(d).name not in names}
        if gone:
            out[path] = gone
    return out


def test_the_check_finds_a_document_that_is_not_there():
    absent_md, absent_txt = "NOTES" + ".md", "notes" + ".rst"     # written so, this file names neither
    present = {"README.md", "docs/guide.md"}
    files = {"src/a.py": f"# see {absent_md} and docs/guide.md", "docs/b": f"[guide](guide.md), {absent_txt}"}
    assert missing_documents(files, present) == {"src/a.py": {absent_md}, "docs/b": {absent_txt}}


def test_no_file_names_a_document_that_is_not_in_the_repository():
    # files the repository ships as data (results, recorded outputs) quote what they quote
    files = {p: (ROOT / p).read_text(errors="replace") for p in tracked()
             if p and (ROOT / p).is_file() and Path(p).suffix in {".py", ".md", ".yaml", ".toml", ".txt", ".cfg", ""}
             and not p.startswith(("bench/results/", "docs/runs/", "tests/data/"))}
    assert len(files) > 100
    assert missing_documents(files, set(tracked())) == {}


# Every sleep left in tests/: (file, the function it is in) -> why it is not a wait.
SLEEPS = {
    ("conftest.py", "eventually"): "the one wait helper: the pause between two looks at a condition",
    ("e2e/test_ray.py", "SlowDigitEnv.verify"): "a verifier made slow on purpose, so a worker can be "
                                                        "killed inside a step",
    ("integration/test_sandbox_security.py", "test_setsid_double_fork_does_not_survive"):
        "the untrusted program's own sleeps (a grandchild that would outlive the run)",
    ("integration/test_sandbox_soak.py", "<module>"): "an untrusted program's own sleep (a setsid escape attempt)",
    ("fixtures/agent_programs/clerk.py", "slow"): "an agent program that runs past its time limit on purpose",
    ("e2e/test_orphans.py", "test_a_watchdog_takes_its_whole_group_when_its_parent_dies"):
        "the sleeps of the processes under test (a parent, and a grandchild that would outlive it)",
}


def _where(tree: ast.Module, line: int) -> str:
    """The innermost class.function holding `line`, or <module>."""
    best, span = "<module>", None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.lineno <= line <= node.end_lineno and (span is None or node.end_lineno - node.lineno < span):
            span = node.end_lineno - node.lineno
            best = node.name
            outer = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and node in ast.walk(c) and c is not node]
            if outer:
                best = f"{outer[0].name}.{node.name}"
    return best


def sleeps_in(root: Path) -> set[tuple[str, str]]:
    found = set()
    for f in root.rglob("*.py"):
        text = f.read_text()
        tree = ast.parse(text)
        for i, line in enumerate(text.splitlines(), 1):
            if re.search(r"\bsleep\(", line):
                found.add((str(f.relative_to(root)), _where(tree, i)))
    return found


def test_every_sleep_left_in_the_tests_is_listed_with_why():
    assert sleeps_in(TESTS) == set(SLEEPS)
