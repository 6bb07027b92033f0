"""`gymloop swe build`: SWE tasks from real projects, by injecting bugs their own tests catch.

For each project of the manifest: the pristine tree's judging tests are run twice (only tests
that pass both times are used); every mutation of every function of a listed module is a candidate,
taken round-robin over functions (seeded order) so a project's tasks spread over its code; a
candidate is kept when its tests ran to the end, nothing failed to import or collect, and at least
one test fails with the bug (those are FAIL_TO_PASS; the rest PASS_TO_PASS). Every kept bug is a
commit on top of the pristine one (`base_commit`); the gold `patch` undoes it.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..envs.base import split_of
from ..sandbox import Pool
from .instance import Difficulty, Instance
from .mutate import Mutation, mutations
from .repos import commit_variant, read_tree, unified_diff
from .runner import TestRun, run_tests, runner_zip
from .sources import Manifest, Project, download_sdist, unpack

MAX_STATEMENT_LINES = 30


@dataclass
class ProjectReport:
    project: str
    kind: str
    candidates: int = 0
    kept: int = 0
    seconds: float = 0.0
    judging_tests: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def problem_statement(project: Project, run: TestRun, f2p: list[str]) -> str:
    """What a user would report: which test fails and how (its traceback's tail), never the diff."""
    first = f2p[0]
    text = run.failures.get(first, {}).get("text", "").strip().splitlines()
    tail = "\n".join(text[-MAX_STATEMENT_LINES:])
    others = [t for t in f2p[1:6]]
    more = f"\n\nAlso failing: {', '.join(f'`{t}`' for t in others)}" + (
        f" and {len(f2p) - 6} more." if len(f2p) > 6 else ".") if others else ""
    return (f"{project.name} {project.version}: `{first}` fails.\n\n```\n{tail}\n```{more}\n\n"
            "Make the failing tests pass without breaking the others. The tests are right; the bug is in "
            "the library's code.")


def frames_to_bug(run: TestRun, test: str, module: str) -> int:
    """Frames between the failing test and the buggy module in its traceback (0: not on the stack)."""
    frames = run.failures.get(test, {}).get("frames") or []
    test_file = test.split("::", 1)[0]
    last_test = 0
    for i, (path, _line) in enumerate(frames):
        if str(path).endswith(test_file):
            last_test = i
        elif str(path).endswith(module):
            return i - last_test
    return 0


def _order(cands: list[Mutation], seed: int) -> list[Mutation]:
    """Candidates round-robin over functions, each function's in a seeded random order."""
    rng = random.Random(seed)
    by_fn: dict[str, list[Mutation]] = defaultdict(list)
    for m in cands:
        by_fn[m.function].append(m)
    fns = sorted(by_fn)
    rng.shuffle(fns)
    for f in fns:
        rng.shuffle(by_fn[f])
    out = []
    for k in range(max(map(len, by_fn.values()), default=0)):
        out += [by_fn[f][k] for f in fns if k < len(by_fn[f])]
    return out


def build_project(project: Project, manifest: Manifest, cache: Path, repos: Path, pool: Pool, *, per_project: int,
                  max_candidates: int, seed: int, on_task: Callable[[Instance], None] = lambda i: None) -> tuple[list[Instance], ProjectReport]:
    t0 = time.perf_counter()
    report = ProjectReport(project.name, project.kind)
    repo, pristine = unpack(project, download_sdist(project, cache), repos)
    base = read_tree(repo, pristine)
    runner = runner_zip(cache)
    judged: dict[str, list[str]] = {}
    for module, test_files in project.modules.items():
        if module not in base:
            raise FileNotFoundError(f"{project.name}: {module} is not in the sdist")
        # twice: a test that does not pass both times (flaky, time- or order-dependent) judges nothing
        passed = None
        for _ in range(2):
            run = run_tests(pool, dict(base), test_files, runner=runner, python_path=project.python_path)
            if not run.finished or run.error:
                raise RuntimeError(f"{project.name}: the pristine tests of {module} did not run: "
                                   f"{run.error or run.output_tail[-800:]}")
            ok = {t for t, s in run.status.items() if s == "PASSED"}
            passed = ok if passed is None else passed & ok
        judged[module] = sorted(passed)
        if not judged[module]:
            raise RuntimeError(f"{project.name}: no test of {test_files} passes on the pristine tree")
    report.judging_tests = len({t for ts in judged.values() for t in ts})
    cands: list[Mutation] = []
    for module in project.modules:
        cands += _order(list(mutations(base[module], module)), seed)
    # interleave modules too, so the first candidates cover every module
    by_module = defaultdict(list)
    for m in cands:
        by_module[m.path].append(m)
    queue = [m for k in range(max(map(len, by_module.values()))) for mod in project.modules
             for m in by_module[mod][k:k + 1]][:max_candidates]

    def check(m: Mutation) -> tuple[Mutation, TestRun]:
        return m, run_tests(pool, {**base, m.path: m.source}, judged[m.path], runner=runner,
                            python_path=project.python_path)

    kept: list[Instance] = []
    with cf.ThreadPoolExecutor(pool.size) as ex:
        futures = [ex.submit(check, m) for m in queue]
        for fut in futures:
            if len(kept) >= per_project:
                fut.cancel()
                continue
            m, run = fut.result()
            report.candidates += 1
            failing = [t for t in judged[m.path] if run.status.get(t) != "PASSED"]
            reason = ("sandbox error" if run.error else "did not finish" if not run.finished else
                      "import or collection error" if run.collect_errors else "no test fails" if not failing else None)
            if reason:
                report.rejected[reason] += 1
                continue
            inst = _instance(project, manifest, repo, pristine, base, m, run, failing, judged[m.path])
            kept.append(inst)
            on_task(inst)
    report.kept, report.seconds = len(kept), time.perf_counter() - t0
    return kept, report


def _instance(project: Project, manifest: Manifest, repo: Path, pristine: str, base, m: Mutation, run: TestRun,
              f2p: list[str], judged: list[str]) -> Instance:
    key = f"{project.name}:{m.path}:{m.function}"
    iid = f"{project.name}__{project.version}-{hashlib.sha1(f'{key}:{m.line}:{m.description}'.encode()).hexdigest()[:10]}"
    commit = commit_variant(repo, pristine, {m.path: m.source}, f"{iid}: {m.operator} in {m.function} ({m.description})")
    gold = unified_diff({m.path: m.source}, {m.path: base[m.path]})
    changed = sum(1 for line in gold.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))
    return Instance(
        instance_id=iid, repo=project.name, base_commit=commit, version=project.version,
        problem_statement=problem_statement(project, run, f2p), patch=gold, test_patch="",
        FAIL_TO_PASS=f2p, PASS_TO_PASS=[t for t in judged if t not in f2p], python_path=project.python_path,
        test_files=sorted({t.split("::", 1)[0] for t in judged}),
        split="heldout" if project.heldout else split_of(key, manifest.heldout_fraction),
        difficulty=Difficulty(lines_changed=changed, files=1, fail_to_pass=len(f2p),
                              frames_to_bug=frames_to_bug(run, f2p[0], m.path)),
        created_by=f"gymloop swe build ({m.operator}: {m.description} in {m.function})",
        created_at="2026-01-01T00:00:00Z",
    )


