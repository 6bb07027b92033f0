"""Ready-made configurations (the demo's, and the benchmarks')."""
from __future__ import annotations

from ..config import EnvSpec, EvalConfig, GRPOConfig, SamplingConfig, TrainConfig


def demo_config(run_dir: str = "runs", model: str = "nano") -> TrainConfig:
    """GRPO on held-out-checked 2-digit addition from the cached nano base."""
    return TrainConfig(
        model=model, name="demo", run_dir=run_dir,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=6),
        # From band-stopped bases (held-out 30-45%, seeds 0-2) this climbs +43 to +48 points in
        # 600 steps, and from a base pre-trained twice as long (86%) to 99% (bench/README.md,
        # recipe_ablation.py). 32 prompts per step learn more steadily than 16.
        grpo=GRPOConfig(steps=600, prompts_per_step=32, group_size=8, lr=2e-4,
                        warmup_steps=20, betas=(0.9, 0.999)),
        eval=EvalConfig(tasks=500, every=50, ks=[4], samples=4, max_new_tokens=6),
    )


def tools_config(run_dir: str = "runs", *, model: str = "nano-tools", version: int = 3, schemas: bool = False,
                 steps: int = 60, prompts: int = 16, lr: float = 2e-4, lr_schedule: str = "constant",
                 temperature: float = 0.7, max_staleness: int = 0, max_new_tokens: int = 40,
                 eval_tasks: int = 64) -> TrainConfig:
    """GRPO on multi-turn tool use (<= 3 turns) from the nano-tools base, by default on tools@v3
    without schemas in the prompt: the API change of the demo's chapter 2, which nano-tools never
    calls greedily (0%) and learns in a few dozen steps (bench/README.md). The defaults are the
    story's round settings (story.StoryConfig)."""
    return TrainConfig(
        model=model, name="tools-grpo", run_dir=run_dir,
        env=EnvSpec(name="tools", options={"version": version, "schemas": schemas}, max_turns=3),
        sampling=SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature),
        grpo=GRPOConfig(steps=steps, prompts_per_step=prompts, group_size=8, lr=lr, warmup_steps=5,
                        lr_schedule=lr_schedule, betas=(0.9, 0.999), max_staleness=max_staleness),
        eval=EvalConfig(tasks=eval_tasks, every=20, max_new_tokens=max_new_tokens),
    )
