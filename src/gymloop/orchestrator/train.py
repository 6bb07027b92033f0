"""One training run (GRPO and its variants, `gymloop train`, every loop round and every
reinforcement fine-tuning job), read top to bottom as its stages:

    setup -> evaluate the base -> per step: sample rollouts (engine) and score them (environment,
    advantages) -> update (trainer) -> publish (weight sync) -> log -> evaluate (every N steps)
    -> checkpoint -> summarise (ledger, summary.json)

Writes a run directory: config.yaml, metrics.jsonl, checkpoint/, summary.json. A checkpoint
(model + trainer/state.py's train_state.pt, which carries the run's progress) is written every
`checkpoint_every` steps; `resume_from` continues from one and draws what the uninterrupted run
would have (the same tasks, samples and updates: seeds derive from the step, seeds.py).
"""
from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..models.checkpoint import load_model, save_model
from ..models.parameters import count_parameters
from ..seeds import step_seed
from ..bases.registry import resolve_model
from ..engine.device import to_gpu
from ..config import GRPOConfig, TrainConfig
from ..engine import Engine, SamplingParams
from ..engine.factory import EngineSpec, make_engine
from ..envs import make_env
from ..rollout.evaluate import EvalResult, evaluate
from ..accounting.ledger import Ledger, load_profiles
from ..rollout.sources import AsyncSource, ProcessSource, SyncSource
from ..sync.publish import weight_sync
from ..tracking.progress import progress as progress_bar
from ..tracking.run_dir import Phases, RunDir
from ..algorithms import Advantages, PolicyLoss, advantages_for, overlong_penalty, weighted_components
from ..trainer.objectives import PolicyObjective
from ..trainer.state import STATE_FILE
from ..trainer.trainer import Trainer, rollouts_to_batch, training_rows

# the clock of learning alone (no evaluation, no pre-training, no set-up)
LEARN_PHASES = ("generation", "verification", "rollout_wait", "training", "weight_sync")


def _eval(engine, tok, env, tasks, cfg: TrainConfig, ks=(), progress: bool = False, collector=None) -> EvalResult:
    return evaluate(engine, tok, env, tasks, max_new_tokens=cfg.eval.max_new_tokens,
                    max_turns=cfg.env.max_turns, ks=ks, samples=cfg.eval.samples,
                    temperature=cfg.sampling.temperature, seed=cfg.seed, progress=progress,
                    collector=collector)


def _rollout_source(cfg: TrainConfig, model, engine, tok, env, sampler, params_at, model_dir=None):
    """Where training's rollouts come from: Ray actors, the trainer's own engine (synchronous),
    or a collector beside it (asynchronous: a process by default, or a thread)."""
    g = cfg.grpo
    if cfg.cluster.backend == "ray":
        from ..cluster.ray_backend import RaySource

        return RaySource(model, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns,
                         cfg.cluster, engine=engine_spec(cfg, model_dir), max_staleness=g.max_staleness)
    if g.max_staleness == 0:
        return SyncSource(engine, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns)
    if cfg.engine_backend == "vllm":     # vLLM generates in its own process: the collector is a thread
        return AsyncSource(model, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns,
                           g.max_staleness, engine=engine)
    kind = ProcessSource if g.collector == "process" else AsyncSource
    return kind(model, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns,
                g.max_staleness, spec=engine_spec(cfg, model_dir).native())


def policy_loss(g: GRPOConfig) -> PolicyLoss:
    """The configured loss, correction and aggregation as the trainer calls them."""
    return PolicyLoss(name=g.loss, clip_low=g.clip_low, clip_high=g.clip_high, beta=g.beta, agg=g.loss_agg,
                      correction=g.correction, correction_low=g.correction_low, correction_high=g.correction_high)