def build_all(cache: Path, *, projects: list[str] | None = None, per_project: int = 32, max_candidates: int = 120,
              seed: int = 0, slots: int = 2, manifest: Manifest | None = None, progress: bool = True,
              out: Path | None = None) -> tuple[list[Instance], list[ProjectReport]]:
    """Tasks of every project of the manifest (or those named), written to `out` (default
    cache/tasks.jsonl) as SWE-bench-format JSON lines."""
    import json

    from ..tracking.progress import progress as progress_bar
    from .instance import dump_instances
    from .sources import load_manifest

    manifest = manifest or load_manifest()
    chosen = [p for p in manifest.projects if projects is None or p.name in projects]
    unknown = set(projects or []) - {p.name for p in manifest.projects}
    if unknown:
        raise ValueError(f"not in the manifest: {sorted(unknown)}; known: {[p.name for p in manifest.projects]}")
    instances, reports = [], []
    bar = progress_bar(None, "swe build", progress, "task", total=per_project * len(chosen))
    with Pool(slots=slots) as pool:
        for project in chosen:
            bar.set_postfix(project=project.name, refresh=False)
            kept, rep = build_project(project, manifest, cache, cache / "repos", pool, per_project=per_project,
                                      max_candidates=max_candidates, seed=seed, on_task=lambda i: bar.update(1))
            instances += kept
            reports.append(rep)
    bar.close()
    out = out or cache / "tasks.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    # written whole, then renamed over the old file: a crash never leaves a half-written task file
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(dump_instances(instances))
    tmp.replace(out)
    (out.parent / "build_report.json").write_text(json.dumps([{**r.__dict__, "rejected": dict(r.rejected)}
                                                              for r in reports], indent=1))
    return instances, reports
