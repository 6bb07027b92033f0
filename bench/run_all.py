"""`make bench`: every benchmark under bench/<group>/ that declares itself with a top-level
`BENCH = {"results": ..., "minutes": ..., "measures": ...}`, each printing its tables and
writing its results file under bench/results/<group>/<name>/; then bench/render.py renders the
README tables from those files (commit both).

    python -m bench.run_all [--only GROUP_OR_NAME ...] [--max-minutes N] [--list]
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
# Tests that need the bench extra (TRL): skipped by `make test`, run here before the benchmarks.
TESTS = ["tests/integration/test_dpo_vs_trl.py"]


def declared() -> dict[str, dict]:
    """module (bench.group.name) -> its BENCH declaration, read without importing it."""
    found = {}
    for path in sorted(HERE.glob("*/*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["BENCH"]:
                found["bench." + ".".join(path.relative_to(HERE).with_suffix("").parts)] = ast.literal_eval(node.value)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="groups (engines) or benches (engines.gemm)")
    ap.add_argument("--max-minutes", type=float, default=None, help="skip benches declared longer than this")
    ap.add_argument("--list", action="store_true", help="list the benches and stop")
    args = ap.parse_args()
    benches = {m: b for m, b in declared().items()
               if (not args.only or any(m == f"bench.{o}" or m.startswith(f"bench.{o}.") for o in args.only))
               and (args.max_minutes is None or b["minutes"] <= args.max_minutes)}
    if args.list:
        for m, b in benches.items():
            print(f"{m:32s} ~{b['minutes']:>3} min  {b['measures']}")
        return 0
    failed = []
    if not args.only:
        print("=== tests against TRL ===", flush=True)
        if subprocess.call([sys.executable, "-m", "pytest", "-q", *TESTS], cwd=ROOT) != 0:
            failed.append(" ".join(TESTS))
    for module, bench in benches.items():
        print(f"\n=== {module}: {bench['measures']} (~{bench['minutes']} min) ===", flush=True)
        if subprocess.call([sys.executable, "-m", module], cwd=ROOT) != 0:
            failed.append(module)
    # the README tables follow the results files just written (commit both)
    subprocess.call([sys.executable, "-m", "bench.render"], cwd=ROOT)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
