"""Fine-tuning step speed of this checkout against another commit, in one process, alternating
the two (on a shared CPU single timings swing 2x from minute to minute; a ratio measured this way
holds).

    python -m bench.learning.finetune_ab --against HEAD~1 [--repeats 7] [--case SFT DPO ...] [--model nano]

The other commit's `src/gymloop` is unpacked (git archive) into a temporary directory as the
package `gymloop_ab` (gymloop imports itself relatively), and both run one epoch of the same rows
through `finetune.methods.train_tokens`, as API jobs do. Prints ms per step (median over repeats,
steps 2..N) and the speed-up per case, with each repeat's ratio, and whether every run of both
sides ended at the same weights (a refactor that keeps the arithmetic does).
"""
from __future__ import annotations

BENCH = {"results": "learning/finetune_ab", "minutes": 20,
         "measures": ("(`--against COMMIT`) fine-tuning step time of this checkout against another commit, both in one "
                      "process, alternating, per case: the way to tell whether a change made training faster on a noisy"
                      " CPU")}   # found by bench/run_all.py

import argparse
import hashlib
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench import common
import torch

from bench.learning.finetune_vs_trl import CASES, ours, rows
from gymloop.bases.registry import resolve_model

ROOT = Path(__file__).resolve().parents[1]


def other_package(commit: str) -> object:
    """The `finetune.methods` module of `commit`, imported as gymloop_ab."""
    where = Path(tempfile.mkdtemp())
    blob = subprocess.run(["git", "archive", commit, "src/gymloop"], cwd=ROOT, check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(blob)).extractall(where, filter="data")
    (where / "src" / "gymloop").rename(where / "gymloop_ab")
    sys.path.insert(0, str(where))
    return importlib.import_module("gymloop_ab.finetune.methods")


def weights_hash(model_dir: Path) -> str:
    """A hash of every tensor of a saved model, in name order."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        w = load_file(f)
        for k in sorted(w):
            h.update(k.encode() + w[k].contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", required=True, help="the commit to compare with (HEAD~1, a sha)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--case", nargs="*", choices=list(CASES), default=list(CASES))
    ap.add_argument("--model", default="nano", help="a registry name (nano, nano:seed=1, smollm2)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sides = {args.against: other_package(args.against), "this checkout": importlib.import_module("gymloop.finetune.methods")}
    model_dir = resolve_model(args.model, progress=False)
    data = rows(args.steps * args.batch)
    table = [["case", f"{args.against} ms/step", "this checkout ms/step", "speed-up", "per-repeat ratios",
              "same weights"]]
    out = []
    for case in args.case:
        method, system = CASES[case]
        sec: dict[str, list[float]] = {k: [] for k in sides}
        finals: dict[str, list[Path]] = {k: [] for k in sides}
        for i in range(args.repeats):
            for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):     # alternate which runs first
                s, _ = ours(method, model_dir, data, args.batch, 1e-3, None, system, methods=sides[k], final=finals[k])
                sec[k].append(s / (args.steps - 1))                      # steps 2..N
        # the same rows, seed and steps: a change that keeps the trainer's arithmetic gives equal weights
        same = len({weights_hash(d) for k in sides for d in finals[k]}) == 1
        old, new = (statistics.median(v) for v in sec.values())
        ratios = [a / b for a, b in zip(*sec.values())]
        table.append([case, f"{old * 1e3:.2f}", f"{new * 1e3:.2f}", f"{old / new:.3f}x",
                      " ".join(f"{r:.2f}" for r in ratios), "yes" if same else "no"])
        out.append({"case": case, "against_seconds": sec[args.against], "this_seconds": sec["this checkout"],
                    "speedup": old / new, "same_weights": same})
        print(common.table(table[:1] + table[-1:], record=False), flush=True)
    print(f"\nfine-tuning step time, this checkout vs {args.against} ({args.model}, batch {args.batch}, "
          f"{args.steps} steps, median of {args.repeats}, alternating, 1 thread)")
    print(common.table(table))
    common.save("learning/finetune_ab", {"args": vars(args), "results": out})


if __name__ == "__main__":
    sys.exit(main())
