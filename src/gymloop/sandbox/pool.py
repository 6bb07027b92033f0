"""The sandbox pool: N concurrent slots, each with its own unprivileged uid.

One uid per slot because RLIMIT_NPROC counts processes per uid: slots sharing a uid let one
sandbox's fork bomb starve the next. Untrusted code never runs as uid 0, not even inside a
user namespace, where root ignores RLIMIT_NPROC. The pool makes its process a child
subreaper and reaps the sandbox uids' orphans, because bwrap's inner init can otherwise
linger as a zombie that still counts against the slot's process limit.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import signal
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from . import launcher
from .isolation import INSTALL_HINT, SandboxUnavailable, find_bwrap
from .limits import Limits, Result
from .runner import Slot, run_in_slot

PR_SET_CHILD_SUBREAPER = 36
DEFAULT_UID_BASE = 61000
PYTHON = "/usr/bin/python3"


def _make_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _proc_uid(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid    # the owner of /proc/PID is the process's uid
    except OSError:
        return None


def pids_of_uid(uid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _proc_uid(p) == uid]


class _UidClaims:
    """Sandbox uids claimed with a lock file each, so two pools (in one process or in two)
    never share a uid, and so never see or kill each other's processes."""

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def claim(self, base: int, n: int, limit: int = 4096) -> list[int]:
        import fcntl
        import tempfile

        got = []
        for uid in range(base, base + limit):
            if len(got) == n:
                break
            if uid in self.held:
                continue
            fd = os.open(os.path.join(tempfile.gettempdir(), f"gymloop-sandbox-uid-{uid}.lock"),
                         os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.held[uid] = fd
            got.append(uid)
        if len(got) < n:
            self.release(got)
            raise RuntimeError(f"could not claim {n} free sandbox uids from {base}")
        return got

    def release(self, uids) -> None:
        for uid in uids:
            fd = self.held.pop(uid, None)
            if fd is not None:
                os.close(fd)


_CLAIMS = _UidClaims()


class Pool:
    """Runs untrusted programs, `slots` at a time, with the same API sync and async.

    isolation: "bwrap" (default; refused with install instructions when missing) or "none"
    (rlimits only, for trusted code; must be chosen explicitly and warns).
    """

    def __init__(self, slots: int | None = None, *, isolation: str = "bwrap",
                 limits: Limits | None = None, python: str = PYTHON,
                 uid_base: int = DEFAULT_UID_BASE, pin_cores: bool = False) -> None:
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"unknown isolation {isolation!r}; known: bwrap, none")
        self.isolation = isolation
        self.bwrap = find_bwrap() if isolation == "bwrap" else None
        if isolation == "bwrap" and self.bwrap is None:
            raise SandboxUnavailable(INSTALL_HINT)
        if isolation == "none":
            warnings.warn("sandbox isolation 'none': code runs with rlimits only and can read the "
                          "host; use it for trusted code only", stacklevel=2)
        self.limits = limits or Limits()
        self.python = python
        n = slots or os.cpu_count() or 1
        root = os.geteuid() == 0
        cores = os.sched_getaffinity(0)
        self._slots: "queue.Queue[Slot]" = queue.Queue()
        self.uids = _CLAIMS.claim(uid_base, n) if root else []
        self.netns: list[str] = []
        for i in range(n):
            pin = None
            if pin_cores:
                ordered = sorted(cores)
                pin = (ordered[i % len(ordered)],)
            ns = None
            if root and isolation == "bwrap":
                # one private, empty network namespace per slot (named by its exclusive uid)
                ns = launcher.netns_create(f"gymloop-sandbox-{self.uids[i]}")
                if ns:
                    self.netns.append(f"gymloop-sandbox-{self.uids[i]}")
            self._slots.put(Slot(i, self.uids[i] if root else None, pin, ns))
        self.size = n
        self._executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandbox")
        self._reap_lock = threading.Lock()
        _make_subreaper()

    # --- running ---------------------------------------------------------------------
    def run(self, argv: Sequence[str] | None = None, *, source: str | None = None,
            files: dict[str, bytes] | None = None, limits: Limits | None = None) -> Result:
        """Run `argv` (inside the sandbox) or Python `source` (as main.py) with `files`."""
        program, files = self._program(argv, source, files)
        slot = self._slots.get()
        try:
            result = run_in_slot(program, files, limits or self.limits, slot, self.isolation,
                                 self.bwrap)
            # The namespace's processes die asynchronously after bwrap exits: the slot goes
            # back only once its uid owns nothing (a /proc scan costs ~0.2 ms).
            self._sweep(slot)
            return result
        finally:
            self._reap()
            self._slots.put(slot)

    async def run_async(self, argv: Sequence[str] | None = None, **kw) -> Result:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self.run(argv, **kw))

    def map(self, jobs: Iterable[dict]) -> list[Result]:
        """Run many jobs (each a dict of `run` keyword arguments) on all slots; results in order."""
        return list(self._executor.map(lambda kw: self.run(**kw), jobs))

    def _program(self, argv, source, files) -> tuple[list[str], dict[str, bytes]]:
        files = dict(files or {})
        if (argv is None) == (source is None):
            raise ValueError("give exactly one of argv or source")
        if source is not None:
            files["main.py"] = source.encode() if isinstance(source, str) else source
            return [self.python, "-I", "main.py"], files
        if not argv:
            raise ValueError("argv must not be empty")
        return list(argv), files

    # --- hygiene ---------------------------------------------------------------------
    def _sweep(self, slot: Slot, patience_s: float = 2.0) -> None:
        """Kill and reap whatever still runs as the slot's uid; return once nothing does.

        After bwrap exits, its inner init may still be dying, re-parented to us (we are a
        subreaper): we reap it by waiting on it, which also keeps it from lingering as a
        zombie that counts against the uid's process limit.
        """
        if slot.uid is None:
            return
        end = time.monotonic() + patience_s
        while True:
            pids = pids_of_uid(slot.uid)
            if not pids or time.monotonic() > end:
                return
            ours = set(self._children())
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            waited = False
            for pid in pids:
                if pid in ours:
                    try:
                        os.waitpid(pid, 0)
                        waited = True
                    except ChildProcessError:
                        pass
            if not waited:
                time.sleep(0.0005)

    @staticmethod
    def _children() -> list[int]:
        try:
            with open(f"/proc/self/task/{os.getpid()}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def _reap(self) -> None:
        """Reap zombies of the sandbox uids that were re-parented to us."""
        if not self.uids:
            return
        with self._reap_lock:
            for pid in self._children():
                if _proc_uid(str(pid)) in self.uids:
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass

    def leftover_processes(self) -> list[int]:
        """Pids still running as any slot uid (for tests and soaks)."""
        return [pid for uid in self.uids for pid in pids_of_uid(uid)]

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        for uid in self.uids:
            self._sweep(Slot(0, uid))
        self._reap()
        for name in self.netns:
            launcher.netns_delete(name)
        _CLAIMS.release(self.uids)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run(argv: Sequence[str] | None = None, *, source: str | None = None,
        files: dict[str, bytes] | None = None, limits: Limits | None = None) -> Result:
    """Run once in a one-slot pool of its own (bubblewrap isolation); many runs should share a
    `Pool` instead."""
    with Pool(slots=1) as pool:
        return pool.run(argv, source=source, files=files, limits=limits)
