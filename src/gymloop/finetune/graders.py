"""Graders of the fine-tuning API (OpenAI's shapes): a model sample and a data item -> a reward
in [0, 1]. A grader that cannot run (bad template, a python grader that raises, a formula that
does not parse) is an error, reported as such, never a reward of 0.

    string_check      {input, reference, operation: eq | ne | like | ilike}
    text_similarity   {input, reference, evaluation_metric: fuzzy_match | bleu | rouge_1..5 | rouge_l}
    python            {source: "def grade(sample, item) -> float"}, run in gymloop's sandbox
    multi             {graders: {name: grader}, calculate_output: "0.5 * a + 0.5 * b"}, the formula
                      evaluated on its parse tree (numbers, names, + - * /, min max abs), never eval

Templates: {{item.<field>[.<field>...]}}, {{sample.output_text}}, {{sample.output_json.<field>}}.
"""
from __future__ import annotations

import ast
import json
import operator
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..algorithms.table import Table

TEMPLATE = re.compile(r"\{\{\s*(item|sample)\.([A-Za-z0-9_.]+)\s*\}\}")


class GraderError(ValueError):
    """A grader that is not well-formed, or that failed on this sample; `kind` names the error
    the way OpenAI's grader metadata does (formula_parse_error, python_grader_runtime_error, ...)."""

    def __init__(self, message: str, kind: str = "other_error") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Grade:
    reward: float
    sub_rewards: dict[str, float] = field(default_factory=dict)


def sample_of(output_text: str) -> dict:
    """The `sample` a template sees: the text, and its JSON when it parses."""
    try:
        output_json = json.loads(output_text)
    except (json.JSONDecodeError, TypeError):
        output_json = None
    return {"output_text": output_text, "output_json": output_json}


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


def string_check(g: dict, sample: dict, item: dict, run_python) -> Grade:
    a, b = render(g.get("input"), sample, item), render(g.get("reference"), sample, item)
    ops: dict[str, Callable[[str, str], bool]] = {
        "eq": operator.eq, "ne": operator.ne, "like": lambda x, y: y in x, "ilike": lambda x, y: y.lower() in x.lower()}
    op = g.get("operation")
    if op not in ops:
        raise GraderError(f"string_check operation must be one of {', '.join(ops)} (got {op!r})")
    return Grade(float(ops[op](a, b)))


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


def text_similarity(g: dict, sample: dict, item: dict, run_python) -> Grade:
    metric = g.get("evaluation_metric")
    if metric not in METRICS:
        raise GraderError(f"text_similarity evaluation_metric must be one of {', '.join(METRICS)} (got {metric!r})")
    a, b = render(g.get("input"), sample, item), render(g.get("reference"), sample, item)
    try:
        value = float(METRICS[metric](a, b))
    except ImportError as exc:
        raise GraderError(f"text_similarity {metric} needs the graders extra: pip install 'gymloop[graders]' "
                          f"({exc})") from None
    # the metrics are in [0, 1] up to float rounding (sacrebleu's 100.00000000000004 / 100)
    return Grade(min(1.0, max(0.0, value)))


def python(g: dict, sample: dict, item: dict, run_python) -> Grade:
    """`grade(sample, item)` in the sandbox (run_python: source, sample, item -> reward or raise)."""
    source = g.get("source")
    if not isinstance(source, str) or "def grade" not in source:
        raise GraderError("a python grader's source must define grade(sample, item)")
    return Grade(run_python(source, sample, item))


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
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise GraderError(f"calculate_output does not parse: {exc.msg}", "formula_parse_error") from None
    try:
        return ev(tree)
    except ZeroDivisionError:
        raise GraderError("calculate_output divides by zero", "formula_parse_error") from None


def multi(g: dict, sample: dict, item: dict, run_python) -> Grade:
    graders = g.get("graders")
    if isinstance(graders, dict) and "type" in graders and "name" in graders:
        graders = {graders["name"]: graders}          # the SDK types `graders` as one grader
    if not isinstance(graders, dict) or not graders:
        raise GraderError("a multi grader needs graders: {name: grader, ...}")
    subs = {name: grade(sub, sample, item, run_python).reward for name, sub in graders.items()}
    expr = g.get("calculate_output")
    if not isinstance(expr, str):
        raise GraderError("a multi grader needs calculate_output", "formula_parse_error")
    return Grade(formula(expr, subs), subs)


GRADERS: Table[Callable[..., Grade]] = Table("grader type", {
    "string_check": (string_check, "1 if input and reference compare as the operation says, else 0"),
    "text_similarity": (text_similarity, "similarity of input and reference: fuzzy_match, bleu, rouge_*"),
    "python": (python, "grade(sample, item) -> float, run in the sandbox"),
    "multi": (multi, "named sub-graders combined by a calculate_output formula"),
})


def grade(g: Any, sample: dict, item: dict, run_python) -> Grade:
    """Run one grader; a reward outside [0, 1] is an error."""
    if not isinstance(g, dict):
        raise GraderError("a grader is an object with a type")
    if g.get("type") not in GRADERS:
        raise GraderError(f"unknown grader type {g.get('type')!r}; known: {', '.join(GRADERS)}"
                          + ("" if g.get("type") != "score_model" else " (score_model: not yet)"))
    out = GRADERS.impl(g["type"])(g, sample, item, run_python)
    if not 0.0 <= out.reward <= 1.0:
        raise GraderError(f"the {g['type']} grader's reward {out.reward} is not in [0, 1]")
    return out


def validate(g: Any) -> None:
    """Whether a grader is well-formed: run on an empty sample and item, template errors aside."""
    try:
        grade(g, sample_of(""), {}, lambda *a: 0.0)
    except GraderError as exc:
        if exc.kind not in ("invalid_variable_error", "sample_parse_error"):
            raise


def run(g: Any, output_text: str, item: dict, run_python) -> dict:
    """POST /v1/fine_tuning/alpha/graders/run's answer: reward, sub_rewards and metadata with
    its errors (all false when it ran)."""
    t0 = time.perf_counter()
    errors = {k: False for k in ("formula_parse_error", "invalid_variable_error", "other_error",
                                 "python_grader_runtime_error", "python_grader_server_error", "sample_parse_error",
                                 "truncated_observation_error", "unresponsive_reward_error",
                                 "api_model_grader_parse_error", "api_model_grader_refusal_error",
                                 "api_model_grader_server_error")}
    reward, subs, detail = 0.0, {}, None
    try:
        out = grade(g, sample_of(output_text), item, run_python)
        reward, subs = out.reward, out.sub_rewards
    except GraderError as exc:
        errors[exc.kind] = True
        detail = str(exc)
        if exc.kind == "python_grader_runtime_error":
            errors["python_grader_runtime_error_details"] = detail
    name = g.get("name", "") if isinstance(g, dict) else ""
    gtype = g.get("type", "") if isinstance(g, dict) else ""
    return {"reward": reward, "sub_rewards": subs, "api_model_grader_token_usage_per_model": {},
            "metadata": {"name": name, "type": gtype, "errors": {**errors, "other_error_details": detail}
                         if detail and errors["other_error"] else errors,
                         "execution_time": time.perf_counter() - t0, "scores": {"reward": reward, **subs},
                         "token_usage": None, "sampled_model_name": None},
            **({"error": detail} if detail else {})}
