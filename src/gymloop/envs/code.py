"""`code`: write a Python function; hidden unit tests run in the sandbox decide.

Tasks are generated from templates at three difficulties (1: arithmetic on an int, 2: list
processing, 3: string processing), each with a reference solution and hidden tests whose
expected values come from running the reference. Reward = fraction of tests passed; the
`all_passed` component is 1 only when every test passes. The `repo` variant is a tiny
multi-file project with a bug; its own unittest suite decides, as in SWE-bench Verified.

A sandbox failure (not the program's fault) is a Score error, excluded from training.
"""
from __future__ import annotations

import json
import random
import re
import textwrap
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..sandbox import Limits, Pool, Result
from .base import Environment, Message, Score, Split, Task, split_of

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
HARNESS_MARK = "__GYMLOOP_RESULT__"


def extract_code(reply: str) -> str:
    """The last fenced code block of a reply, or the whole reply when there is none."""
    blocks = _FENCE.findall(reply)
    return blocks[-1] if blocks else reply


@dataclass(frozen=True)
class Template:
    level: int
    name: str
    doc: str                 # with {k} placeholders
    reference: str           # body using {k}
    inputs: tuple            # test inputs (each a tuple of args)


TEMPLATES = (
    Template(1, "affine", "Return x * {a} + {b}.", "return x * {a} + {b}", ((0,), (1,), (7,), (-3,), (12,))),
    Template(1, "clamp", "Return x limited to the range [{a}, {a} + {b}].", "return max({a}, min(x, {a} + {b}))",
             ((-50,), (0,), (5,), (100,), (3,))),
    Template(2, "sum_mult", "Return the sum of the elements of xs divisible by {a}.",
             "return sum(v for v in xs if v % {a} == 0)", (([],), ([1, 2, 3, 4, 6],), ([5, 10, 15],), ([7, 9, 12, 0],))),
    Template(2, "scale_max", "Return the largest element of xs times {a}, or {b} if xs is empty.",
             "return max(xs) * {a} if xs else {b}", (([],), ([3],), ([1, 9, 4],), ([-2, -7],))),
    Template(3, "rotate", "Return s rotated left by {a} characters (s may be empty).",
             "return s[{a} % len(s):] + s[:{a} % len(s)] if s else s", (("",), ("abc",), ("gymloop",), ("xy",))),
    Template(3, "count_char", "Return how many times the letter '{c}' occurs in s, ignoring case.",
             "return s.lower().count('{c}')", (("",), ("Banana",), ("AAA",), ("xyz",))),
)


class CodeConfig(BaseModel):
    """The code environment."""

    model_config = ConfigDict(extra="forbid")

    levels: list[int] = Field([1, 2, 3], description="Difficulty levels to draw from (1-3).")
    variant: Literal["function", "repo"] = Field("function", description="Write a function, or fix a repo.")
    timeout_s: float = Field(5.0, gt=0, description="Sandbox wall-clock limit per verification.")
    slots: int = Field(2, ge=1, description="Concurrent sandbox runs when verifying a batch.")
    heldout_fraction: float = Field(0.2, gt=0, lt=1, description="Share of problems kept for evaluation.")


def _function_source(t: Template, params: dict, body: str | None = None) -> str:
    arg = {"affine": "x", "clamp": "x", "sum_mult": "xs", "scale_max": "xs"}.get(t.name, "s")
    body = body if body is not None else t.reference.format(**params)
    return f"def solve({arg}):\n    {body}\n"


def _expected(t: Template, params: dict) -> list:
    ns: dict = {}
    exec(_function_source(t, params), ns)  # our own reference solution, never model code
    return [ns["solve"](*args) for args in t.inputs]