def score(rollouts: list, g: GRPOConfig, budget: int) -> Advantages:
    """Advantages of a step's rollouts: rewards (the verifier's, or a weighted sum of its
    components; plus the overlong penalty when on) -> the configured estimator; groups without
    signal dropped when configured or dynamic sampling."""
    rewards = None
    if g.reward_weights:
        rewards = weighted_components([r.score.components if r.ok else None for r in rollouts], g.reward_weights)
    if g.overlong_cache:
        lengths = torch.tensor([sum(r.mask) for r in rollouts])
        rewards = (torch.tensor(rewards if rewards is not None else [float(r.reward) for r in rollouts])
                   + overlong_penalty(lengths, budget, g.overlong_cache)).tolist()
    return advantages_for(rollouts, g.group_size, g.advantage, g.drop_zero_signal or g.dynamic_sampling, rewards)


def draw_rollouts(source, step: int, g: GRPOConfig, budget: int):
    """A step's rollouts and their advantages. With dynamic sampling (DAPO), more draws while
    fewer than prompts_per_step groups carry a signal (at most max_refills), then the first
    prompts_per_step of those are kept. Returns (batch, rollouts, stats, advantages, draws)."""
    got = source.next(step)
    rollouts, stats = list(got.rollouts), got.stats
    adv = score(rollouts, g, budget)
    draws = 0
    while g.dynamic_sampling and adv.signal_groups < g.prompts_per_step and draws < g.max_refills:
        draws += 1
        extra = source.more(step, draws)
        rollouts += extra.rollouts
        stats.add(extra.stats)
        adv = score(rollouts, g, budget)
    if g.dynamic_sampling:
        adv = adv.first(g.prompts_per_step)
    return got, rollouts, stats, adv, draws


def _trainer(cfg: TrainConfig, model):
    """The trainer in this process, or (cluster.trainers >= 1) data-parallel Ray actors."""
    g = cfg.grpo
    kwargs = dict(lr=g.lr, weight_decay=g.weight_decay, warmup_steps=g.warmup_steps,
                  max_grad_norm=g.max_grad_norm, ref_model=g.beta > 0, betas=g.betas,
                  min_lr_ratio=g.min_lr_ratio, train_only=tuple(g.train_only), micro_batch=g.micro_batch,
                  decay_steps=g.steps * g.epochs * g.minibatches if g.lr_schedule == "cosine" else None)
    if cfg.cluster.trainers:
        from ..cluster.ray_trainer import TrainerGroup

        return TrainerGroup(model, kwargs, cfg.cluster, threads=cfg.threads)
    return Trainer(model, **kwargs)


@dataclass
class RunProgress:
    """What a run has done so far: saved in each checkpoint's state (its `run`), so a resumed
    run goes on where it stopped and its summary counts the part before the kill too."""

    step: int = 0
    base: dict | None = None                   # EvalResult.as_dict() of the base model
    last: dict | None = None                   # ... of the newest evaluation
    curve: list[dict] = field(default_factory=list)
    tokens_generated: int = 0
    zero_groups: int = 0
    total_groups: int = 0
    dropped_stale: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    overlapped: dict[str, float] = field(default_factory=lambda: {"generation": 0.0, "verification": 0.0})
    ledger: dict[str, dict] = field(default_factory=dict)
    wall_seconds: float = 0.0                  # of the parts before the newest resume
    job: dict = field(default_factory=dict)    # the caller's own progress (a fine-tuning job's)


