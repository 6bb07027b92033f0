"""The first program of every sandboxed run: join the slot's network namespace, apply
rlimits, drop to the slot's uid, exec bwrap.

A small C helper (sandbox_exec.c, compiled once with the system C compiler and cached) does
all of it in one exec. Each slot gets its own persistent, empty network namespace (only a
downed loopback), created once by the pool: creating and tearing down a fresh one per run
costs the machine ~5-10% of its sandbox throughput. Runs of one slot never overlap and
leave no process behind, so nothing carries over between them.

Without a compiler (or without root), `setpriv` (uid) and `prlimit` (rlimits) from util-linux
do the same in two execs, and bwrap makes a new network namespace per run.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from .limits import Limits

SOURCE = Path(__file__).with_name("sandbox_exec.c")


@lru_cache(maxsize=1)
def helper() -> str | None:
    """Path of the compiled helper, building it on first use; None if no compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not SOURCE.exists():
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("GYMLOOP_CACHE", Path.home() / ".cache" / "gymloop")) / "bin"
    exe = root / f"sandbox-exec-{digest}"
    if exe.exists():
        return str(exe)
    root.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_suffix(f".tmp{os.getpid()}")
    r = subprocess.run([cc, "-O2", "-o", str(tmp), str(SOURCE)], capture_output=True)
    if r.returncode != 0:
        return None
    os.replace(tmp, exe)   # run by us (it drops to the slot's uid itself, then execs bwrap)
    return str(exe)


def netns_create(name: str) -> str | None:
    """Path of a persistent empty network namespace (root and iproute2 needed), or None."""
    path = f"/run/netns/{name}"
    if os.path.exists(path):
        return path
    if os.geteuid() != 0 or helper() is None or shutil.which("ip") is None:
        return None
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True)
    return path if r.returncode == 0 else None


def netns_delete(name: str) -> None:
    if os.path.exists(f"/run/netns/{name}"):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def prefix(limits: Limits, uid: int | None, netns: str | None = None) -> list[str]:
    """argv prefix that applies `limits`, joins `netns` (a path) and runs the rest as `uid`."""
    mb = 1 << 20
    c = limits.cpu_seconds
    exe = helper()
    if exe is not None:
        return [exe, str(-1 if uid is None else uid), netns or "-", str(c), str(limits.memory_mb * mb),
                str(limits.max_processes), str(limits.max_file_mb * mb), str(limits.max_open_files), "--"]
    out = []
    if uid is not None:
        out += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return out + ["prlimit", f"--cpu={c}:{c + 1}", f"--as={limits.memory_mb * mb}",
                  f"--nproc={limits.max_processes}", f"--fsize={limits.max_file_mb * mb}",
                  f"--nofile={limits.max_open_files}", "--core=0", "--"]
