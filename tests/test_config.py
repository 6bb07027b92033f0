"""The example configs in configs/ validate as what their first line says they are, and a
trainer-actor setting without Ray is a clear error."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gymloop.config import ClusterConfig, load_config
from gymloop.loop import LoopConfig

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def test_there_are_example_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_validates(path):
    if "gymloop run" in path.read_text().splitlines()[0]:
        cfg = LoopConfig.model_validate(yaml.safe_load(path.read_text()))
    else:
        cfg = load_config(path)
    assert cfg.model == "nano"


def test_trainer_actors_need_the_ray_backend_and_fsdp_needs_two():
    with pytest.raises(ValueError, match="cluster.trainers needs backend: ray"):
        ClusterConfig(trainers=2)
    assert ClusterConfig(backend="ray", trainers=2).trainers == 2
    with pytest.raises(ValueError, match="cluster.fsdp .* needs trainers >= 2"):
        ClusterConfig(backend="ray", trainers=1, fsdp=True)
    assert ClusterConfig(backend="ray", trainers=2, fsdp=True).fsdp