@dataclass
class Run:
    """What a run's stages share: its config, model, engine, environment, trainer, rollout
    source, clocks, ledger and progress."""

    cfg: TrainConfig
    model_path: Path
    model: torch.nn.Module
    tok: object
    env: object
    engine: Engine
    trainer: object
    heldout: list
    dir: RunDir
    ledger: Ledger
    profiles: dict                             # the priced hardware (the ledger's and the projections')
    phases: Phases
    progress: RunProgress
    echo: Callable[[str], None]
    loss: PolicyLoss
    budget: int                                # the overlong penalty's length budget
    source: object = None
    sync: object = None
    evaluator: Callable | None = None
    task_source: Callable[[int], list] | None = None
    owns_env: bool = False                     # made by the run (not passed in): it closes it at the end
    t_start: float = field(default_factory=time.perf_counter)    # this process's part of the run
    setup_t0: float = 0.0                                         # after pre-training (a phase of its own)

    def train_clock(self) -> float:
        return sum(self.phases.seconds.get(k, 0.0) for k in LEARN_PHASES)

    def save(self, path: str | Path, job: dict | None = None) -> None:
        """The model and the trainer's state with the run's progress: a checkpoint `resume_from` continues."""
        if job is not None:
            self.progress.job = job
        self.progress.phase_seconds = dict(self.phases.seconds)
        self.progress.ledger = self.ledger.state()
        save_model(self.model, self.tok, path, extra={"base_model": str(self.model_path), "version": self.progress.step})
        self.trainer.save_state(path, run={**dataclasses.asdict(self.progress),
                                           "wall_seconds": self.progress.wall_seconds + time.perf_counter() - self.t_start})


def _load_model(cfg: TrainConfig, model_path: Path):
    """The model to train: the config's, or the checkpoint's it resumes (LoRA: the base and the
    checkpoint's adapter), on the configured device."""
    start = Path(cfg.resume_from) if cfg.resume_from and cfg.grpo.lora is None else model_path
    model, tok = load_model(start)
    adapter = Path(cfg.resume_from) / "adapter" if cfg.resume_from else cfg.init_adapter and Path(cfg.init_adapter)
    if cfg.grpo.lora is not None:        # only the adapters train; every save writes merged + adapter/
        from ..models.lora import wrap

        model = wrap(model, cfg.grpo.lora.model_dump(), adapter or None)
    elif cfg.init_adapter:
        raise ValueError("init_adapter continues a LoRA adapter: it needs grpo.lora")
    if cfg.device == "cuda":
        to_gpu(model, "device: cuda")
    # the engine generates in eval mode; Trainer.step trains in train mode and gives back the mode it found
    return model.eval(), tok


def setup(cfg: TrainConfig, progress: bool, echo, env, task_source) -> Run:
    """Model, engine, environment, trainer (its state restored when continuing), ledger and
    run directory; the Ray source first (its actors evaluate the base too)."""
    t_start = time.perf_counter()
    phases = Phases()
    with phases.time("pretrain"):
        model_path = resolve_model(cfg.model, progress=progress)
    setup_t0 = time.perf_counter()
    profiles = load_profiles(cfg.cost.profiles_file)
    if cfg.cost.profile not in profiles:
        raise ValueError(f"cost.profile {cfg.cost.profile!r} is not a profile; known: {sorted(profiles)}")
    run_dir = RunDir(cfg.run_dir, cfg.name, cfg, cfg.logging)
    echo(f"run directory: {run_dir.path}")
    model, tok = _load_model(cfg, Path(model_path))
    # FLOPs, hence projected costs, count the parameters a token passes through (MoE: top-k experts)
    ledger = Ledger(cfg.cost.profile, profiles[cfg.cost.profile], count_parameters(model)[1])
    engine = _engine(cfg, model, tok, Path(model_path))
    owns_env = env is None
    try:
        why = getattr(engine, "native_unsupported", None)      # the native engine says why it runs hf
        echo(f"engine: {engine.backend_name} backend" + (f" (native: {why})" if why else ""))
        env = env if env is not None else make_env(cfg.env.name, **cfg.env.options)
        run = Run(cfg, Path(model_path), model, tok, env, engine, None, _heldout(env, cfg),
                  run_dir, ledger, profiles, phases, RunProgress(), echo, policy_loss(cfg.grpo),
                  cfg.sampling.max_new_tokens * cfg.env.max_turns, task_source=task_source,
                  owns_env=owns_env, t_start=t_start, setup_t0=setup_t0)
        if cfg.cluster.backend == "ray":
            run.source = _make_source(run)
            run.evaluator = run.source.collect
        run.trainer = _trainer(cfg, model)
        if cfg.resume_from:
            _restore(run, run.trainer.load_state(cfg.resume_from, rng=True))
        elif cfg.init_trainer_state:      # continuing training (a loop's next round): the optimizer, not the run
            run.trainer.load_state(cfg.init_trainer_state)
        if cfg.resume_from and cfg.engine_backend == "vllm":     # vLLM started from the base's files
            engine.load_weights(model.state_dict(), version=run.progress.step)
        if cfg.engine_backend == "vllm" and cfg.grpo.max_staleness and cfg.cluster.backend == "local":
            run.source = _make_source(run)      # the collector runs on the driver's vLLM ...
            run.evaluator = run.source.evaluate       # ... so evaluations wait for it and use the newest weights
        return run
    except BaseException:
        engine.close()                  # a vLLM process started for this run
        if owns_env and env is not None:   # a peer's bridge or server
            env.close()
        raise


