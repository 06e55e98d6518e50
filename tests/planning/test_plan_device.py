"""`plan` holds `train.device` to the machine it plans for (issue 62 item 9): `cuda:N` fits only a node of
more than N GPUs, `cuda` any node with a GPU, `cpu` and `auto` every machine."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from prompt_r1.config.base import ConfigError
from prompt_r1.config.experiment import Config
from prompt_r1.planning.machine import check_train_device_on
from prompt_r1.planning.memory import Machine


@pytest.mark.parametrize("gpus", range(0, 5))
@pytest.mark.parametrize("device", ["cpu", "auto", "cuda", "cuda:0", "cuda:1", "cuda:3", "cuda:7"])
def test_a_device_index_must_exist_on_the_planned_node(gpus, device) -> None:
    cfg = Config.model_validate({"train": {"device": device}})
    index = int(device.split(":")[1]) if ":" in device else 0
    fits = not device.startswith("cuda") or index < gpus
    if fits:
        check_train_device_on(cfg, Machine(gpus_per_node=gpus))
    else:
        with pytest.raises(ConfigError, match=rf"train.device is '{device}'"):
            check_train_device_on(cfg, Machine(gpus_per_node=gpus))


def test_the_plan_command_refuses_it_with_exit_2() -> None:
    from prompt_r1.cli import app

    result = CliRunner().invoke(app, ["plan", "-c", "configs/paper.yaml", "--gpus-per-node", "2", "--set",
                                      "train.device=cuda:5"])
    assert result.exit_code == 2 and "train.device is 'cuda:5'" in " ".join(result.output.split()), result.output
