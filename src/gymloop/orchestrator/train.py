"""One training run (GRPO and its variants, `gymloop train`, and every loop round), one round of stages per step.

    sample tasks -> rollouts (engine) -> verify (environment) -> advantages -> loss and
    optimizer step (trainer) -> weight sync (engine version) -> evaluate (every N steps)

Writes a run directory: config.yaml, metrics.jsonl, checkpoint/, summary.json.
"""
from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable

import torch

from ..models.checkpoint import load_model, save_model
from ..models.parameters import count_parameters
from ..bases.registry import resolve_model
from ..engine.device import to_gpu
from ..config import GRPOConfig, TrainConfig
from ..engine import Engine, SamplingParams
from ..envs import make_env
from ..rollout.evaluate import EvalResult, evaluate
from ..accounting.ledger import Ledger, load_profiles
from ..rollout.sources import AsyncSource, ProcessSource, SyncSource
from ..sync.publish import weight_sync
from ..tracking.progress import progress as progress_bar
from ..tracking.run_dir import Phases, RunDir
from ..algorithms import Advantages, PolicyLoss, advantages_for, overlong_penalty
from ..trainer.trainer import Trainer, rollouts_to_batch


def _eval(engine, tok, env, tasks, cfg: TrainConfig, ks=(), progress: bool = False, collector=None) -> EvalResult:
    return evaluate(engine, tok, env, tasks, max_new_tokens=cfg.eval.max_new_tokens,
                    max_turns=cfg.env.max_turns, ks=ks, samples=cfg.eval.samples,
                    temperature=cfg.sampling.temperature, seed=cfg.seed, progress=progress,
                    collector=collector)


def _rollout_source(cfg: TrainConfig, model, engine, tok, env, sampler, params_at):
    """Where training's rollouts come from: Ray actors, the trainer's own engine (synchronous),
    or a collector beside it (asynchronous: a process by default, or a thread)."""
    g = cfg.grpo
    if cfg.cluster.backend == "ray":
        from ..cluster.ray_backend import RaySource

        return RaySource(model, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns,
                         cfg.cluster, backend=cfg.engine_backend, max_staleness=g.max_staleness)
    if g.max_staleness == 0:
        return SyncSource(engine, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns)
    kind = ProcessSource if g.collector == "process" else AsyncSource
    return kind(model, tok, env, sampler, g.group_size, params_at, cfg.env.max_turns,
                g.max_staleness, backend=cfg.engine_backend, record_routing=g.router_replay)


def policy_loss(g: GRPOConfig) -> PolicyLoss:
    """The configured loss, correction and aggregation as the trainer calls them."""
    return PolicyLoss(name=g.loss, clip_low=g.clip_low, clip_high=g.clip_high, beta=g.beta, agg=g.loss_agg,
                      correction=g.correction, correction_low=g.correction_low, correction_high=g.correction_high)


def score(rollouts: list, g: GRPOConfig, budget: int) -> Advantages:
    """Advantages of a step's rollouts: rewards (shaped by the overlong penalty when on) ->
    the configured estimator; groups without signal dropped when configured or dynamic sampling."""
    rewards = None
    if g.overlong_cache:
        lengths = torch.tensor([sum(r.mask) for r in rollouts])
        rewards = (torch.tensor([float(r.reward) for r in rollouts])
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
                  min_lr_ratio=g.min_lr_ratio, train_only=tuple(g.train_only),
                  decay_steps=g.steps * g.epochs * g.minibatches if g.lr_schedule == "cosine" else None)
    if cfg.cluster.trainers:
        from ..cluster.ray_trainer import TrainerGroup

        trainer = TrainerGroup(model, kwargs, cfg.cluster, threads=cfg.threads)
    else:
        trainer = Trainer(model, **kwargs)
    if cfg.init_trainer_state:
        trainer.load_state(cfg.init_trainer_state)
    return trainer


# After each step: (step, metrics, save) -> None to go on, or a reason to stop now ("paused",
# "cancelled"). `save(path)` writes the model and trainer state as they are (a checkpoint that
# `model: path` plus `init_trainer_state: path` resume from). metrics: reward, loss, ... of the
# step, train_seconds (the learning clock so far: a budget can stop on it), and heldout_pass1 /
# heldout_reward when it evaluated.
StepHook = Callable[[int, dict, Callable[[str], None]], "str | None"]


