"""The CLI starts fast and the serving API documents what it accepts.

    python -m bench.serving.cli_api [--repeats 3] [--examples 50]

1. Wall seconds, best of `--repeats`, of `gymloop --help` and of `gymloop sandbox run` on a file
   that prints 1 (the CLI imports torch only for the commands that use it), and the CPU seconds the
   sandbox reports for a program whose two processes stay busy for a second.
2. `schemathesis run /openapi.json --checks all` against a real `gymloop serve` (the `bench`
   extra installs schemathesis): every generated request must get a documented answer.
"""
from __future__ import annotations

BENCH = {"results": "serving/cli_api", "minutes": 3,
         "measures": ("`gymloop --help` and `gymloop sandbox run` wall time (best of 3), the sandbox's CPU accounting, "
                      "and `schemathesis --checks all` against a real `gymloop serve`")}   # found by bench/run_all.py

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

BURN = """
import os, time
def burn():
    end = time.time() + 1.0
    while time.time() < end:
        pass
pid = os.fork()
burn()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
"""


def gymloop() -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), "gymloop")]


def best_of(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def schemathesis(examples: int, model: str) -> tuple[int, str]:
    from gymloop.serve.background import free_port

    st = shutil.which("schemathesis") or os.path.join(os.path.dirname(sys.executable), "schemathesis")
    if not os.path.exists(st):
        return -1, "schemathesis is not installed (make bench installs it)"
    port = free_port()
    db = os.path.join(tempfile.mkdtemp(), "st.db")
    server = subprocess.Popen(gymloop() + ["serve", "--model", model, "--api-key", "sk-bench", "--port", str(port),
                                           "--db", db], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run = subprocess.run([st, "--config-file", str(Path(__file__).with_name("schemathesis.toml")), "run",
                              f"http://127.0.0.1:{port}/openapi.json", "--checks", "all",
                              "-H", "Authorization: Bearer sk-bench", "--max-examples", str(examples),
                              "--wait-for-schema", "60"], capture_output=True, text=True, timeout=900)
        return run.returncode, run.stdout
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--examples", type=int, default=50, help="schemathesis examples per operation")
    ap.add_argument("--model", default="nano", help="model the server serves")
    args = ap.parse_args()
    from gymloop.bases.registry import resolve_model

    model = str(resolve_model(args.model, progress=False))
    with tempfile.TemporaryDirectory() as tmp:
        one, burn = os.path.join(tmp, "one.py"), os.path.join(tmp, "burn.py")
        open(one, "w").write("print(1)\n")
        open(burn, "w").write(BURN)
        helps = best_of(gymloop() + ["--help"], args.repeats)
        sandbox = best_of(gymloop() + ["sandbox", "run", one], args.repeats)
        burned = json.loads(subprocess.run(gymloop() + ["sandbox", "run", burn], capture_output=True,
                                           text=True).stdout)
    rc, out = schemathesis(args.examples, model)
    summary = next((ln.strip() for ln in out.splitlines()[::-1] if " generated, " in ln), out.strip()[-200:])
    rows = [["measure", "value", "goal"],
            [f"gymloop --help, best of {args.repeats}", f"{helps:.2f} s", "< 0.6 s"],
            [f"gymloop sandbox run print(1), best of {args.repeats}", f"{sandbox:.2f} s", "< 0.8 s"],
            ["sandbox cpu_s of 2 processes x 1 s", f"{burned['cpu_s']:.2f} s (wall {burned['wall_s']:.2f} s)", "~2 s"],
            ["schemathesis --checks all", ("clean: " if rc == 0 else f"exit {rc}: ") + summary, "clean"]]
    print(common.table(rows))
    common.save("serving/cli_api", {"help_s": helps, "sandbox_run_s": sandbox, "burn": burned,
                            "schemathesis_rc": rc, "schemathesis": out[-4000:]})


if __name__ == "__main__":
    sys.exit(main())
