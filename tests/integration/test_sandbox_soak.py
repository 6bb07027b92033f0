"""Soak: thousands of mixed runs through the pool; nothing lost, leaked or left behind."""
from __future__ import annotations

import glob
import os
import tempfile
import time

import pytest

from gymloop.sandbox import INSTALL_HINT, Limits, Pool, find_bwrap

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason=INSTALL_HINT)
RUNS = int(os.environ.get("GYMLOOP_SOAK_RUNS", "2000"))

# kind -> (source, limits, check(result) -> bool)
FAST = Limits(timeout_s=5, memory_mb=128, max_processes=16, tmpfs_mb=4, max_output_bytes=4096)
KINDS = {
    "normal": ("print(sum(range({i})))", FAST, lambda r, i: r.ok and r.stdout.strip() == str(sum(range(i)))),
    "failing": ("raise ValueError({i})", FAST, lambda r, i: r.exit_code == 1 and "ValueError" in r.stderr),
    "timeout": ("while True: pass", Limits(timeout_s=0.3), lambda r, i: r.timed_out),
    "fork": ("import os\nwhile True:\n    try: os.fork()\n    except OSError: break\nprint('refused')",
             Limits(timeout_s=2, max_processes=8, memory_mb=128), lambda r, i: r.error is None),
    "memory": ("x = bytearray(1 << 31)", FAST, lambda r, i: r.oom and r.exit_code != 0),
    "flood": ("import sys\nsys.stdout.write('y' * 100000)", FAST,
              lambda r, i: r.stdout_truncated and len(r.stdout) == 4096),
    "escape": ("import os\nif os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(30)\nprint('bye')",
               FAST, lambda r, i: r.ok),
}
MIX = ["normal"] * 12 + ["failing"] * 3 + ["timeout", "fork", "memory", "flood", "escape"]


def test_soak():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "gymloop-*")))
    jobs, kinds = [], []
    for i in range(RUNS):
        kind = MIX[i % len(MIX)]
        source, limits, _ = KINDS[kind]
        jobs.append({"source": source.format(i=i), "limits": limits})
        kinds.append(kind)
    t0 = time.perf_counter()
    with Pool(slots=2) as pool:
        results = pool.map(jobs)
        leftovers = pool.leftover_processes()
    elapsed = time.perf_counter() - t0
    assert len(results) == RUNS and all(r is not None for r in results)
    bad = [(i, k, r) for i, (k, r) in enumerate(zip(kinds, results)) if not KINDS[k][2](r, i)]
    assert not bad, bad[:3]
    assert not any(r.error for r in results)
    assert leftovers == []
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "gymloop-*")))
    assert {p for p in after - before if not p.endswith(".lock")} == set()
    print(f"\nsoak: {RUNS} runs in {elapsed:.1f} s ({RUNS / elapsed:.0f} runs/s), 0 lost, 0 leaked")
