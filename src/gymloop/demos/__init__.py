"""The demo's chapters, each a YAML config in the checkout's configs/ and a function that runs it:

    learn  configs/demo-learn.yaml  learn.run_demo       GRPO on arithmetic, served, before/after
    loop   configs/demo-loop.yaml   loop.run_loop_demo   the continuous loop through a tool-API change
    agent  configs/demo-agent.yaml  loop.run_loop_demo   the same loop with SmolLM2 and tools in the request
    program configs/demo-program.yaml program.run_program_demo  the loop on an agent program, from session feedback

`traffic.py` is the simulated production both send through the official `openai` client."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# src/gymloop/demos -> the checkout's configs/
CONFIGS = Path(__file__).resolve().parents[3] / "configs"
CHAPTERS = {"learn": "demo-learn.yaml", "loop": "demo-loop.yaml", "agent": "demo-agent.yaml",
            "program": "demo-program.yaml"}
# the checkout the chapters' configs name files of (examples/, configs/data/)
CHECKOUT = CONFIGS.parent
NANO_PRESETS = ("nano", "nano-tools", "nano-moe")


def chapter_config(chapter: str, path: str | Path | None = None, overrides: dict | None = None) -> Any:
    """A chapter's config, validated: `path`, or configs/demo-<chapter>.yaml of the checkout."""
    from ..config import ConfigError, TrainConfig, load_config
    from .loop import LoopDemoConfig
    from .program import ProgramDemoConfig

    if path is None:
        path = CONFIGS / CHAPTERS[chapter]
        if not path.exists():
            raise ConfigError(f"{path} not found: run the demo from a gymloop checkout, or pass --config FILE")
    kind = {"learn": TrainConfig, "program": ProgramDemoConfig}.get(chapter, LoopDemoConfig)
    return load_config(path, overrides, kind)


def seeded(model: str, seed: int) -> str:
    """A nano preset pre-trained with `seed` (`nano:seed=1`); any other model as it is."""
    return f"{model}:seed={seed}" if model in NANO_PRESETS and ":" not in model else model