def engine_spec(cfg: TrainConfig, model_dir: Path | str | None) -> EngineSpec:
    """The run's engine as its config says (the factory checks what the backend can do)."""
    return EngineSpec(backend=cfg.engine_backend, dtype=cfg.engine_dtype, record_routing=cfg.grpo.router_replay,
                      model_dir=None if model_dir is None else str(model_dir), url=cfg.vllm_url, seed=cfg.seed,
                      vllm=cfg.vllm.model_dump(), shares_gpu=cfg.device == "cuda")


def _engine(cfg: TrainConfig, model, tok, model_dir: Path):
    """The driver's engine: gymloop's own on the trainer's model (shared tensors), or vLLM in its
    own process, sent the trainer's weights after every step (a LoRA run's adapter). On Ray the
    rollout workers run the vLLM servers and the driver keeps gymloop's own engine."""
    from ..models.lora import adapter_config

    spec = engine_spec(cfg, model_dir)
    if cfg.cluster.backend == "ray":
        return make_engine(spec.native(), model, tok)
    lora = adapter_config(model) if cfg.grpo.lora is not None and spec.backend == "vllm" else None
    engine = make_engine(replace(spec, lora=lora), model, tok)
    if lora is not None:             # the served adapter is the model's from the start (init_adapter too)
        engine.load_weights(model.state_dict(), version=0)
    return engine


def _heldout(env, cfg: TrainConfig) -> list:
    """The run's held-out tasks (none with eval.tasks 0: the run does not evaluate)."""
    return env.sample_tasks(cfg.eval.tasks, "heldout", seed=cfg.seed) if cfg.eval.tasks else []


def _restore(run: Run, saved: dict) -> None:
    """Continue from a checkpoint's progress: its step, counters, clocks and ledger."""
    if not saved:
        raise ValueError(f"resume_from {run.cfg.resume_from}: its state has no run progress (a checkpoint "
                         "of an older version, or only an optimizer state: use init_trainer_state)")
    p = RunProgress(**{k: v for k, v in saved.items() if k in RunProgress.__dataclass_fields__})
    run.progress = p
    run.phases.seconds = dict(p.phase_seconds)
    run.ledger.restore(p.ledger)
    run.engine.version = p.step
    run.echo(f"resuming at step {p.step + 1} from {run.cfg.resume_from}")


def _make_source(run: Run):
    cfg, g = run.cfg, run.cfg.grpo
    params = SamplingParams(max_new_tokens=cfg.sampling.max_new_tokens,
                            temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p)
    task_seed = functools.partial(step_seed, cfg.seed)
    sampler = run.task_source or (lambda step: run.env.sample_tasks(g.prompts_per_step, "train", seed=task_seed(step)))
    params_at = lambda step: SamplingParams(**{**params.__dict__, "seed": task_seed(step)})  # noqa: E731
    return _rollout_source(cfg, run.model, run.engine, run.tok, run.env, sampler, params_at, run.model_path)


