"""A fine-tuning method run by test_resume.py in a process of its own, so the test can kill it
with SIGKILL mid-run: `python resume_child.py METHOD MODEL_DIR ROOT [RESUME_DIR]`. It writes a
checkpoint after every step into ROOT/ckpt-NNNN/ (the file `whole` beside it once written, as
the worker records a checkpoint only once written) and the result as ROOT/result.json."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gymloop.finetune.job import Hyper, JobRun, Progress
from gymloop.finetune.methods import METHODS

WORDS = ["ab", "cd", "ef", "gh", "ij", "kl"]


def rows(method: str) -> list[dict]:
    if method == "supervised":
        return [{"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1] * 2}]}
                for w in WORDS]
    if method == "dpo":
        return [{"input": {"messages": [{"role": "user", "content": w}]},
                 "preferred_output": [{"role": "assistant", "content": w}],
                 "non_preferred_output": [{"role": "assistant", "content": w[::-1] + "x"}]} for w in WORDS]
    return [{"messages": [{"role": "user", "content": w}], "answer": w[0]} for w in WORDS]


GRADER = {"type": "string_check", "name": "first", "operation": "like",
          "input": "{{sample.output_text}}", "reference": "{{item.answer}}"}


def main(method: str, model_dir: str, root: str, resume: str | None) -> None:
    torch.set_num_threads(1)
    root_p = Path(root)

    def on_checkpoint(step: int, metrics: dict, write) -> None:
        path = root_p / f"ckpt-{step:04d}"
        write(path)
        (path / "whole").write_text("")

    hp = Hyper(n_epochs=2, batch_size=2, learning_rate=2e-2, group_size=4, max_new_tokens=3, eval_samples=2)
    run = JobRun(start_model=Path(model_dir), resume=Path(resume) if resume else None, rows=rows(method),
                 valid_rows=None, hp=hp, seed=3, root=root_p, grader=GRADER if method == "reinforcement" else None)
    out = METHODS.impl(method)(run, Progress(lambda m: None, on_checkpoint, lambda: None, checkpoint_every=1))
    (root_p / "result.json").write_text(json.dumps({"final": str(out["final"]), "step": out["step"]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
