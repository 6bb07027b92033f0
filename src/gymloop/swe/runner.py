"""Running a repository's pytest tests in the sandbox, with a runner configuration gymloop controls.

    run = run_tests(pool, files, ["tests/test_x.py::test_y"], python_path=["src"])
    run.status   # {"tests/test_x.py::test_y": "PASSED" | "FAILED" | "ERROR" | "SKIPPED" | "XFAIL"}

The repository's files are copied into the sandbox's scratch dir (nothing it writes reaches the
host); pytest and its few dependencies come in beside them as one zip archive built once from this
installation's own copies, precompiled (`runner_zip`), never from the repository. The interpreter runs
with `-s -S -P` in the sandbox's cleared environment (no user site, no `site`: no `.pth` file,
`sitecustomize` or `usercustomize` is ever imported; PYTHONHASHSEED fixed so parametrized test
ids are stable), pytest with `-c` pointing at gymloop's empty ini
(the repository's pytest.ini / setup.cfg / tox.ini / pyproject.toml are never read, so its
`addopts`, `-p` plugins and deselections do not apply), `-p no:cacheprovider`, no plugin
auto-loading. Outcomes are not parsed from the log: a plugin of ours records every test's
outcome and prints them once the session ends, behind a random marker that the program under test
never sees (the boot script reads it from a file it deletes before anything is imported); it also
checks that pytest's own runner functions are the ones it saw at start (a program that swaps them
to report passes is flagged `tampered`). A program that exits the process before pytest finishes
leaves no marked report: every test then counts as not run.
"""
from __future__ import annotations

import functools
import json
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Sequence

from ..sandbox import Limits, Pool

# what the runner directory holds: pytest and what it requires here (copied, not downloaded)
RUNNER_ROOT = "pytest"
WORK = "/work"          # the sandbox's scratch dir (sandbox/isolation.WORKDIR)
MARKER_FILE = ".gymloop-marker"
RUNNER_ZIP = ".gymloop-runner.zip"
RUNNER_INI = ".gymloop-pytest.ini"

BOOT = r'''
import os, sys
marker_path = os.path.join(os.getcwd(), {marker_file!r})
with open(marker_path) as f:
    MARKER = f.read().strip()
os.unlink(marker_path)
sys.path[:0] = [os.path.join(os.getcwd(), {runner!r})] + [os.path.join(os.getcwd(), p) for p in {python_path!r}]
sys.argv = ["pytest"]
import gymloop_report
gymloop_report.MARKER = MARKER
del MARKER
import pytest
rc = pytest.main(["-c", {ini!r}, "--rootdir", os.getcwd(), "-p", "no:cacheprovider",
                  "-p", "gymloop_report", "-q", "--tb=short", "-rN", "-W", "ignore", *{tests!r}])
gymloop_report.emit(int(rc))
sys.stdout.flush()
os._exit(int(rc))
'''

REPORT_PLUGIN = r'''
"""gymloop's pytest plugin: every test's outcome, and whether pytest's runner was tampered with."""
import json, sys
import _pytest.runner, _pytest.reports, _pytest.python, _pytest.main, _pytest.outcomes

MARKER = None
OUT = sys.__stdout__
_outcomes, _failures, _errors = {}, {}, []
_WATCHED = [(_pytest.runner, "runtestprotocol"), (_pytest.runner, "call_and_report"),
            (_pytest.runner, "pytest_runtest_makereport"), (_pytest.runner, "pytest_runtest_call"),
            (_pytest.runner, "pytest_runtest_protocol"), (_pytest.runner.CallInfo, "from_call"),
            (_pytest.reports.TestReport, "from_item_and_call"), (_pytest.python.Function, "runtest"),
            (_pytest.python, "pytest_pyfunc_call"), (_pytest.main, "pytest_runtestloop"),
            (_pytest.outcomes, "fail"), (_pytest.outcomes, "skip"), (_pytest.outcomes, "xfail")]
# the objects themselves (vars(), not getattr(): a classmethod's bound method is new on every access)
_seen = [(owner, name, vars(owner).get(name)) for owner, name in _WATCHED]


def _status(report):
    if hasattr(report, "wasxfail"):
        return "XFAIL" if report.skipped else "PASSED"   # an xpass that is not strict passes
    if report.passed:
        return "PASSED"
    if report.skipped:
        return "SKIPPED"
    return "FAILED" if report.when == "call" else "ERROR"


def pytest_runtest_logreport(report):
    status = _status(report)
    prev = _outcomes.get(report.nodeid)
    # a test's outcome is its call phase, unless setup or teardown failed or it was skipped
    if report.when == "call" or prev is None or status in ("ERROR", "FAILED") or (status == "SKIPPED" and prev == "PASSED"):
        if not (report.when == "teardown" and status == "PASSED"):
            _outcomes[report.nodeid] = status
    if status in ("FAILED", "ERROR"):
        _failures[report.nodeid] = {"when": report.when, "text": str(report.longrepr)[-4000:],
                                    "crash": getattr(getattr(report.longrepr, "reprcrash", None), "message", None),
                                    "frames": _frames(report)}


def _frames(report):
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", None) or []
    out = []
    for e in entries:
        loc = getattr(e, "reprfileloc", None)
        if loc is not None:
            out.append([loc.path, loc.lineno])
    return out


def pytest_collectreport(report):
    if report.failed:
        _errors.append({"nodeid": report.nodeid, "text": str(report.longrepr)[-4000:]})


def emit(rc):
    tampered = [f"{getattr(o, '__name__', o)}.{n}" for o, n, f in _seen if vars(o).get(n) is not f]
    payload = {"outcomes": _outcomes, "failures": _failures, "collect_errors": _errors, "exit_code": rc,
               "tampered": tampered}
    OUT.write("\n" + MARKER + json.dumps(payload) + "\n")
    OUT.flush()
'''


