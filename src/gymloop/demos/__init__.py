"""The demo's chapters, each a YAML config shipped with the package (demos/configs/, which the
checkout's configs/demo-*.yaml link to) and a function that runs it:

    learn    demo-learn.yaml    learn.run_demo            GRPO on arithmetic, served, before/after
    loop     demo-loop.yaml     loop.run_loop_demo        the continuous loop through a tool-API change
    agent    demo-agent.yaml    loop.run_loop_demo        the same loop with SmolLM2 and tools in the request
    program  demo-program.yaml  program.run_program_demo  the loop on an agent program, from session feedback

`traffic.py` is the simulated production both send through the official `openai` client."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# package data: `gymloop demo` works from a wheel, in any directory
CONFIGS = Path(__file__).resolve().parent / "configs"
CHAPTERS = {"learn": "demo-learn.yaml", "loop": "demo-loop.yaml", "agent": "demo-agent.yaml",
            "program": "demo-program.yaml"}
# the program chapter runs examples/agents/ of a checkout: this one's, when gymloop runs from one
CHECKOUT = Path(__file__).resolve().parents[3]
NANO_PRESETS = ("nano", "nano-tools", "nano-moe")


def chapter_config(chapter: str, path: str | Path | None = None, overrides: dict | None = None) -> Any:
    """A chapter's config, validated: `path`, or the package's demo-<chapter>.yaml."""
    from ..config import ConfigError, TrainConfig, load_config
    from .loop import LoopDemoConfig
    from .program import ProgramDemoConfig

    if path is None:
        path = CONFIGS / CHAPTERS[chapter]
        if not path.exists():
            raise ConfigError(f"{path} not found: a gymloop installed without its package data? pass --config FILE")
    kind = {"learn": TrainConfig, "program": ProgramDemoConfig}.get(chapter, LoopDemoConfig)
    return load_config(path, overrides, kind)


def seeded(model: str, seed: int) -> str:
    """A nano preset pre-trained with `seed` (`nano:seed=1`); any other model as it is."""
    return f"{model}:seed={seed}" if model in NANO_PRESETS and ":" not in model else model
