"""Episodes per second through the ecosystems' adapters against gymloop's native `calls`
environment, on the same model: OpenEnv's example (`openenv init`'s echo environment), NeMo Gym's
example_single_tool_call and a verifiers v0 environment (tests/fixtures/vf_reverse), each in its
own runtime (`make test` builds them).

    python -m bench.engines.adapters [--episodes 128] [--repeats 3]

The model is a small random Llama (hidden 64, 2 layers, 4,096 positions: every prompt fits), so
generation is cheap and the adapters' own cost shows: each cell is one `collect` of the episodes
(tasks x 8 samples, up to 2 turns of 16 tokens), median of `--repeats` after a warm-up; the
environment's seconds (reset, steps, verify: the process boundary and the peer's code) are
reported apart from the engine's.
"""
from __future__ import annotations

BENCH = {"results": "engines/adapters", "minutes": 6,
         "measures": ("episodes/s through the OpenEnv, NeMo Gym and verifiers adapters (each in its own runtime) "
                      "against the native `calls` environment, on one model")}

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common  # noqa: F401  (sets OMP_WAIT_POLICY before torch)
import torch

from gymloop import runtimes
from gymloop.bases.registry import resolve_model
from gymloop.engine import NativeEngine, SamplingParams
from gymloop.envs import make_env
from gymloop.models.checkpoint import load_model
from gymloop.rollout.episodes import collect

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def environments(tmp: Path) -> dict:
    subprocess.run([str(runtimes.python("openenv").parent / "openenv"), "init", "echo_env"], cwd=tmp, check=True,
                   capture_output=True)
    return {
        "calls (native)": lambda: make_env("calls"),
        "openenv (echo_env)": lambda: make_env("openenv", app="echo_env.server.app:app", path=str(tmp), sessions=256),
        "nemo_gym (example_single_tool_call)": lambda: make_env(
            "nemo_gym", server="resources_servers.example_single_tool_call.app:SimpleWeatherResourcesServer",
            heldout_fraction=0.4),
        "verifiers (vf-reverse)": lambda: make_env("verifiers", env="vf-reverse", path=str(FIXTURES)),
    }


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _, tok = load_model(resolve_model("nano"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=4096)).eval()
    engine = NativeEngine(model, tok.pad_token_id, decode=tok.decode)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in environments(Path(tmp)).items():
            t0 = time.perf_counter()
            env = build()
            startup = time.perf_counter() - t0
            try:
                tasks = env.sample_tasks(args.episodes // 8, "train", 0)
                runs = []
                for i in range(args.repeats + 1):
                    t0 = time.perf_counter()
                    rolls, st = collect(engine, tok, env, tasks, 8, params, max_turns=2)
                    runs.append({"seconds": time.perf_counter() - t0, "env_s": st.env_seconds, "gen_s": st.gen_seconds,
                                 "episodes": len(rolls), "errors": st.errors,
                                 "turns": sum(r.turns for r in rolls) / len(rolls)})
                runs = runs[1:]                   # the first is the warm-up
            finally:
                if hasattr(env, "close"):
                    env.close()
            med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
            rows.append({"env": name, "startup_s": startup, "episodes": runs[0]["episodes"],
                         "episodes_per_s": runs[0]["episodes"] / med("seconds"),
                         "env_ms_per_episode": 1000 * med("env_s") / runs[0]["episodes"],
                         "gen_s": med("gen_s"), "turns": med("turns"), "errors": max(r["errors"] for r in runs),
                         "runs": runs})
            print(rows[-1]["env"], f"{rows[-1]['episodes_per_s']:.1f} episodes/s", flush=True)
    native = rows[0]["episodes_per_s"]
    table = [["environment", "episodes/s", "vs native calls", "env ms / episode", "turns / episode", "errors",
              "start-up s"]] + [
        [r["env"], f"{r['episodes_per_s']:.1f}", f"{r['episodes_per_s'] / native:.2f}x", f"{r['env_ms_per_episode']:.1f}",
         f"{r['turns']:.2f}", r["errors"], f"{r['startup_s']:.1f}"] for r in rows]
    title = (f"Episodes/s through each adapter, {args.episodes} episodes (8 per task, up to 2 turns of 16 tokens) with "
             f"one small random Llama, one thread; median of {args.repeats} after a warm-up")
    print(common.table(table, title=title))
    common.save("engines/adapters", {"episodes": args.episodes, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