def train(cfg: TrainConfig, progress: bool = True, echo: Callable[[str], None] = print,
          task_source: Callable[[int], list] | None = None, env=None, on_step: StepHook | None = None) -> dict:
    """Run GRPO as configured; return the summary (also written to summary.json).

    `task_source(step) -> tasks` replaces sampling fresh train tasks (the loop's curriculum).
    `env`: an environment built by the caller (cfg.env.options cannot carry live objects, such as
    a score_model grader's server); the caller closes it. `on_step`: see StepHook.
    """
    t_start = time.perf_counter()
    phases = Phases()
    with phases.time("pretrain"):
        model_path = resolve_model(cfg.model, progress=progress)
    setup_t0 = time.perf_counter()
    profiles = load_profiles(cfg.cost.profiles_file)
    if cfg.cost.profile not in profiles:
        raise ValueError(f"cost.profile {cfg.cost.profile!r} is not a profile; known: {sorted(profiles)}")
    run = RunDir(cfg.run_dir, cfg.name, cfg, cfg.logging)
    echo(f"run directory: {run.path}")
    model, tok = load_model(model_path)
    if cfg.grpo.lora is not None:        # only the adapters train; every save writes merged + adapter/
        from ..models.lora import wrap

        model = wrap(model, cfg.grpo.lora.model_dump(), cfg.init_adapter and Path(cfg.init_adapter))
    elif cfg.init_adapter:
        raise ValueError("init_adapter continues a LoRA adapter: it needs grpo.lora")
    if cfg.device == "cuda":
        to_gpu(model, "device: cuda")
    parameters, active_parameters = count_parameters(model)
    # FLOPs, hence projected costs, count the parameters a token passes through (MoE: top-k experts)
    ledger = Ledger(cfg.cost.profile, profiles[cfg.cost.profile], active_parameters)
    engine = Engine(model, tok.pad_token_id, backend=cfg.engine_backend, decode=tok.decode,
                    record_routing=cfg.grpo.router_replay)
    echo(f"engine: {engine.backend_name} backend" + (f" (native: {engine.native_unsupported})"
                                                     if engine.native_unsupported else ""))
    env = env if env is not None else make_env(cfg.env.name, **cfg.env.options)
    heldout = env.sample_tasks(cfg.eval.tasks, "heldout", seed=cfg.seed)
    g = cfg.grpo
    loss = policy_loss(g)
    budget = cfg.sampling.max_new_tokens * cfg.env.max_turns    # the overlong penalty's length budget
    params = SamplingParams(max_new_tokens=cfg.sampling.max_new_tokens,
                            temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p)

    task_seed = lambda step: cfg.seed * 1_000_003 + step  # noqa: E731
    sampler = task_source or (lambda step: env.sample_tasks(g.prompts_per_step, "train", seed=task_seed(step)))
    params_at = lambda step: SamplingParams(**{**params.__dict__, "seed": task_seed(step)})  # noqa: E731
    make_source = functools.partial(_rollout_source, cfg, model, engine, tok, env, sampler, params_at)
    # On Ray the actors run the held-out evaluation too (the driver only scores), so they start
    # first; a local collector starts after it, so it does not generate beside the base evaluation.
    source = make_source() if cfg.cluster.backend == "ray" else None
    evaluator = source.collect if source is not None else None
    trainer = None
    try:
        trainer = _trainer(cfg, model)
        with phases.time("evaluation"):
            base = _eval(engine, tok, env, heldout, cfg, ks=cfg.eval.ks, progress=progress, collector=evaluator)
        ledger.add("evaluation", generated_tokens=base.generated_tokens)
        base_eval_s = phases.seconds["evaluation"]
        run.log("eval", step=0, **base.as_dict())
        echo(f"base: pass@1 {base.pass1:.3f} on {base.tasks} held-out {env.name} tasks")
        # train_seconds: the clock of learning alone (no evaluation, no pre-training).
        learn = ("generation", "verification", "rollout_wait", "training", "weight_sync")
        overlapped = {"generation": 0.0, "verification": 0.0}
        train_clock = lambda: sum(phases.seconds.get(k, 0.0) for k in learn)  # noqa: E731
        curve = [{"step": 0, "pass1": base.pass1, "train_seconds": 0.0}]
        tokens_generated = base.generated_tokens
        zero_groups = total_groups = 0
        last = base
        dropped_stale = 0
        version = 0
        source = source or make_source()
        sync = weight_sync(model, trainer, engine, source, remote_trainer=cfg.cluster.trainers > 0)
        phases.add("setup", time.perf_counter() - setup_t0 - base_eval_s)
        bar = progress_bar(range(1, g.steps + 1), "grpo", progress)
        for step in bar:
            t_wait = time.perf_counter()
            got, rollouts, st, adv, refills = draw_rollouts(source, step, g, budget)
            dropped_stale += got.dropped_stale
            if g.max_staleness == 0:
                # task sampling and prompt rendering count as generation
                phases.add("generation", time.perf_counter() - t_wait - st.env_seconds)
                phases.add("verification", st.env_seconds)
            else:
                # generation overlaps training; the trainer's clock only sees its wait
                phases.add("rollout_wait", time.perf_counter() - t_wait)
                overlapped["generation"] += st.gen_seconds
                overlapped["verification"] += st.env_seconds
            ledger.add("generation", prompt_tokens=st.prompt_tokens, generated_tokens=st.generated_tokens)
            tokens_generated += st.generated_tokens
            metrics, trained = {}, 0
            with phases.time("training"):
                zero_groups += adv.zero_signal_groups
                total_groups += adv.groups
                if adv.rollouts:
                    batch = rollouts_to_batch(adv.rollouts, tok.pad_token_id, replay=g.router_replay)
                    metrics = trainer.step(batch, adv.advantages, loss, temperature=cfg.sampling.temperature,
                                           epochs=g.epochs, minibatches=g.minibatches)
                    trained = int(batch.attention_mask.sum()) * g.epochs
                    ledger.add("training", trained_tokens=trained)
            with phases.time("weight_sync"):
                sync.publish(step)
            version = step
            with phases.time("logging"):
                ok = [r for r in rollouts if r.ok]
                reward = sum(r.reward for r in ok) / max(len(ok), 1)
                run.log("train", step=step, reward=reward, errors=st.errors,
                        zero_signal_frac=adv.zero_signal_groups / max(adv.groups, 1),
                        trained_rollouts=len(adv.rollouts), generated_tokens=st.generated_tokens,
                        gen_seconds=st.gen_seconds, staleness=step - 1 - got.versions[0],
                        dropped_stale=got.dropped_stale, refills=refills, **metrics)
                bar.set_postfix(reward=f"{reward:.2f}", held=f"{last.pass1:.2f}", refresh=False)
            if (g.steps and step == g.steps) or (cfg.eval.every and step % cfg.eval.every == 0):
                with phases.time("evaluation"):
                    last = _eval(engine, tok, env, heldout, cfg, collector=evaluator)
                ledger.add("evaluation", generated_tokens=last.generated_tokens)
                run.log("eval", step=step, **last.as_dict())
                curve.append({"step": step, "pass1": last.pass1, "train_seconds": train_clock()})
                metrics.update(heldout_pass1=last.pass1, heldout_reward=last.mean_reward)
                if cfg.stop_at_pass1 is not None and last.pass1 >= cfg.stop_at_pass1:
                    echo(f"held-out pass@1 {last.pass1:.3f} >= {cfg.stop_at_pass1} at step {step}: stopping")
                    break
            if on_step is not None:
                def save(path: str) -> None:
                    save_model(model, tok, path, extra={"base_model": str(model_path), "version": step})
                    trainer.save_state(path)
                stop = on_step(step, {"reward": reward, "errors": st.errors, "trained_tokens": trained,
                                       "train_seconds": train_clock(), **metrics}, save)
                if stop is not None:
                    echo(f"stopped at step {step}: {stop}")
                    break
        with phases.time("weight_sync"):
            sync.finish(version)
        if cfg.eval.ks:
            with phases.time("evaluation"):
                last = _eval(engine, tok, env, heldout, cfg, ks=cfg.eval.ks, progress=progress, collector=evaluator)
            ledger.add("evaluation", generated_tokens=last.generated_tokens)
            run.log("eval", step=engine.version, **last.as_dict())
        with phases.time("checkpoint"):
            save_model(model, tok, run.checkpoint, extra={"base_model": str(model_path),
                                                          "version": engine.version})
            trainer.save_state(run.checkpoint)
    finally:
        with phases.time("shutdown"):
            if trainer is not None:
                trainer.close()
            if source is not None:
                source.close()
    wall = time.perf_counter() - t_start
    # every second of the run is on the ledger, what no phase timed (logging set-up, summaries) too
    phases.add("other", max(0.0, wall - sum(phases.seconds.values())))
    for phase, sec in phases.seconds.items():
        ledger.add(phase, sec)
    economics = ledger.summary(base.pass1, last.pass1, post_training_phases=learn,
                               generation_seconds=overlapped["generation"] if g.max_staleness else None)
    economics["wall_seconds"] = wall
    economics["projections"] = ledger.project(
        {k: v for k, v in profiles.items() if k != cfg.cost.profile}, cfg.cost.utilisation)
    summary = {
        "run_dir": str(run.path),
        "model": cfg.model, "model_path": str(model_path), "env": env.name,
        "heldout_tasks": len(heldout),
        "parameters": parameters, "active_parameters": active_parameters,
        "base": base.as_dict(), "final": last.as_dict(),
        "gain_pass1_points": 100 * (last.pass1 - base.pass1),
        "steps": engine.version, "optimizer_steps": trainer.step_count,
        "zero_signal_group_fraction": zero_groups / max(total_groups, 1),
        "tokens_generated": tokens_generated,
        "wall_seconds": wall,
        "phase_seconds": phases.seconds,
        "overlapped_seconds": overlapped if g.max_staleness else {},
        "max_staleness": g.max_staleness,
        "dropped_stale_rollouts": dropped_stale,
        "pass1_curve": curve,
        "economics": economics,
    }
    run.write_summary(summary)
    run.close()
    return summary
