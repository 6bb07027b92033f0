"""One sandboxed run: spawn, feed files, capture capped output, enforce the wall clock, reap.

Waiting uses a pidfd in the same poll() as the output pipes: `Popen.wait(timeout)` polls with
growing sleeps, which inflates short runs. On timeout the outer bwrap is killed;
`--die-with-parent` then kills the sandbox's init, and with it its whole PID namespace,
including double-forked `setsid` children.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass

from . import launcher
from .isolation import ISOLATION, WORKDIR, check_relative
from .limits import Limits, Result

_OOM_MARKERS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")


@dataclass(frozen=True)
class Slot:
    """Where a run executes: the host uid/gid it runs as (None: the caller's) and its cores."""

    index: int
    uid: int | None
    cores: tuple[int, ...] | None = None
    netns: str | None = None          # the slot's own network namespace (None: bwrap makes one)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name.replace("/", "_"), 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _Capped:
    """Keeps the first `cap` bytes of a stream and counts (but drops) the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.parts, self.kept, self.dropped = cap, [], 0, 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(chunk[:room])
            self.kept += min(room, len(chunk))
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", errors="replace")


def run_in_slot(program: list[str], files: dict[str, bytes], limits: Limits, slot: Slot,
                isolation: str, bwrap: str | None = None, extra_ro: tuple[str, ...] = ()) -> Result:
    """Run `program` (argv inside the sandbox) with `files` copied into its scratch dir."""
    fds: dict[str, int] = {}
    try:
        for rel, data in files.items():
            fds[check_relative(rel)] = _memfd(rel, data)
        if isolation == "bwrap":
            argv = ISOLATION["bwrap"](bwrap, limits, program, fds, extra_ro, own_netns=slot.netns is None)
        else:
            argv = ISOLATION[isolation](limits, program)
        return _spawn_and_wait(argv, fds, limits, slot, isolation)
    finally:
        for fd in fds.values():
            os.close(fd)


def _spawn_and_wait(argv: list[str], fds: dict[str, int], limits: Limits, slot: Slot,
                    isolation: str) -> Result:
    cwd = None
    if isolation == "none":
        import tempfile

        cwd = tempfile.mkdtemp(prefix="gymloop-none-")
        for rel, fd in fds.items():
            path = os.path.join(cwd, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(os.read(fd, 1 << 30))
        if slot.uid is not None:
            for root, dirs, names in os.walk(cwd):
                for n in [root] + [os.path.join(root, x) for x in dirs + names]:
                    os.chown(n, slot.uid, slot.uid)
    # The launcher drops to the slot's uid in the child. Popen(user=...) would do the same but
    # makes CPython fork instead of vfork, which costs ~10 ms per run in a large process.
    argv = launcher.prefix(limits, slot.uid, slot.netns if isolation == "bwrap" else None) + argv
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=tuple(fds.values()), env={} if isolation == "bwrap" else {
                "PATH": "/usr/bin:/bin", "HOME": cwd or WORKDIR, "LANG": "C.UTF-8"},
            cwd=cwd, start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        return Result(None, None, "", "", False, False, False, False, 0.0, 0.0,
                      error=f"could not start the sandbox: {exc}")
    if slot.cores:
        try:
            os.sched_setaffinity(proc.pid, slot.cores)
        except OSError:
            pass
    out, err = _Capped(limits.max_output_bytes), _Capped(limits.max_output_bytes)
    timed_out = _pump(proc, out, err, t0 + limits.timeout_s)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
    wall = time.perf_counter() - t0
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    if cwd:
        import shutil

        shutil.rmtree(cwd, ignore_errors=True)
    code = proc.returncode
    sig = -code if code < 0 else None
    raw_err = b"".join(err.parts)
    error = None
    if isolation == "bwrap" and code != 0 and raw_err.startswith(b"bwrap:"):
        error = "sandbox failed: " + raw_err.decode(errors="replace").strip()
    return Result(
        exit_code=None if sig else code, signal=sig, stdout=out.text(), stderr=err.text(),
        stdout_truncated=out.dropped > 0, stderr_truncated=err.dropped > 0, timed_out=timed_out,
        oom=any(m in raw_err for m in _OOM_MARKERS), wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime, error=error,
    )


def _pump(proc: subprocess.Popen, out: _Capped, err: _Capped, deadline: float) -> bool:
    """Read both pipes until EOF and the process has exited; kill at `deadline`. True if killed."""
    pidfd = os.pidfd_open(proc.pid)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN | select.POLLHUP)
    poller.register(pidfd, select.POLLIN)
    exited, timed_out = False, False
    try:
        while streams or not exited:
            left = deadline - time.perf_counter()
            if left <= 0 and not timed_out:
                timed_out = True
                _kill(proc)
                # after the kill, give the pipes a moment to close; never wait forever
                deadline = time.perf_counter() + 2.0
                continue
            if left <= 0:
                break
            for fd, _ in poller.poll(max(left, 0) * 1000):
                if fd == pidfd:
                    exited = True
                    poller.unregister(pidfd)
                    continue
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    streams[fd].add(chunk)
                else:
                    poller.unregister(fd)
                    del streams[fd]
    finally:
        os.close(pidfd)
    if not exited:
        _kill(proc)
    return timed_out


def _kill(proc: subprocess.Popen) -> None:
    # The session/process group holds the launcher/bwrap; --die-with-parent takes the namespace.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
