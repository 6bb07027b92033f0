"""`gymloop envs validate agent`: run the program on a few tasks against a real model, and say
what each episode did (its reward, its calls and segments, or how the program failed). An agent
program has no gold replies to check a verifier with: its own run is the check."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProgramCheck:
    env: str
    model: str
    rows: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every episode ran to a reward (the rewards themselves are the model's business)."""
        return bool(self.rows) and all(r["error"] is None for r in self.rows)


def check_program(env, model: str, n: int = 4, seed: int = 0, temperature: float = 1.0,
                  max_new_tokens: int = 64) -> ProgramCheck:
    """`n` train tasks, one episode each, through `env` (an `agent` environment) on `model`."""
    import torch

    from ..bases.registry import resolve_model
    from ..engine import SamplingParams
    from ..engine.factory import EngineSpec, make_engine
    from ..models.checkpoint import load_model
    from ..rollout.episodes import collect

    torch.set_num_threads(1)
    weights, tok = load_model(resolve_model(model, progress=False))
    engine = make_engine(EngineSpec(), weights, tok)
    tasks = env.sample_tasks(min(n, len([t for t in env.all_tasks() if t.split == "train"])), "train", seed)
    rollouts, _ = collect(engine, tok, env, tasks, 1, SamplingParams(max_new_tokens=max_new_tokens,
                                                                     temperature=temperature, seed=seed))
    check = ProgramCheck(env.name, model)
    for r in rollouts:
        check.rows.append({"task": r.task.id, "reward": r.reward if r.ok else None, "calls": r.calls,
                           "segments": (1 + len(r.segments)) if r.calls else 0,
                           "error": r.score.error if r.score else "not run"})
    return check
