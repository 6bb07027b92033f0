"""Model directories in Hugging Face format: save (atomically) and load (offline). Nothing else:
model names resolve in `bases/registry.py`, devices are the engine's (`engine/device.py`)."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import torch

from .chat import ChatTokenizer


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bars ("Loading weights", "Writing model shards", a GGUF file's
    "Converting and de-quantizing") inside: a loop round loads and saves several models, and
    each bar would be a line of noise. The previous settings are restored on the way out."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # the GGUF loader draws its bar with tqdm itself, past the logging switch
    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()


def save_model(model: torch.nn.Module, tok: ChatTokenizer, path: str | Path,
               extra: dict | None = None) -> Path:
    """Write config.json, model.safetensors and tokenizer files atomically (a LoRA model: merged,
    with its adapter in adapter/, models/lora.py).

    Written to a sibling temp directory and renamed, so a crash never leaves a half-written
    model where a good one was expected.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from .lora import ADAPTER_DIR, is_lora, merged, save_adapter

    lora = is_lora(model)
    with quiet_transformers():
        # LoRA: the merged model, so the directory loads like any other, and the adapter beside it
        (merged(model) if lora else model).save_pretrained(tmp, safe_serialization=True)
        tok.hf.save_pretrained(tmp)
    if lora:
        save_adapter(model, tmp / ADAPTER_DIR)
    if extra is not None:
        (tmp / "gymloop.json").write_text(json.dumps(extra, indent=2))
    old = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_model(path: str | Path) -> tuple[torch.nn.Module, ChatTokenizer]:
    """Load a Hugging Face causal LM directory (float32, offline)."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(path)
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(Path(path), dtype=torch.float32, local_files_only=True)
    return model, tok


def load_tokenizer(path: str | Path) -> ChatTokenizer:
    """The tokenizer of a model directory, with its chat template (offline)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
    with quiet_transformers():
        hf_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if hf_tok.chat_template is None:
        raise ValueError(f"the tokenizer in {path} has no chat template")
    return ChatTokenizer(hf_tok)


def parameter_count(path: str | Path) -> int:
    """Parameters of a saved model, from its safetensors headers (no weights are read)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(path).glob("model*.safetensors")):        # not a LoRA adapter beside it
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                n = 1
                for d in st.get_slice(name).get_shape():
                    n *= d
                total += n
    if not total:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    return total