def harness(tests: list[tuple[tuple, object]]) -> str:
    """A test runner that imports `solution.solve` and prints one JSON line of results."""
    return textwrap.dedent(f"""
        import json
        passed, failures = 0, []
        try:
            from solution import solve
        except BaseException as e:
            print({HARNESS_MARK!r} + json.dumps({{"passed": 0, "total": {len(tests)}, "error": repr(e)[:200]}}))
            raise SystemExit(0)
        for args, want in {tests!r}:
            try:
                got = solve(*args)
                if got == want:
                    passed += 1
                else:
                    failures.append(f"solve{{tuple(args)!r}} = {{got!r}}, expected {{want!r}}"[:200])
            except BaseException as e:
                failures.append(f"solve{{tuple(args)!r}} raised {{e!r}}"[:200])
        print({HARNESS_MARK!r} + json.dumps({{"passed": passed, "total": {len(tests)}, "failures": failures[:3]}}))
    """)


def score_from_run(result: Result) -> Score:
    """Turn a sandbox Result of a harness run into a Score."""
    if result.error:
        return Score(0.0, {}, "sandbox failure", error=result.error)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith(HARNESS_MARK)), None)
    if line is None:
        why = "timed out" if result.timed_out else (
            "ran out of memory" if result.oom else f"exited {result.exit_code} without a result")
        return Score(0.0, {"passed_fraction": 0.0, "all_passed": 0.0}, f"tests did not run: {why}")
    data = json.loads(line[len(HARNESS_MARK):])
    frac = data["passed"] / data["total"] if data["total"] else 0.0
    reason = f"{data['passed']}/{data['total']} tests passed"
    if data.get("error"):
        reason += f"; import failed: {data['error']}"
    elif data.get("failures"):
        reason += f"; e.g. {data['failures'][0]}"
    return Score(frac, {"passed_fraction": frac, "all_passed": float(frac == 1.0)}, reason)


class SandboxedEnv(Environment):
    """Shared by environments whose verifier runs code: one lazily created sandbox pool."""

    timeout_s: float = 5.0
    slots: int = 2
    _pool: Pool | None = None

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            self._pool = Pool(slots=self.slots, limits=Limits(timeout_s=self.timeout_s, memory_mb=512))
        return self._pool

    def job(self, task: Task, messages: list[Message]) -> dict:
        """Keyword arguments of Pool.run that verify this episode."""
        raise NotImplementedError

    def verify(self, task: Task, messages: list[Message]) -> Score:
        return score_from_run(self.pool.run(**self.job(task, messages)))

    def verify_batch(self, items: list[tuple[Task, list[Message]]]) -> list[Score]:
        return [score_from_run(r) for r in self.pool.map([self.job(t, m) for t, m in items])]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _reply(messages: list[Message]) -> str:
    return messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""


REPO_FILES = {
    "mathx/__init__.py": "from .ops import mean, median\n",
    "mathx/ops.py": ("def mean(xs):\n    return sum(xs) / len(xs)\n\n\n"
                     "def median(xs):\n    s = sorted(xs)\n    n = len(s)\n{median_body}"),
    "tests/test_ops.py": textwrap.dedent("""
        import unittest
        from mathx import mean, median

        class TestOps(unittest.TestCase):
            def test_mean(self):
                self.assertEqual(mean([1, 2, 3, {k}]), (6 + {k}) / 4)
            def test_median_odd(self):
                self.assertEqual(median([{k}, 1, 3]), sorted([{k}, 1, 3])[1])
            def test_median_even(self):
                self.assertEqual(median([4, 1, 3, {k}]), sum(sorted([4, 1, 3, {k}])[1:3]) / 2)
            def test_median_single(self):
                self.assertEqual(median([{k}]), {k})
        """),
}
MEDIAN_BUGGY = "    return s[n // 2]\n"
MEDIAN_FIXED = "    if n % 2:\n        return s[n // 2]\n    return (s[n // 2 - 1] + s[n // 2]) / 2\n"
REPO_RUNNER = textwrap.dedent(f"""
    import json, sys, unittest
    suite = unittest.defaultTestLoader.discover("tests")
    result = unittest.TextTestRunner(stream=open("/dev/null", "w")).run(suite)
    total = result.testsRun
    bad = len(result.failures) + len(result.errors)
    print({HARNESS_MARK!r} + json.dumps({{"passed": total - bad, "total": total,
          "failures": [str(t[0]) for t in (result.failures + result.errors)][:3]}}))
""")


