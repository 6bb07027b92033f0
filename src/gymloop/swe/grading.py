"""SWE-bench's resolution rules (the `swebench` package's grading module), made stricter.

SWE-bench counts an XFAIL as a pass and a skipped PASS_TO_PASS test as kept; here a test counts
only when it ran and passed: skipped, xfailed and not collected are failures on both lists.
"""
from __future__ import annotations

import functools
import os
import sys
import types


@functools.lru_cache(maxsize=1)
def swebench_grading():
    """swebench.harness.grading and .constants. The package's `swebench.harness/__init__` imports
    its Docker and Modal back-ends (docker, modal, datasets), which gymloop does not use or
    install; the grading and log-parser modules themselves need only the standard library and
    unidiff, so they are loaded under a bare `swebench.harness` package."""
    import swebench

    if "swebench.harness" not in sys.modules:
        pkg = types.ModuleType("swebench.harness")
        pkg.__path__ = [os.path.join(os.path.dirname(swebench.__file__), "harness")]
        sys.modules["swebench.harness"] = pkg
    from swebench.harness import constants, grading

    return grading, constants


def strict_status(status: dict[str, str], tests: list[str]) -> dict[str, str]:
    """Every test of `tests` -> PASSED or FAILED: only a test that ran and passed passes."""
    return {t: "PASSED" if status.get(t) == "PASSED" else "FAILED" for t in tests}


def grade(status: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> dict:
    """{resolved, status (FULL / PARTIAL / NO), fail_to_pass: {test: passed}, pass_to_pass: {...},
    f2p, p2p (fractions)} from a run's outcomes, by swebench's report and resolution rules."""
    grading, c = swebench_grading()
    sm = strict_status(status, list(fail_to_pass) + list(pass_to_pass))
    report = grading.get_eval_tests_report(sm, {c.FAIL_TO_PASS: list(fail_to_pass), c.PASS_TO_PASS: list(pass_to_pass)})
    resolution = grading.get_resolution_status(report)
    ok = {t: True for key in (c.FAIL_TO_PASS, c.PASS_TO_PASS) for t in report[key]["success"]}
    return {"resolved": resolution == c.ResolvedStatus.FULL.value, "status": resolution,
            "fail_to_pass": {t: ok.get(t, False) for t in fail_to_pass},
            "pass_to_pass": {t: ok.get(t, False) for t in pass_to_pass},
            "f2p": grading.compute_fail_to_pass(report), "p2p": grading.compute_pass_to_pass(report)}
