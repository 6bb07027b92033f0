"""Held-out evaluation: greedy pass@1, mean reward, and unbiased pass@k from n samples."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from ..models.chat import ChatTokenizer
from ..engine import Engine, SamplingParams
from ..envs.base import Environment, Task
from ..tracking.progress import progress as progress_bar
from .episodes import Rollout, RolloutStats, collect


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    env: str
    tasks: int
    pass1: float               # greedy, fraction of tasks with reward 1
    mean_reward: float         # greedy
    format_rate: float
    errors: int
    seconds: float
    generated_tokens: int
    pass_at_k: dict[int, float] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)  # greedy: each verifier component's mean

    def as_dict(self) -> dict:
        return asdict(self)


CHUNK = 256      # tasks per engine batch: bounds memory, and paces the progress bar

# Who generates the episodes: (tasks, samples per task, sampling) -> (rollouts, stats), the
# rollouts task-major. The default is the local engine; the Ray backend's is its actors.
Collector = Callable[[Sequence[Task], int, SamplingParams], tuple[list[Rollout], RolloutStats]]


def _collect_chunked(collector: Collector, tasks: Sequence[Task], n: int, params: SamplingParams,
                     bar) -> tuple[list, RolloutStats]:
    rolls, total = [], RolloutStats()
    for i in range(0, len(tasks), CHUNK):
        part = tasks[i:i + CHUNK]
        # each chunk its own random stream, else chunks would repeat one another's draws
        p = params if params.seed is None else SamplingParams(**{**params.__dict__, "seed": params.seed + i})
        r, st = collector(part, n, p)
        rolls += r
        total.add(st)
        bar.update(len(part) * n)
    return rolls, total


def component_means(components: Sequence[dict[str, float]]) -> dict[str, float]:
    """The mean of each component over the episodes that report it."""
    names = sorted({k for c in components for k in c})
    return {k: sum(c[k] for c in components if k in c) / sum(k in c for c in components) for k in names}


def evaluate(engine: Engine, tok: ChatTokenizer, env: Environment, tasks: Sequence[Task], *,
             max_new_tokens: int = 16, max_turns: int = 1, ks: Sequence[int] = (),
             samples: int = 0, temperature: float = 1.0, seed: int = 0, progress: bool = False,
             collector: Collector | None = None) -> EvalResult:
    """Greedy pass@1 on `tasks`; with `ks`, also pass@k from `samples` draws per task.
    Episodes run on `engine`, or wherever `collector` runs them (the scoring is the same)."""
    samples = max(samples, max(ks)) if ks else 0
    if collector is None:
        collector = lambda part, n, p: collect(engine, tok, env, part, n, p, max_turns=max_turns)  # noqa: E731
    bar = progress_bar(None, f"eval {env.name}", progress, "episode", total=len(tasks) * (1 + samples), leave=False)
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    rolls, st = _collect_chunked(collector, tasks, 1, greedy, bar)
    good = [r for r in rolls if r.ok]
    n = max(len(good), 1)
    res = EvalResult(
        env=env.name, tasks=len(tasks),
        pass1=sum(r.reward >= 1.0 for r in good) / n,
        mean_reward=sum(r.reward for r in good) / n,
        format_rate=sum(r.score.components.get("format", 0.0) for r in good) / n,
        errors=st.errors, seconds=st.gen_seconds + st.env_seconds,
        generated_tokens=st.generated_tokens,
        components=component_means([r.score.components for r in good]),
    )
    if ks:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        rolls, st2 = _collect_chunked(collector, tasks, samples, params, bar)
        res.seconds += st2.gen_seconds + st2.env_seconds
        res.generated_tokens += st2.generated_tokens
        for k in ks:
            vals = []
            for i in range(len(tasks)):
                grp = [r for r in rolls[i * samples:(i + 1) * samples] if r.ok]
                if len(grp) >= k:
                    vals.append(pass_at_k(len(grp), sum(r.reward >= 1.0 for r in grp), k))
            res.pass_at_k[k] = sum(vals) / max(len(vals), 1)
    bar.close()
    return res
