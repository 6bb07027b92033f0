"""gymloop's worker extension for vLLM: imported inside vLLM's worker processes (its own venv),
so it imports nothing of gymloop. `engine/vllm.py` starts vLLM with this module as
`--worker-extension-cls` and calls its method through `collective_rpc`.

A weight version arrives as a safetensors file (Hugging Face parameter names) and goes through
vLLM's own `reload_weights`, which repacks weights for its kernels as loading a checkpoint does;
calling the model's `load_weights` directly skips that repacking (wrong on vLLM's CPU backend).
"""
from __future__ import annotations


class WeightLoader:
    """Mixed into vLLM's worker (`worker_extension_cls`)."""

    def gymloop_load_weights(self, path: str) -> int:
        """Load the weights of the safetensors file at `path` into the running model; the number
        of tensors loaded."""
        from safetensors.torch import load_file

        weights = load_file(path)
        self.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)
