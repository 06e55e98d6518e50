"""A rollout actor killed from outside past `rollout.actor_restarts` (issue 62 item 15) is `ProcessesDied`:
exit 3 with one message naming the actor, the setting and `train --resume`, never two tracebacks. An
actor that raised, or whose constructor failed, keeps its `ActorCallError` (that may be a bug)."""

from __future__ import annotations

import types

import pytest
import ray.exceptions
from typer.testing import CliRunner

from prompt_r1.cluster.actor_group import ActorCallError
from prompt_r1.config.experiment import parse_config
from prompt_r1.core.failures import ProcessesDied
from prompt_r1.rollout.pool import RolloutPool


def _pool(restarts: int, restartable: bool = True):
    cfg = parse_config({"rollout": {"actor_restarts": restarts}})
    return types.SimpleNamespace(cfg=cfg, restartable=restartable)


class _InitFailed(ray.exceptions.ActorDiedError):
    """A dead actor whose constructor raised (Ray says so by `actor_init_failed`)."""

    @property
    def actor_init_failed(self) -> bool:
        return True


def _died(init_failed: bool = False) -> ray.exceptions.RayActorError:
    return _InitFailed() if init_failed else ray.exceptions.ActorDiedError()


@pytest.mark.parametrize("n_dead", [1, 2, 3])
@pytest.mark.parametrize("restarts,restartable", [(0, True), (2, True), (1, False)])
def test_actors_killed_from_outside_end_as_processes_died(n_dead, restarts, restartable) -> None:
    errors = {i: _died() for i in range(n_dead)}
    err = ActorCallError("rollout engine 0 died during rolling out 2 questions", list(errors), errors)
    with pytest.raises(ProcessesDied, match=rf"not a bug.*rollout.actor_restarts is {restarts}.*train --resume"):
        RolloutPool._raise_if_killed(_pool(restarts, restartable), err, restarted=restarts)


@pytest.mark.parametrize("errors", [
    {0: ray.exceptions.RayTaskError("rollout", "Traceback ...", ValueError("a bug"))},
    {0: _died(init_failed=True)},
    {0: _died(), 1: ray.exceptions.RayTaskError("rollout", "Traceback ...", KeyError("x"))},
], ids=["raised", "constructor", "mixed"])
def test_other_actor_failures_keep_their_error(errors) -> None:
    err = ActorCallError("failed", list(errors), errors)
    RolloutPool._raise_if_killed(_pool(0), err, restarted=0)  # returns: the caller re-raises the ActorCallError


def test_the_command_line_exits_3_without_a_traceback(monkeypatch) -> None:
    from prompt_r1 import api
    from prompt_r1.cli import app

    def killed(*args, **kwargs):
        raise ProcessesDied("rollout engine 0 died; rollout.actor_restarts is 0: raise it, or `train --resume`")
    monkeypatch.setattr(api, "train", killed)
    result = CliRunner().invoke(app, ["train", "-c", "configs/smoke.yaml"])
    assert result.exit_code == 3 and "processes died" in result.output and "train --resume" in result.output
    assert "Traceback" not in result.output