def evaluate_base(run: Run, progress: bool) -> None:
    """Held-out evaluation of the model before the first step (a resumed run has it already;
    eval.tasks 0: none)."""
    if run.progress.base is not None or not run.heldout:
        return
    cfg = run.cfg
    with run.phases.time("evaluation"):
        base = _eval(run.engine, run.tok, run.env, run.heldout, cfg, ks=cfg.eval.ks, progress=progress,
                     collector=run.evaluator)
    run.ledger.add("evaluation", generated_tokens=base.generated_tokens)
    run.dir.log("eval", step=0, **base.as_dict())
    run.echo(f"base: pass@1 {base.pass1:.3f} on {base.tasks} held-out {run.env.name} tasks")
    p = run.progress
    p.base = p.last = base.as_dict()
    p.curve = [{"step": 0, "pass1": base.pass1, "train_seconds": 0.0}]
    p.tokens_generated = base.generated_tokens


def sample(run: Run, step: int):
    """A step's rollouts, scored: (what the source gave, rollouts, stats, advantages, refills)."""
    g = run.cfg.grpo
    t_wait = time.perf_counter()
    got, rollouts, st, adv, refills = draw_rollouts(run.source, step, g, run.budget)
    if g.max_staleness == 0:
        # task sampling and prompt rendering count as generation
        run.phases.add("generation", time.perf_counter() - t_wait - st.env_seconds)
        run.phases.add("verification", st.env_seconds)
    else:
        # generation overlaps training; the trainer's clock only sees its wait
        run.phases.add("rollout_wait", time.perf_counter() - t_wait)
        run.progress.overlapped["generation"] += st.gen_seconds
        run.progress.overlapped["verification"] += st.env_seconds
    run.ledger.add("generation", prompt_tokens=st.prompt_tokens, generated_tokens=st.generated_tokens)
    run.progress.tokens_generated += st.generated_tokens
    run.progress.dropped_stale += got.dropped_stale
    return got, rollouts, st, adv, refills


def update(run: Run, adv: Advantages) -> tuple[dict, int]:
    """The optimizer steps on the step's trained rollouts: (trainer metrics, tokens trained)."""
    g = run.cfg.grpo
    with run.phases.time("training"):
        run.progress.zero_groups += adv.zero_signal_groups
        run.progress.total_groups += adv.groups
        if not adv.rollouts:
            return {}, 0
        rows, advantages = training_rows(adv.rollouts, adv.advantages)
        batch = rollouts_to_batch(rows, run.tok.pad_token_id, replay=g.router_replay)
        objective = PolicyObjective(run.loss, advantages, run.cfg.sampling.temperature)
        metrics = run.trainer.step(batch, objective, epochs=g.epochs, minibatches=g.minibatches)
        trained = int(batch.attention_mask.sum()) * g.epochs
        run.ledger.add("training", trained_tokens=trained)
    return metrics, trained


def _agent_metrics(env, st) -> dict:
    """An agent program's episodes: model calls and training sequences per episode, and how many
    episodes failed as programs (left out of training)."""
    if not env.runs_episodes:
        return {}
    return {"agent_calls": st.calls / max(st.episodes, 1), "agent_segments": st.segments / max(st.episodes, 1),
            "agent_errors": st.errors, "agent_sampling_overridden": st.overridden}


def log_step(run: Run, step: int, got, rollouts, st, adv, refills: int, metrics: dict, bar) -> float:
    """The step's metrics record; returns the mean reward of its episodes that ran."""
    with run.phases.time("logging"):
        ok = [r for r in rollouts if r.ok]
        reward = sum(r.reward for r in ok) / max(len(ok), 1)
        run.dir.log("train", step=step, reward=reward, errors=st.errors,
                    zero_signal_frac=adv.zero_signal_groups / max(adv.groups, 1),
                    trained_rollouts=len(adv.rollouts), generated_tokens=st.generated_tokens,
                    gen_seconds=st.gen_seconds, staleness=step - 1 - got.versions[0],
                    dropped_stale=got.dropped_stale, refills=refills, **_agent_metrics(run.env, st), **metrics)
        held = {"held": f"{run.progress.last['pass1']:.2f}"} if run.progress.last else {}
        bar.set_postfix(reward=f"{reward:.2f}", **held, refresh=False)
    return reward