def runner_dists(root: str = RUNNER_ROOT) -> list[str]:
    """`root` and the distributions it requires on this interpreter, transitively (no extras)."""
    from packaging.requirements import Requirement

    seen: list[str] = []
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen)


def runner_zip(cache: Path) -> Path:
    """A zip of pytest and its requirements (copied from this installation's own distributions, so
    the versions are the lock's), gymloop's report plugin, each module also precompiled (an
    unchecked hash-based .pyc beside its source: without it every run would compile pytest, ~1 s).
    Made once per set of versions; copied into each run's scratch dir like the repository's files
    (a bind mount would need every folder above the cache to be readable by the sandbox's uid)."""
    import importlib.util
    import marshal
    import zipfile

    dists = runner_dists()
    versions = "-".join(f"{d}{metadata.version(d)}" for d in dists)
    target = cache / f"runner-{versions}.zip"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own per writer: two processes or threads may build it at once, the last rename wins
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".")
    os.close(fd)
    tmp = Path(name)
    sources: dict[str, bytes] = {"gymloop_report.py": REPORT_PLUGIN.encode()}
    for name in dists:
        dist = metadata.distribution(name)
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            if f.suffix != ".pyc" and ".." not in f.parts and "__pycache__" not in f.parts and src.is_file():
                sources[f.as_posix()] = src.read_bytes()
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for rel, data in sorted(sources.items()):
            z.writestr(zipfile.ZipInfo(rel, (2026, 1, 1, 0, 0, 0)), data)
            if rel.endswith(".py"):
                code = compile(data, f"{RUNNER_ZIP}/{rel}", "exec", dont_inherit=True)
                pyc = (importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")         # hash-based, unchecked
                       + importlib.util.source_hash(data) + marshal.dumps(code))
                z.writestr(zipfile.ZipInfo(rel + "c", (2026, 1, 1, 0, 0, 0)), pyc)
    tmp.replace(target)
    return target


@functools.lru_cache(maxsize=4)
def _read(path: Path) -> bytes:
    return path.read_bytes()


@dataclass
class TestRun:
    """What one sandboxed pytest run reported."""

    status: dict[str, str]                       # node id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL
    failures: dict[str, dict] = field(default_factory=dict)   # node id -> {when, text, crash, frames}
    collect_errors: list[dict] = field(default_factory=list)
    exit_code: int | None = None
    tampered: list[str] = field(default_factory=list)
    finished: bool = True       # False: no marked report (the process exited, crashed or timed out first)
    timed_out: bool = False
    output_tail: str = ""       # the last of stdout + stderr, for people
    seconds: float = 0.0
    error: str | None = None    # the sandbox itself failed: an infrastructure error


def run_tests(pool: Pool, files: dict[str, bytes], tests: Sequence[str], *, runner: Path,
              python_path: Sequence[str] = ("", "src"), limits: Limits | None = None) -> TestRun:
    """Run the pytest node ids `tests` over a repository given as `files` (path -> bytes);
    `runner` is runner_zip()'s archive."""
    marker = "@@gymloop-report-" + secrets.token_hex(16) + "@@"
    boot = BOOT.format(marker_file=MARKER_FILE, runner=RUNNER_ZIP, ini=RUNNER_INI, python_path=list(python_path),
                       tests=list(tests))
    payload = {**files, MARKER_FILE: marker.encode(), ".gymloop-boot.py": boot.encode(), RUNNER_ZIP: _read(runner),
               RUNNER_INI: b"[pytest]\n"}
    limits = limits or Limits(timeout_s=60, memory_mb=1024, tmpfs_mb=128, max_output_bytes=1 << 20)
    # -S: no `site` (no .pth, sitecustomize, usercustomize), -s: no user site, -P: no script dir on
    # sys.path; the environment is the sandbox's own (cleared) plus a fixed hash seed, so test ids
    # built from sets come out the same in every run
    r = pool.run(["/usr/bin/env", "PYTHONHASHSEED=0", "/usr/bin/python3", "-s", "-S", "-P", ".gymloop-boot.py"],
                 files=payload, limits=limits)
    tail = (r.stdout[-3000:] + ("\n" + r.stderr[-2000:] if r.stderr.strip() else "")).replace(marker, "")
    if r.error:
        return TestRun({}, error=r.error, finished=False, output_tail=tail, seconds=r.wall_s)
    head, sep, report = r.stdout.rpartition(marker)
    if not sep:
        return TestRun({}, finished=False, timed_out=r.timed_out, exit_code=r.exit_code, output_tail=tail,
                       seconds=r.wall_s)
    data = json.loads(report.splitlines()[0])
    return TestRun(status=data["outcomes"], failures=data["failures"], collect_errors=data["collect_errors"],
                   exit_code=data["exit_code"], tampered=data["tampered"], finished=True, timed_out=r.timed_out,
                   output_tail=tail, seconds=r.wall_s)
