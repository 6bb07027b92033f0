"""A fine-tuning checkpoint as a download: a .tar.gz of one directory that a Hugging Face user
unpacks and loads, `AutoModelForCausalLM.from_pretrained(dir)` (format merged: the whole model,
LoRA folded in) or `PeftModel.from_pretrained(base, dir)` (format adapter: a LoRA job's adapter
in PEFT's format). What only resuming needs (optimizer and trainer state) stays on the server.
"""
from __future__ import annotations

import tarfile
from pathlib import Path

from ..models.lora import ADAPTER_DIR
from ..trainer.state import LEGACY, STATE_FILE

FORMATS = ("merged", "adapter")
SERVER_ONLY = {STATE_FILE, *LEGACY, "ft_state.pt", "rft_state.json", ADAPTER_DIR}


def source_dir(checkpoint: Path, fmt: str) -> Path:
    """The directory a format downloads; ValueError when the checkpoint has none (adapter of a
    job that trained every weight)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    src = checkpoint / ADAPTER_DIR if fmt == "adapter" else checkpoint
    if not src.is_dir():
        raise ValueError("this checkpoint has no LoRA adapter (the job trained every weight): use format=merged")
    return src


def write_archive(checkpoint: Path, fmt: str, dest: Path, name: str) -> Path:
    """`dest`: a .tar.gz holding `name`/ with the format's files."""
    src = source_dir(checkpoint, fmt)
    with tarfile.open(dest, "w:gz") as tar:
        for f in sorted(src.iterdir()):
            if f.is_file() and (fmt == "adapter" or f.name not in SERVER_ONLY):
                tar.add(f, arcname=f"{name}/{f.name}")
    return dest