def evaluate_step(run: Run, step: int, metrics: dict) -> bool:
    """Held-out evaluation at the last step and every `eval.every`; True when it reached
    `stop_at_pass1` (the run stops)."""
    cfg = run.cfg
    due = (cfg.grpo.steps and step == cfg.grpo.steps) or (cfg.eval.every and step % cfg.eval.every == 0)
    if not (due and run.heldout):
        return False
    with run.phases.time("evaluation"):
        last = _eval(run.engine, run.tok, run.env, run.heldout, cfg, collector=run.evaluator)
    run.ledger.add("evaluation", generated_tokens=last.generated_tokens)
    run.dir.log("eval", step=step, **last.as_dict())
    run.progress.last = last.as_dict()
    run.progress.curve.append({"step": step, "pass1": last.pass1, "train_seconds": run.train_clock()})
    metrics.update(heldout_pass1=last.pass1, heldout_reward=last.mean_reward)
    if cfg.stop_at_pass1 is not None and last.pass1 >= cfg.stop_at_pass1:
        run.echo(f"held-out pass@1 {last.pass1:.3f} >= {cfg.stop_at_pass1} at step {step}: stopping")
        return True
    return False


def finish(run: Run, progress: bool) -> None:
    """The last weight sync, the pass@k evaluation when asked, and the final checkpoint."""
    cfg = run.cfg
    with run.phases.time("weight_sync"):
        run.sync.finish(run.engine.version)
    if cfg.eval.ks and run.heldout:
        with run.phases.time("evaluation"):
            last = _eval(run.engine, run.tok, run.env, run.heldout, cfg, ks=cfg.eval.ks, progress=progress,
                         collector=run.evaluator)
        run.ledger.add("evaluation", generated_tokens=last.generated_tokens)
        run.dir.log("eval", step=run.engine.version, **last.as_dict())
        run.progress.last = last.as_dict()
    with run.phases.time("checkpoint"):
        run.save(run.dir.checkpoint)


def summarise(run: Run) -> dict:
    """Every second on the ledger, the economics and the summary (also written to summary.json)."""
    cfg, p = run.cfg, run.progress
    wall = p.wall_seconds + time.perf_counter() - run.t_start
    # every second of the run is on the ledger, what no phase timed (logging set-up, summaries) too
    run.phases.add("other", max(0.0, wall - sum(run.phases.seconds.values())))
    for phase, sec in run.phases.seconds.items():
        run.ledger.add(phase, sec)
    profiles = run.profiles
    scored = p.base is not None                # eval.tasks 0: no held-out score, no points gained
    economics = run.ledger.summary(p.base["pass1"] if scored else None, p.last["pass1"] if scored else None,
                                   post_training_phases=LEARN_PHASES,
                                   generation_seconds=p.overlapped["generation"] if cfg.grpo.max_staleness else None)
    economics["wall_seconds"] = wall
    economics["projections"] = run.ledger.project(
        {k: v for k, v in profiles.items() if k != cfg.cost.profile}, cfg.cost.utilisation)
    parameters, active = count_parameters(run.model)
    summary = {
        "run_dir": str(run.dir.path),
        "model": cfg.model, "model_path": str(run.model_path), "env": run.env.name,
        "heldout_tasks": len(run.heldout),
        "parameters": parameters, "active_parameters": active,
        "base": p.base, "final": p.last,
        "gain_pass1_points": 100 * (p.last["pass1"] - p.base["pass1"]) if scored else None,
        "steps": run.engine.version, "optimizer_steps": run.trainer.step_count,
        "zero_signal_group_fraction": p.zero_groups / max(p.total_groups, 1),
        "tokens_generated": p.tokens_generated,
        "wall_seconds": wall,
        "phase_seconds": run.phases.seconds,
        "overlapped_seconds": p.overlapped if cfg.grpo.max_staleness else {},
        "max_staleness": cfg.grpo.max_staleness,
        "dropped_stale_rollouts": p.dropped_stale,
        "pass1_curve": p.curve,
        "economics": economics,
    }
    run.dir.write_summary(summary)
    run.dir.close()
    return summary


