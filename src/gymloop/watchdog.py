"""Runs a command so that nothing it starts outlives the gymloop process that started it, SIGKILL
included. Standard library only; run as a script by gymloop's own python:

    python watchdog.py CMD [ARGS...]        (started with start_new_session=True: see `command`)

The watchdog leads a process group of its own; the command runs as its child in that group, with
the watchdog's stdin, stdout and stderr (a bridge's JSON lines pass straight through). When the
gymloop process dies, however it dies, the kernel signals the watchdog (PR_SET_PDEATHSIG), which
kills the whole group: the command and whatever it started (vLLM's engine core and workers, a
peer's server threads' processes). Its exit status is the command's. A caller stops it all with
os.killpg(proc.pid, ...).

One caveat of PR_SET_PDEATHSIG: it fires when the *thread* that started the watchdog exits, so a
process that must outlive a short-lived thread is started from a long-lived one.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
PARENT = "GYMLOOP_WATCHDOG_PARENT"


def command(argv: list[str]) -> list[str]:
    """`argv` run under the watchdog (Popen it with start_new_session=True)."""
    return [sys.executable, str(Path(__file__).resolve()), *argv]


def environ(base: dict | None = None) -> dict:
    """The environment to start the watchdog with: it names its parent, so a parent that died
    before the watchdog armed itself is noticed."""
    return {**(os.environ if base is None else base), PARENT: str(os.getpid())}


def _kill_group(*_) -> None:
    os.killpg(0, signal.SIGKILL)          # the command, what it started, and this watchdog


def main() -> None:
    parent = int(os.environ.pop(PARENT, "0"))
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):      # not Linux: the caller's close() still stops the group
        pass
    signal.signal(signal.SIGTERM, _kill_group)
    if parent and os.getppid() != parent:  # the parent died before the signal was armed
        _kill_group()
    code = subprocess.Popen(sys.argv[1:]).wait()
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
