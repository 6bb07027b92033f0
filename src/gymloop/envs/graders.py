"""Graders (OpenAI's shapes): a model sample and a data item -> a reward in [0, 1]. They score
the fine-tuning API's reinforcement jobs and `graders/run`, and any `graded` environment
(envs/graded.py). A grader that cannot run (bad template, a python grader that raises, a formula that
does not parse) is an error, reported as such, never a reward of 0.

    string_check      {input, reference, operation: eq | ne | like | ilike}
    text_similarity   {input, reference, evaluation_metric: fuzzy_match | bleu | rouge_1..5 | rouge_l}
    python            {source: "def grade(sample, item) -> float"}, run in gymloop's sandbox
    score_model       {model, input: [messages], range?: [lo, hi]}: a model this server serves
                      answers with a number, mapped from range to [0, 1]
    multi             {graders: {name: grader}, calculate_output: "0.5 * a + 0.5 * b"}, the formula
                      evaluated on its parse tree (numbers, names, + - * /, min max abs), never eval

Templates: {{item.<field>[.<field>...]}}, {{sample.output_text}}, {{sample.output_json.<field>}}.
"""
from __future__ import annotations

import ast
import json
import operator
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..algorithms.table import Table
from ..models.toolcalls import reply_message
from .grader_types import (Grader, MultiGrader, PythonGrader, ScoreModelGrader, StringCheckGrader,
                           TextSimilarityGrader)

# CPython 3.11's AST constructor keeps its recursion depth in state shared between threads, so two
# threads parsing at once can fail with "AST constructor recursion depth mismatch" (gh-106905):
# graders parse (python sources, formulas) from the sandbox's worker threads, one at a time.
_AST_LOCK = threading.Lock()


def _parse(source: str, mode: str = "exec") -> ast.AST:
    with _AST_LOCK:
        return ast.parse(source, mode=mode)


TEMPLATE = re.compile(r"\{\{\s*(item|sample)\.([A-Za-z0-9_.]+)\s*\}\}")


class GraderError(ValueError):
    """A grader that is not well-formed, or that failed on this sample; `kind` names the error
    the way OpenAI's grader metadata does (formula_parse_error, python_grader_runtime_error, ...)."""

    def __init__(self, message: str, kind: str = "other_error") -> None:
        super().__init__(message)
        self.kind = kind


class UnknownModel(GraderError):
    """A score_model grader names a model this server does not serve (the API answers 404
    model_not_found, as for any request naming a model it does not have)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"score_model model {model!r} is not served here", "model_not_found")
        self.model = model


@dataclass(frozen=True)
class Runtime:
    """What graders that run something need: `python(source, sample, item) -> reward` (the
    sandbox: SandboxPython) and `chat(model, messages, sampling_params) -> text` (a model this
    server serves, for score_model). A grader whose runtime is missing is an error."""

    python: Callable[[str, dict, dict], float] | None = None
    chat: Callable[[str, list[dict], dict], str] | None = None
    dry: bool = False             # validating: score_model checks its model, then scores 0


@dataclass
class Grade:
    reward: float
    sub_rewards: dict[str, float] = field(default_factory=dict)


def sample_of(output_text: str, tools: bool = False) -> dict:
    """The `sample` a template sees: the text and its JSON when it parses; when the prompt offered
    tools, also `output_tools`, the reply's calls as OpenAI tool calls (the text is then what is
    around them), as OpenAI's reinforcement graders see a tool-calling reply."""
    calls: list[dict] = []
    if tools:
        output_text, calls = reply_message(output_text)
        output_text = output_text or ""
    try:
        output_json = json.loads(output_text)
    except (json.JSONDecodeError, TypeError):
        output_json = None
    return {"output_text": output_text, "output_json": output_json, **({"output_tools": calls} if tools else {})}


def render(template: Any, sample: dict, item: dict) -> str:
    """Fill a template's {{item.x}} / {{sample.x}} references (a missing one is an error)."""
    if not isinstance(template, str):
        raise GraderError(f"a grader template must be a string, got {type(template).__name__}")

    def value(m: re.Match) -> str:
        node: Any = {"item": item, "sample": sample}[m.group(1)]
        for part in m.group(2).split("."):
            if not isinstance(node, dict) or part not in node:
                kind = "sample_parse_error" if m.group(1) == "sample" else "invalid_variable_error"
                raise GraderError(f"{{{{{m.group(1)}.{m.group(2)}}}}} is not in the {m.group(1)}", kind)
            node = node[part]
        return node if isinstance(node, str) else json.dumps(node)
    return TEMPLATE.sub(value, template)


STRING_OPS: dict[str, Callable[[str, str], bool]] = {
    "eq": operator.eq, "ne": operator.ne, "like": lambda x, y: y in x, "ilike": lambda x, y: y.lower() in x.lower()}


