"""The example configs in configs/ validate as what their first line says they are, and a
trainer-actor setting without Ray is a clear error."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gymloop.config import ClusterConfig, load_config
from gymloop.loop.config import LoopConfig

# the demo's chapters are checked by test_demo_configs.py
CONFIGS = sorted(p for p in (Path(__file__).parents[2] / "configs").glob("*.yaml") if not p.name.startswith("demo-"))


def test_there_are_example_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_validates(path, monkeypatch):
    # checking a config starts nothing: no runtime (a peer's server, a bridge) is needed for it
    for runtime in ("vllm", "openenv", "nemo-gym", "verifiers"):
        monkeypatch.setenv(f"GYMLOOP_{runtime.upper().replace('-', '_')}_PYTHON", "/no/such/python")
    monkeypatch.chdir(Path(__file__).parents[2])       # configs name files of the repository
    if "gymloop run" in path.read_text().splitlines()[0]:
        cfg = LoopConfig.model_validate(yaml.safe_load(path.read_text()))
    else:
        cfg = load_config(path)
    from gymloop.bases.registry import MODELS

    assert cfg.model.partition(":")[0] in MODELS      # a base every machine can build


def test_trainer_actors_need_the_ray_backend_and_fsdp_needs_two():
    with pytest.raises(ValueError, match="cluster.trainers needs backend: ray"):
        ClusterConfig(trainers=2)
    assert ClusterConfig(backend="ray", trainers=2).trainers == 2
    with pytest.raises(ValueError, match="cluster.fsdp .* needs trainers >= 2"):
        ClusterConfig(backend="ray", trainers=1, fsdp=True)
    assert ClusterConfig(backend="ray", trainers=2, fsdp=True).fsdp


def test_cuda_with_a_forked_collector_is_a_clear_error():
    from gymloop.config import TrainConfig

    with pytest.raises(ValueError, match="collector: thread"):
        TrainConfig.model_validate({"device": "cuda", "grpo": {"max_staleness": 1}})
    with pytest.raises(ValueError, match="collector: thread"):
        LoopConfig.model_validate({"device": "cuda", "grpo": {"max_staleness": 1}})
    ok = TrainConfig.model_validate({"device": "cuda", "grpo": {"max_staleness": 1, "collector": "thread"}})
    assert ok.device == "cuda"


def test_device_cuda_without_a_gpu_says_so(tmp_path, tiny_model_dir):
    import torch

    from gymloop.config import TrainConfig
    from gymloop.orchestrator.train import train

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = TrainConfig.model_validate({"model": str(tiny_model_dir), "run_dir": str(tmp_path), "device": "cuda"})
    with pytest.raises(ValueError, match="torch sees no GPU"):
        train(cfg, progress=False, echo=lambda m: None)


def test_a_bad_option_of_a_peer_environment_is_refused_at_check_time():
    from gymloop.config import EnvSpec

    with pytest.raises(ValueError, match="module:Class"):
        EnvSpec(name="nemo_gym", options={"server": "no_colon"})
    with pytest.raises(ValueError, match="unexpected keyword argument 'colour'"):
        EnvSpec(name="verifiers", options={"env": "vf-reverse", "colour": 1})
    with pytest.raises(ValueError, match="needs one of options app"):
        EnvSpec(name="openenv", options={})
