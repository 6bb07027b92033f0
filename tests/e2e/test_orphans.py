"""Nothing gymloop starts outlives it, even when it is killed with SIGKILL: `gymloop train` with a
vLLM engine and a peer's environment (its bridge in verifiers' runtime), and `gymloop serve` on
vLLM, are SIGKILLed mid-run; every process they had started (vLLM's server, engine core and
workers, the bridge, the watchdogs) is gone within 10 s."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import eventually, free_port, needs_runtime, needs_vllm

GYMLOOP = [sys.executable, "-m", "gymloop.cli"]
FIXTURES = Path(__file__).parents[1] / "fixtures"


def alive(pids: list[int]) -> list[str]:
    """Which of `pids` still run (zombies have exited: they hold nothing), as 'pid cmdline'."""
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return out


def kill_when_started(cmd: list[str], started: list[str], tmp_path: Path) -> None:
    """Run `cmd`, wait until its descendants include a process whose command line holds each of
    `started`, SIGKILL it alone, and check that every descendant it had is gone within 10 s."""
    log = open(tmp_path / "gymloop.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        def descendants() -> list[psutil.Process]:
            return psutil.Process(proc.pid).children(recursive=True)

        def all_started() -> list[psutil.Process]:
            kids = descendants()
            lines = [" ".join(k.cmdline()) for k in kids if k.is_running()]
            return kids if all(any(s in ln for ln in lines) for s in started) else []

        kids = eventually(all_started, 600, f"{started} running under {cmd[3]}",
                          unless=lambda: proc.poll() is not None and (tmp_path / "gymloop.log").read_text()[-2000:])
        kids = descendants()                      # everything, now that the last one is up
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the bound the issue sets: nothing of theirs is left after 10 s
        eventually(lambda: alive([k.pid for k in kids]) == [], 10, "every process gymloop started exits",
                   every_s=0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_sigkill_of_train_with_vllm_and_a_peer_environment_leaves_nothing(tmp_path, vllm_model_dir):
    needs_vllm()
    needs_runtime("verifiers")
    cfg = {"model": str(vllm_model_dir), "run_dir": str(tmp_path / "runs"), "engine_backend": "vllm",
           "env": {"name": "verifiers", "options": {"env": "vf-reverse", "path": str(FIXTURES)}},
           "sampling": {"max_new_tokens": 8}, "eval": {"tasks": 0},
           "grpo": {"steps": 100000, "prompts_per_step": 2, "group_size": 2}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    kill_when_started([*GYMLOOP, "train", str(tmp_path / "train.yaml")],
                      ["vllm.entrypoints", "verifiers_bridge.py"], tmp_path)


def test_sigkill_of_serve_on_vllm_leaves_nothing(tmp_path, vllm_model_dir):
    needs_vllm()
    kill_when_started([*GYMLOOP, "serve", "--model", str(vllm_model_dir), "--engine-backend", "vllm", "--no-auth",
                       "--port", str(free_port()), "--db", str(tmp_path / "s.db")], ["vllm.entrypoints"], tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGKILL])
def test_a_watchdog_takes_its_whole_group_when_its_parent_dies(tmp_path, signum):
    """The mechanism alone: a parent under the watchdog starts a grandchild that would outlive it
    (its own sleep); the parent is killed; the watchdog's group, the grandchild too, goes."""
    from gymloop import watchdog

    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from gymloop import watchdog\n"
        "p = subprocess.Popen(watchdog.command([sys.executable, '-c', "
        "'import subprocess, sys; subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]).wait()']),"
        " env=watchdog.environ(), start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        dog = int(parent.stdout.readline())
        group = eventually(lambda: [p.pid for p in psutil.process_iter() if _pgid(p.pid) == dog]
                           if len([p for p in psutil.process_iter() if _pgid(p.pid) == dog]) >= 3 else [],
                           60, "the watchdog, the command and its child")
        parent.send_signal(signum)
        parent.wait()
        eventually(lambda: alive(group) == [], 10, "the watchdog's group exits", every_s=0.1)
        assert watchdog.PARENT not in os.environ
    finally:
        if parent.poll() is None:
            parent.kill()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
