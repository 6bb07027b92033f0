"""`make bench`: every benchmark, each printing its own tables and writing its results file under
bench/results/; then bench/render.py renders the README tables from those files."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = ["engine_bench.py", "engine_dtype_bench.py", "train_bench.py", "sandbox_bench.py", "gym_bench.py", "serve_bench.py",
           "cli_api_bench.py", "weight_sync_bench.py", "sharding_bench.py", "async_bench.py", "episodes_bench.py",
           "tools_grpo.py", "grpo_vs_trl.py", "recipe_ablation.py", "algorithms_bench.py", "smollm2_grpo.py",
           "finetune_api_bench.py", "finetune_vs_trl.py", "gemm_bench.py", "swe_bench.py", "n_group_bench.py",
           "fleet_bench.py", "sft_memory_bench.py"]
# Tests that need the bench extra (TRL): skipped by `make test`, run here before the benchmarks.
TESTS = ["tests/test_dpo_vs_trl.py"]

if __name__ == "__main__":
    failed = []
    print("=== tests against TRL ===", flush=True)
    if subprocess.call([sys.executable, "-m", "pytest", "-q", *TESTS], cwd=HERE.parent) != 0:
        failed.append(" ".join(TESTS))
    for script in SCRIPTS:
        print(f"\n=== {script} ===", flush=True)
        if subprocess.call([sys.executable, str(HERE / script)], cwd=HERE) != 0:
            failed.append(script)
    # the README tables follow the results files just written (commit both)
    subprocess.call([sys.executable, str(HERE / "render.py")], cwd=HERE.parent)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        sys.exit(1)