def string_check(g: StringCheckGrader, sample: dict, item: dict, rt: "Runtime") -> Grade:
    a, b = render(g.input, sample, item), render(g.reference, sample, item)
    return Grade(float(STRING_OPS[g.operation](a, b)))


def _bleu(a: str, b: str) -> float:
    import sacrebleu

    return sacrebleu.sentence_bleu(a, [b]).score / 100


def _fuzzy(a: str, b: str) -> float:
    from rapidfuzz import fuzz

    return fuzz.ratio(a, b) / 100


def _rouge(kind: str) -> Callable[[str, str], float]:
    def score(a: str, b: str) -> float:
        from rouge_score import rouge_scorer

        return rouge_scorer.RougeScorer([kind]).score(b, a)[kind].fmeasure
    return score


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy, "bleu": _bleu, **{f"rouge_{n}": _rouge(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge("rougeL")}


def text_similarity(g: TextSimilarityGrader, sample: dict, item: dict, rt: "Runtime") -> Grade:
    metric = g.evaluation_metric
    a, b = render(g.input, sample, item), render(g.reference, sample, item)
    try:
        value = float(METRICS[metric](a, b))
    except ImportError as exc:
        raise GraderError(f"text_similarity {metric} needs the graders extra: pip install 'gymloop[graders]' "
                          f"({exc})") from None
    # the metrics are in [0, 1] up to float rounding (sacrebleu's 100.00000000000004 / 100)
    return Grade(min(1.0, max(0.0, value)))


_GRADE_MARK = "__GYMLOOP_GRADE__"


def grade_program(grader_source: str) -> str:
    """A program that runs `grade(sample, item)` on every pair of its data file pairs.json (the
    inputs are data, never source) and prints one marked line each: the value, or the error."""
    return (grader_source + "\n\n" + "import json as _j\n"
            "for _s, _i in _j.load(open('pairs.json')):\n"
            "    try:\n"
            "        _v = grade(_s, _i)\n"
            "        if isinstance(_v, bool) or not isinstance(_v, (int, float)):\n"
            "            raise TypeError(f'grade returned {type(_v).__name__}, not a number')\n"
            "        _out = {'value': float(_v)}\n"
            "    except Exception as _e:\n"
            "        _out = {'error': f'{type(_e).__name__}: {_e}'}\n"
            f"    print({_GRADE_MARK!r} + _j.dumps(_out), flush=True)\n")


def grades_of(result, n: int) -> list[float | str]:
    """A sandbox Result of `grade_program` on n pairs as n values, or error messages: a pair the
    grader raised on or answered outside [0, 1], or every pair the process never reached (crash,
    time limit)."""
    lines = [json.loads(ln[len(_GRADE_MARK):]) for ln in result.stdout.splitlines() if ln.startswith(_GRADE_MARK)]
    out: list[float | str] = []
    for d in lines[:n]:
        v = d.get("value")
        out.append(f"python grader: {d['error']}" if "error" in d else
                   v if 0.0 <= v <= 1.0 else f"python grader returned {v}, not in [0, 1]")
    why = result.error or ("timed out" if result.timed_out else
                           (result.stderr.strip().splitlines() or [f"exited {result.exit_code}"])[-1])
    return out + [f"python grader: {why}"] * (n - len(out))


class SandboxPython:
    """`grade(sample, item)` of a python grader, run in gymloop's sandbox (never in this
    process). Calling it grades one pair (a reward, or python_grader_runtime_error); `many`
    grades a batch in one process per slot. The sandbox pool starts on first use."""

    def __init__(self, slots: int = 2, timeout_s: float = 10.0, memory_mb: int = 512) -> None:
        self.slots, self.timeout_s, self.memory_mb = slots, timeout_s, memory_mb
        self._pool = None
        self._lock = threading.Lock()

    def __call__(self, source: str, sample: dict, item: dict) -> float:
        (value,) = self.many(source, [(sample, item)])
        if isinstance(value, str):
            raise GraderError(value, "python_grader_runtime_error")
        return value

    def many(self, source: str, pairs: list[tuple[dict, dict]], per_pair_s: float = 0.5) -> list[float | str]:
        """grade(sample, item) of every pair, a reward or that pair's error message each: the
        pairs split across the slots, one sandboxed process per share (one process start per
        share instead of one per answer). A process's time limit is timeout_s, plus per_pair_s
        for each pair after its first."""
        _check_source(source)
        k = max(1, -(-len(pairs) // self.slots))
        shares = [pairs[i:i + k] for i in range(0, len(pairs), k)]
        if len(shares) == 1:
            return self._run(source, shares[0], per_pair_s)
        with ThreadPoolExecutor(len(shares)) as ex:
            return [v for part in ex.map(lambda share: self._run(source, share, per_pair_s), shares) for v in part]

    def _run(self, source: str, pairs: list[tuple[dict, dict]], per_pair_s: float) -> list[float | str]:
        from ..sandbox import Limits

        limits = Limits(timeout_s=self.timeout_s + per_pair_s * (len(pairs) - 1), memory_mb=self.memory_mb)
        result = self._get_pool().run(source=grade_program(source), limits=limits,
                                      files={"pairs.json": json.dumps(pairs).encode()})
        return grades_of(result, len(pairs))

    def _get_pool(self):
        with self._lock:
            if self._pool is None:
                from ..sandbox import Limits, Pool

                self._pool = Pool(slots=self.slots, limits=Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb))
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def sub_graders(g: MultiGrader) -> dict[str, Grader]:
    """A multi grader's parts by name (the SDK may type `graders` as one grader: named by its name)."""
    return g.graders if isinstance(g.graders, dict) else {g.graders.name: g.graders}


def uses_python(g: Grader) -> bool:
    """Whether a grader runs python anywhere in it (itself, or a multi's sub-grader)."""
    if isinstance(g, MultiGrader):
        return any(uses_python(x) for x in sub_graders(g).values())
    return isinstance(g, PythonGrader)


def python(g: PythonGrader, sample: dict, item: dict, rt: "Runtime") -> Grade:
    """`grade(sample, item)` in the sandbox (rt.python: source, sample, item -> reward or raise)."""
    source = g.source
    _check_source(source)
    if rt.python is None:
        raise GraderError("python graders are not available here", "python_grader_server_error")
    return Grade(rt.python(source, sample, item))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCS = {"min": min, "max": max, "abs": abs}


def formula(expr: str, names: dict[str, float]) -> float:
    """calculate_output on its parse tree: numbers, the sub-graders' names, + - * /, unary -,
    and min / max / abs. Anything else is a formula_parse_error."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise GraderError(f"calculate_output names {node.id!r}, which is not one of the graders "
                                  f"({', '.join(names)})", "invalid_variable_error")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
            return float(_FUNCS[node.func.id](*[ev(a) for a in node.args]))
        raise GraderError(f"calculate_output may use numbers, grader names, + - * / and min/max/abs; "
                          f"not {ast.dump(node)[:60]}", "formula_parse_error")
    try:
        tree = _parse(expr, mode="eval")
    except SyntaxError as exc:
        raise GraderError(f"calculate_output does not parse: {exc.msg}", "formula_parse_error") from None
    try:
        return ev(tree)
    except ZeroDivisionError:
        raise GraderError("calculate_output divides by zero", "formula_parse_error") from None


def multi(g: MultiGrader, sample: dict, item: dict, rt: "Runtime") -> Grade:
    subs = {name: grade(sub, sample, item, rt).reward for name, sub in sub_graders(g).items()}
    return Grade(formula(g.calculate_output, subs), subs)


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score_model(g: ScoreModelGrader, sample: dict, item: dict, rt: Runtime) -> Grade:
    """The model `g.model` answers the rendered `input` messages with a score in `range`
    (default [0, 1]): a JSON {"result": x} or the first number of its reply, mapped linearly so
    that range[0] is 0 and range[1] is 1 (a reversed range rewards low scores). A reply without a
    number, or one outside the range, is a model_grader_parse_error."""
    model = g.model
    zero, one = g.range or (0.0, 1.0)
    lo, hi = min(zero, one), max(zero, one)
    if lo == hi:   # the schema forbids it too (uniqueItems); a grader built in code may not have gone through it
        raise GraderError(f"a score_model grader's range needs two different bounds (got {g.range!r})")
    params = g.sampling_params or {}
    rendered = [{"role": m.role, "content": render(m.content, sample, item)} for m in g.input]
    if rt.chat is None:
        raise GraderError("score_model graders are not available here", "model_grader_server_error")
    try:
        text = rt.chat(model, rendered, params)
    except GraderError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model is unknown or failed: the grader's error, said
        raise GraderError(f"the grader model {model!r} could not answer: {exc}", "model_grader_server_error") from None
    if rt.dry:
        return Grade(0.0)
    value = None
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and isinstance(parsed.get("result"), (int, float)):
            value = float(parsed["result"])
        elif isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
            value = float(parsed)
    except json.JSONDecodeError:
        pass
    if value is None and (m := NUMBER.search(text)):
        value = float(m.group())
    if value is None or not lo <= value <= hi:
        raise GraderError(f"the grader model's reply {text[:80]!r} is not a number in [{lo}, {hi}]",
                          "model_grader_parse_error")
    return Grade((value - zero) / (one - zero))


GRADERS: Table[Callable[..., Grade]] = Table("grader type", {
    "string_check": (string_check, "1 if input and reference compare as the operation says, else 0"),
    "text_similarity": (text_similarity, "similarity of input and reference: fuzzy_match, bleu, rouge_*"),
    "python": (python, "grade(sample, item) -> float, run in the sandbox"),
    "score_model": (score_model, "a served model answers with a score in range, mapped to [0, 1]"),
    "multi": (multi, "named sub-graders combined by a calculate_output formula"),
})


_GRADER = TypeAdapter(Grader)


def parse(g: Any) -> Grader:
    """A grader (a dict in OpenAI's shape, or already typed) as its typed model; GraderError
    naming the first bad field otherwise."""
    if isinstance(g, BaseModel):
        return g
    if not isinstance(g, dict) or g.get("type") not in GRADERS:
        kind = g.get("type") if isinstance(g, dict) else type(g).__name__
        raise GraderError(f"unknown grader type {kind!r}; known: {', '.join(GRADERS)}")
    try:
        return _GRADER.validate_python(g)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e["loc"][1:]) or "grader"    # [0] is the union's tag
        raise GraderError(f"{g['type']} grader: {loc}: {e['msg']}") from None


def grade(g: Grader, sample: dict, item: dict, rt: "Runtime") -> Grade:
    """Run one grader; a reward outside [0, 1] is an error."""
    out = GRADERS.impl(g.type)(g, sample, item, rt)
    if not 0.0 <= out.reward <= 1.0:
        raise GraderError(f"the {g.type} grader's reward {out.reward} is not in [0, 1]")
    return out


class _Anything(dict):
    """A sample or item in which every {{...}} reference exists (renders as "{}")."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> "_Anything":
        return _Anything()


def _check_source(source: Any) -> None:
    """A python grader's source parses and defines grade(sample, item) at the top level."""
    if not isinstance(source, str):
        raise GraderError("a python grader's source must be a string")
    try:
        tree = _parse(source)
    except SyntaxError as exc:
        raise GraderError(f"the python grader does not parse: line {exc.lineno}: {exc.msg}") from None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grade"), None)
    if fn is None or len(fn.args.args) < 2:
        raise GraderError("a python grader's source must define grade(sample, item) at the top level")


def validate(g: Any, served: Callable[[str], bool] | None = None) -> Grader:
    """`g` typed, or GraderError unless it is a well-formed grader: every part of it run once on a
    sample and item in which every reference exists, python sources parsed (not run), score_model
    models checked with `served(model)`."""
    g = parse(g)
    def python(source: str, sample: dict, item: dict) -> float:
        _check_source(source)
        return 0.0

    def chat(model: str, messages: list[dict], params: dict) -> str:
        if served is not None and not served(model):
            raise UnknownModel(model)
        return ""
    grade(g, _Anything(), _Anything(), Runtime(python=python, chat=chat, dry=True))
    return g


def run(g: Any, output_text: str, item: dict, rt: "Runtime") -> dict:
    """POST /v1/fine_tuning/alpha/graders/run's answer: reward, sub_rewards and metadata with
    its errors (all false when it ran)."""
    t0 = time.perf_counter()
    errors = {k: False for k in ("formula_parse_error", "invalid_variable_error", "other_error",
                                 "python_grader_runtime_error", "python_grader_server_error", "sample_parse_error",
                                 "truncated_observation_error", "unresponsive_reward_error",
                                 "model_grader_parse_error", "model_grader_refusal_error",
                                 "model_grader_server_error")}
    # the details OpenAI's schema requires beside the flags (null unless that error happened)
    errors.update(python_grader_server_error_type=None, python_grader_runtime_error_details=None,
                  model_grader_server_error_details=None)
    reward, subs, detail = 0.0, {}, None
    name = g.get("name", "") if isinstance(g, dict) else getattr(g, "name", "")
    gtype = g.get("type", "") if isinstance(g, dict) else getattr(g, "type", "")
    try:
        out = grade(parse(g), sample_of(output_text), item, rt)
        reward, subs = out.reward, out.sub_rewards
    except GraderError as exc:
        errors[exc.kind] = True
        detail = str(exc)
        if exc.kind in ("python_grader_runtime_error", "model_grader_server_error"):
            errors[exc.kind + "_details"] = detail
    return {"reward": reward, "sub_rewards": subs, "model_grader_token_usage_per_model": {},
            "metadata": {"name": name, "type": gtype, "errors": {**errors, "other_error_details": detail}
                         if detail and errors["other_error"] else errors,
                         "execution_time": time.perf_counter() - t0, "scores": {"reward": reward, **subs},
                         "token_usage": None, "sampled_model_name": None},
            **({"error": detail} if detail else {})}
