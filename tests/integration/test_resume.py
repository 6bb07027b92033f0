"""Kill -9 mid-run and resume, through the one state format (trainer/state.py): GRPO through
`gymloop train --resume`, SFT, DPO and RFT through the fine-tuning methods as the worker runs
them. Each resumed run ends at the same weights as an uninterrupted one, bit for bit."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import eventually
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parents[1]          # tests/, where resume_child.py is
ENV = {**os.environ, "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}


def _weights(model_dir: Path) -> dict:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    assert files, f"no weights in {model_dir}"
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def _assert_same(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not (wa[k] == wb[k]).all()]
    assert different == [], f"{len(different)} tensors differ, e.g. {different[:3]}"


def _kill_when(proc: subprocess.Popen, ready, timeout_s: float = 300) -> None:
    """SIGKILL `proc` as soon as `ready()` holds (a checkpoint it wrote); fail if it ended first."""
    eventually(ready, timeout_s, "a checkpoint appears", every_s=0.02,
               unless=lambda: proc.poll() is not None
               and f"the run ended before it was killed:\n{proc.stderr.read().decode()[-2000:]}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("method", ["supervised", "dpo", "reinforcement"])
def test_a_fine_tuning_method_killed_mid_run_resumes_to_the_same_weights(method, tiny_model_dir, tmp_path):
    child = [sys.executable, str(HERE / "resume_child.py"), method, str(tiny_model_dir)]
    whole = tmp_path / "whole"
    subprocess.run([*child, str(whole)], check=True, env=ENV, capture_output=True)
    total = json.loads((whole / "result.json").read_text())["step"]
    assert total == 6                            # 6 rows, batch 2, 2 epochs

    cut = tmp_path / "cut"
    proc = subprocess.Popen([*child, str(cut)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _kill_when(proc, lambda: (cut / "ckpt-0002" / "whole").exists())
    done = sorted(p for p in cut.glob("ckpt-*") if (p / "whole").exists())
    assert 2 <= int(done[-1].name[5:]) < total and not (cut / "result.json").exists()
    subprocess.run([*child, str(cut), str(done[-1])], check=True, env=ENV, capture_output=True)
    _assert_same(Path(json.loads((whole / "result.json").read_text())["final"]),
                 Path(json.loads((cut / "result.json").read_text())["final"]))


def test_gymloop_train_killed_mid_run_resumes_to_the_same_weights(tiny_model_dir, tmp_path, capsys):
    cfg = {"model": str(tiny_model_dir), "env": {"name": "arith"}, "seed": 5, "checkpoint_every": 1,
           "sampling": {"max_new_tokens": 4}, "eval": {"tasks": 4, "max_new_tokens": 4},
           "grpo": {"steps": 6, "prompts_per_step": 2, "group_size": 4, "lr": 2e-2, "drop_zero_signal": False}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    train = [sys.executable, "-m", "gymloop.cli", "train", str(path), "--quiet"]

    subprocess.run([*train, "--run-dir", str(tmp_path / "whole")], check=True, env=ENV, capture_output=True)
    (whole,) = (tmp_path / "whole").iterdir()

    proc = subprocess.Popen([*train, "--run-dir", str(tmp_path / "cut")], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    steps = lambda: list((tmp_path / "cut").glob("*/checkpoints/step-*/train_state.pt"))  # noqa: E731
    _kill_when(proc, lambda: any(int(p.parent.name[5:]) >= 2 for p in steps()))
    (cut,) = (tmp_path / "cut").iterdir()
    assert not (cut / "checkpoint").exists()
    out = subprocess.run([*train, "--run-dir", str(tmp_path / "again"), "--resume", str(cut)],
                         env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    (again,) = (tmp_path / "again").iterdir()
    _assert_same(whole / "checkpoint", again / "checkpoint")
    first, resumed = (json.loads((d / "summary.json").read_text()) for d in (whole, again))
    assert resumed["steps"] == first["steps"] == 6
    for key in ("base", "final"):           # the base is the interrupted run's, carried in the state
        assert {k: v for k, v in resumed[key].items() if k != "seconds"} == \
               {k: v for k, v in first[key].items() if k != "seconds"}
    assert resumed["tokens_generated"] == first["tokens_generated"]
    # a finished run has nothing to resume (asked in this process: it fails before any training)
    from gymloop.cli import main

    assert main(["train", str(path), "--quiet", "--resume", str(whole)]) != 0
    assert "nothing to resume" in capsys.readouterr().err