def save_step_checkpoint(run: Run, step: int) -> Path:
    """checkpoints/step-NNNNNN/ of the run directory, then the older ones removed. The state file
    is written last, so a directory that has one is whole (a kill -9 mid-write leaves the last)."""
    path = run.dir.path / "checkpoints" / f"step-{step:06d}"
    run.save(path)
    for old in (run.dir.path / "checkpoints").glob("step-*"):
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    return path


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The checkpoint an interrupted run resumes from: its newest whole one (see save_step_checkpoint)."""
    run_dir = Path(run_dir)
    steps = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / STATE_FILE).exists())
    if (run_dir / "checkpoint" / STATE_FILE).exists():
        raise ValueError(f"{run_dir} finished (its final checkpoint/ is written): nothing to resume")
    if not steps:
        raise ValueError(f"{run_dir} has no whole checkpoint to resume (checkpoints/step-*/{STATE_FILE}): "
                         "was it run with checkpoint_every > 0?")
    return steps[-1]


# After each step: (step, metrics, save) -> None to go on, or a reason to stop now ("paused",
# "cancelled"). `save(path, job)` writes a checkpoint as the run is now, `job` (the caller's own
# progress) inside its state: `resume_from: path` continues from it. metrics: reward, loss, ...
# of the step, train_seconds (the learning clock so far: a budget can stop on it), and
# heldout_pass1 / heldout_reward when it evaluated.
StepHook = Callable[[int, dict, Callable[..., None]], "str | None"]


def train(cfg: TrainConfig, progress: bool = True, echo: Callable[[str], None] = print,
          task_source: Callable[[int], list] | None = None, env=None, on_step: StepHook | None = None) -> dict:
    """Run GRPO as configured; return the summary (also written to summary.json).

    `task_source(step) -> tasks` replaces sampling fresh train tasks (the loop's curriculum).
    `env`: an environment built by the caller (cfg.env.options cannot carry live objects, such as
    a score_model grader's server); the caller closes it. `on_step`: see StepHook.
    """
    run = setup(cfg, progress, echo, env, task_source)
    g = cfg.grpo
    try:
        evaluate_base(run, progress)
        run.source = run.source or _make_source(run)
        run.sync = weight_sync(run.model, run.trainer, run.engine, run.source, remote_trainer=cfg.cluster.trainers > 0)
        base_eval_s = run.phases.seconds.get("evaluation", 0.0) - run.progress.phase_seconds.get("evaluation", 0.0)
        run.phases.add("setup", time.perf_counter() - run.setup_t0 - base_eval_s)
        bar = progress_bar(range(run.progress.step + 1, g.steps + 1), "grpo", progress)
        for step in bar:
            got, rollouts, st, adv, refills = sample(run, step)
            metrics, trained = update(run, adv)
            with run.phases.time("weight_sync"):
                run.sync.publish(step)
            run.progress.step = step
            reward = log_step(run, step, got, rollouts, st, adv, refills, metrics, bar)
            stop = "target reached" if evaluate_step(run, step, metrics) else None
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and stop is None:
                with run.phases.time("checkpoint"):
                    save_step_checkpoint(run, step)
            if on_step is not None and stop is None:
                stop = on_step(step, {"reward": reward, "errors": st.errors, "trained_tokens": trained,
                                      "train_seconds": run.train_clock(), **metrics}, run.save)
                if stop is not None:
                    echo(f"stopped at step {step}: {stop}")
            if stop is not None:
                break
        finish(run, progress)
    finally:
        with run.phases.time("shutdown"):
            run.trainer.close()
            if run.source is not None:
                run.source.close()
            run.engine.close()
            if run.owns_env:
                run.env.close()
    return summarise(run)
