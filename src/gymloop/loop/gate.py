"""The gate: a candidate replaces the served model only if it is better on its target and
broke nothing. Suites are the target environment, built with its options, and every other
held-out suite; the rule itself (`gate`) is a pure function of the scores."""
from __future__ import annotations

import json
from pathlib import Path

from .config import GateConfig, GateRun
from ..engine.factory import EngineSpec, make_engine
from ..envs import make_env
from ..models.checkpoint import load_model
from ..rollout.evaluate import evaluate


def suite_envs(cfg: GateRun) -> list:
    """The gate's suites: the target environment with its configured options (a loop on
    `arith` with `digits: 3` is gated on 3-digit tasks), then every other suite by name.
    Whoever asks closes them (close_envs): a peer's environment holds a process."""
    suites = [make_env(cfg.env.name, **cfg.env.options)]
    for name in cfg.suites:
        env = make_env(name)
        if env.name == suites[0].name:
            close_envs([env])
        else:
            suites.append(env)
    return suites


def close_envs(envs: list) -> None:
    for env in envs:
        env.close()


def suite_scores(model_dir: str, suites: list, cfg: GateRun) -> dict[str, float]:
    """Greedy held-out pass@1 of a model on each suite environment, by environment name."""
    model, tok = load_model(model_dir)
    engine = make_engine(EngineSpec(dtype=cfg.engine_dtype), model, tok)
    out = {}
    for env in suites:
        res = evaluate(engine, tok, env, env.sample_tasks(cfg.eval.tasks, "heldout", seed=cfg.seed),
                       max_new_tokens=cfg.eval.max_new_tokens, max_turns=cfg.env.max_turns)
        out[res.env] = res.pass1
    return out


def gate(before: dict[str, float], after: dict[str, float], target: str, g: GateConfig) -> tuple[bool, str]:
    """(promote?, why). Pure: the scores in, the decision out."""
    gain = after[target] - before[target]
    if gain < g.delta:
        return False, f"{target} changed by {gain:+.3f} < delta {g.delta}"
    worst = min(((after[k] - before[k], k) for k in before if k in after), default=(0.0, None))
    if worst[0] < -g.epsilon:
        return False, f"{worst[1]} fell by {-worst[0]:.3f} > epsilon {g.epsilon}"
    return True, f"{target} rose by {gain:+.3f}"


def ensure_production(store, base_dir: str, suites: list, cfg: GateRun) -> dict:
    """The promoted model version; when there is none yet, `base_dir` is recorded as version 1,
    promoted, with its scores (a later promotion then has a version to roll back to)."""
    current = store.versions.promoted()
    if current is None:
        vid = store.versions.add(base_dir, parent=None, status="promoted",
                                      scores=suite_scores(base_dir, suites, cfg))
        current = store.versions.get(vid)
    return current


def gate_and_promote(store, candidate: str, base_dir: str, cfg: GateRun) -> dict:
    """A model from outside the loop (a fine-tuning job's) through the loop's gate: both the
    production model and the candidate scored on the same suites now; promoted (a new version
    whose parent is production, which servers following the store switch to) only if `gate`
    says so. Returns {promoted, why, before, after, target, version, production_version}."""
    suites = suite_envs(cfg)
    target = suites[0].name
    try:
        current = ensure_production(store, base_dir, suites, cfg)
        before = suite_scores(current["path"], suites, cfg)
        after = suite_scores(candidate, suites, cfg)
    finally:
        close_envs(suites)
    ok, why = gate(before, after, target, cfg.gate)
    version = (store.versions.add(candidate, parent=current["version"], status="promoted", scores=after)
               if ok else None)
    return {"promoted": ok, "why": why, "before": before, "after": after, "target": target, "version": version,
            "production_version": current["version"]}


# What a model's config.json says of its shape: servers swap weights in place, so a model of
# another shape cannot take the production slot.
SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "vocab_size", "num_local_experts")


class ArchitectureMismatch(ValueError):
    """A candidate whose shape differs from production's."""


def model_shape(model_dir: str) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return {k: v for k, v in config.items() if k in SHAPE_KEYS}


def promote_job_model(store, job: dict, cfg: GateRun, base_dir: str) -> dict:
    """A finished fine-tuning job's model through the gate (`gate_and_promote`), its verdict
    recorded as an event of the job. ArchitectureMismatch when it cannot take production's slot."""
    current = store.versions.promoted()
    production = current["path"] if current else base_dir
    if model_shape(job["final_path"]) != model_shape(production):
        raise ArchitectureMismatch(f"the model of {job['id']} has another architecture than production ({production})")
    out = gate_and_promote(store, job["final_path"], base_dir, cfg)
    msg = (f"Promoted to production as version {out['version']}: {out['why']}" if out["promoted"]
           else f"Not promoted (production stays version {out['production_version']}): {out['why']}")
    store.jobs.add_event(job["id"], "info", msg, "message", out)
    return out