class CodeEnv(SandboxedEnv):
    def __init__(self, config: CodeConfig | None = None) -> None:
        self.config = config or CodeConfig()
        if set(self.config.levels) - {1, 2, 3} or not self.config.levels:
            raise ValueError(f"levels must be a non-empty subset of [1, 2, 3], got {self.config.levels}")
        self.timeout_s, self.slots = self.config.timeout_s, self.config.slots

    @property
    def name(self) -> str:  # type: ignore[override]
        return "code" if self.config.variant == "function" else "code-repo"

    def _draw(self, rng: random.Random) -> Task:
        if self.config.variant == "repo":
            k = rng.randint(5, 99)
            files = {p: c.format(k=k, median_body=MEDIAN_BUGGY) for p, c in REPO_FILES.items()}
            prompt = ("The project below fails its tests. Reply with the complete fixed content of "
                      "mathx/ops.py in one ```python block.\n\n"
                      + "\n".join(f"--- {p}\n{c}" for p, c in files.items()))
            return Task(id=f"code-repo:{k}", env=self.name, prompt=({"role": "user", "content": prompt},),
                        answer=None, info={"files": files, "k": k})
        t = rng.choice([t for t in TEMPLATES if t.level in self.config.levels])
        params = {"a": rng.randint(2, 9), "b": rng.randint(0, 20), "c": rng.choice("abnx")}
        arg = _function_source(t, params).split("(")[1].split(")")[0]
        prompt = f"Write a Python function solve({arg}). {t.doc.format(**params)} Reply with the code only."
        tests = list(zip([list(a) for a in t.inputs], _expected(t, params)))
        return Task(id=f"code:{t.name}:{params['a']}:{params['b']}:{params['c']}", env=self.name,
                    prompt=({"role": "user", "content": prompt},), answer=tests,
                    info={"template": t.name, "level": t.level, "params": params})

    def sample_tasks(self, n: int, split: Split, seed: int) -> list[Task]:
        rng = random.Random(f"{self.name}|{split}|{seed}")
        seen: dict[str, Task] = {}
        for _ in range(200 * n):
            t = self._draw(rng)
            if split_of(t.id, self.config.heldout_fraction) == split:
                seen.setdefault(t.id, Task(**{**t.__dict__, "split": split}))
            if len(seen) == n:
                return list(seen.values())
        raise ValueError(f"could not draw {n} distinct {split} tasks from {self.name}")

    def job(self, task: Task, messages: list[Message]) -> dict:
        # -E -s (not -I): the script's directory must stay on sys.path to import the solution.
        code = extract_code(_reply(messages))
        if self.config.variant == "repo":
            files = {p: c.encode() for p, c in task.info["files"].items()}
            files["mathx/ops.py"] = code.encode()
            files["run_tests.py"] = REPO_RUNNER.encode()
            return {"argv": ["/usr/bin/python3", "-E", "-s", "run_tests.py"], "files": files}
        return {"argv": ["/usr/bin/python3", "-E", "-s", "harness.py"],
                "files": {"solution.py": code.encode(), "harness.py": harness(
                    [(tuple(a), w) for a, w in task.answer]).encode()}}

    def gold_reply(self, task: Task) -> str:
        if self.config.variant == "repo":
            ops = task.info["files"]["mathx/ops.py"].replace(MEDIAN_BUGGY, MEDIAN_FIXED)
            return f"```python\n{ops}```"
        t = next(t for t in TEMPLATES if t.name == task.info["template"])
        return f"```python\n{_function_source(t, task.info['params'])}```"

    def wrong_turns(self, task: Task) -> list[str]:
        if self.config.variant == "repo":
            return [f"```python\n{task.info['files']['mathx/ops.py']}```"]   # the unfixed file
        t = next(t for t in TEMPLATES if t.name == task.info["template"])
        return [f"```python\n{_function_source(t, task.info['params'], body='return None')}```"]


def make_code(**options) -> CodeEnv:
    return CodeEnv(CodeConfig(**options))


def make_code_repo(**options) -> CodeEnv:
    return CodeEnv(CodeConfig(**{"variant": "repo", **options}))
