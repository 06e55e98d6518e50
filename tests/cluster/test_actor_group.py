"""`ActorGroup` on a real local Ray: results come back in the order asked, a deadline that passes
names the busy actor, an actor that dies or raises is named with its error, and shutdown asks each
actor's clean-up, kills every process of the group, releases its placement group and is safe to repeat.

The actors are tiny (`Member`): what is tested is the group's waiting and stopping, not a model.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest

from prompt_r1.config.base import ConfigError

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


class Member:
    """Stands in for a rollout engine or a learner rank."""

    def __init__(self, index: int, marker_dir: str = ""):
        self.index, self.marker_dir = index, marker_dir

    def placement(self) -> dict:
        from prompt_r1.cluster.engine_placement import actor_location

        return actor_location()

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.index

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def fail(self, kind: str) -> None:
        if kind == "die":
            os._exit(1)
        if kind == "config":
            raise ConfigError("agent.model is not a folder (a bad input, reported as itself)")
        raise ValueError("boom")

    def shutdown(self) -> None:
        if self.marker_dir:
            Path(self.marker_dir, f"cleaned-{self.index}").touch()


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors build `Member`
    yield
    ray.shutdown()


def members(count: int, marker_dir: Path | str = ""):
    from prompt_r1.cluster.actor_group import ActorGroup

    group = ActorGroup("test actor", name="test group")
    group.start(Member, [(i, str(marker_dir)) for i in range(count)], [{"num_cpus": 0.5}] * count)
    return group


def pids_alive(pids: list[int], within_s: float = 20.0) -> list[int]:
    """The pids still running after up to `within_s` (a killed actor's process takes a moment to go)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def test_results_come_in_the_order_asked_whatever_order_they_finish_in(local_ray):
    with members(3) as group:
        # actor 0 answers last, actor 2 first
        refs = group.call_each("nap", [(1.5,), (0.5,), (0.0,)])
        assert group.gather(refs, "napping", timeout_s=60, field="f") == [0, 1, 2]
        refs = group.call("nap", 0.0)
        assert group.gather(refs[::-1], "napping", timeout_s=60, field="f", indices=[2, 1, 0]) == [2, 1, 0]
        assert group.gather(group.call_each("nap", [(0.0,)]), "napping", timeout_s=60, field="f") == [0]


def test_a_deadline_that_passes_names_the_busy_actor_and_the_setting(local_ray, tmp_path):
    from prompt_r1.cluster.actor_group import ActorWaitError
    from prompt_r1.cluster.connect import RayWaitError

    group = members(2, tmp_path)
    try:
        [where0, where1] = group.locate(60, what="starting", field="f")
        started = time.monotonic()
        with pytest.raises(ActorWaitError) as caught:
            group.gather(group.call_each("nap", [(0.0,), (600.0,)]), "napping", timeout_s=2.0,
                         field="test.nap_timeout_s", fix="nap less")
        waited = time.monotonic() - started
        # Ray's wait may wake a few ms before its own deadline: the point is the deadline, not the 600 s nap
        assert 2.0 - 0.1 <= waited < 2.0 + 8.0, waited
        message = str(caught.value)
        assert message == (f"napping did not finish within 2s (test.nap_timeout_s): no answer from test actor 1 "
                           f"(node {where1['node_ip']}, pid {where1['pid']}); nap less"), message
        assert caught.value.indices == [1] and isinstance(caught.value, RayWaitError) and group.stuck
        pids = [where0["pid"], where1["pid"]]
        stopping = time.monotonic()
        group.shutdown()  # stuck: killed without asking (a clean-up would queue behind the 600 s nap)
        assert time.monotonic() - stopping < 10
        assert list(tmp_path.iterdir()) == [] and pids_alive(pids) == []
    finally:
        group.kill()


def test_an_actor_that_dies_or_raises_is_named_with_its_error(local_ray):
    from prompt_r1.cluster.actor_group import ActorCallError

    with members(2) as group:
        [_, where1] = group.locate(60, what="starting", field="f")
        with pytest.raises(ActorCallError, match=r"^test actor 0 \(node .*\) failed during failing: ValueError: boom$"):
            group.gather([group.actors[0].fail.remote("raise")], "failing", timeout_s=60, field="f")
        with pytest.raises(ConfigError, match="a bad input, reported as itself"):
            group.gather([group.actors[0].fail.remote("config")], "failing", timeout_s=60, field="f")
        # the survivor answers within the grace; the dead one is named as the cause
        refs = [group.actors[0].nap.remote(0.0), group.actors[1].fail.remote("die")]
        started = time.monotonic()
        with pytest.raises(ActorCallError) as caught:
            group.gather(refs, "dying", timeout_s=60, field="f", grace_s=5.0)
        assert time.monotonic() - started < 30
        message = str(caught.value)
        assert caught.value.indices == [1] and isinstance(caught.value.errors[1], ray.exceptions.RayActorError)
        assert message.startswith(f"test actor 1 (node {where1['node_ip']}, pid {where1['pid']}) died during dying "
                                  "(its process exited: "), message
        assert not group.stuck  # an error is no deadline: actor 0 still answers and is asked to clean up
        assert group.gather(group.call_each("nap", [(0.0,)]), "napping", timeout_s=60, field="f") == [0]


def test_shutdown_cleans_up_kills_every_process_releases_the_group_and_repeats_harmlessly(local_ray, tmp_path,
                                                                                          monkeypatch):
    from ray.util import placement_group_table

    from prompt_r1.cluster.actor_group import ActorGroup
    from prompt_r1.cluster.placement import in_group, reserve

    monkeypatch.setenv("HF_HOME", "/driver/hf")  # a driver setting every actor gets (`actor_env_vars`)
    placement = reserve([{"CPU": 0.5}] * 2, what="two members", timeout_s=60, field="f", fix="x")
    group = ActorGroup("test actor", groups=[placement], name="test group")
    group.start(Member, [(i, str(tmp_path)) for i in range(2)],
                [{"num_cpus": 0.5, "scheduling_strategy": in_group(placement, i),
                  "runtime_env": {"env_vars": {"HF_HOME": "/own/hf"} if i else {}}} for i in range(2)])
    try:
        pids = [where["pid"] for where in group.locate(60, what="starting", field="f")]
        # the driver's setting, and an actor's own variable over it
        assert group.gather(group.call("env", "HF_HOME"), "reading", timeout_s=60, field="f") == ["/driver/hf",
                                                                                                  "/own/hf"]
        assert placement_group_table(placement)["state"] == "CREATED"
        group.shutdown()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cleaned-0", "cleaned-1"]  # each actor's own clean-up
        assert pids_alive(pids) == [] and group.actors == [] and group.groups == []
        assert placement_group_table(placement)["state"] == "REMOVED"
        group.shutdown()  # again: nothing left to do, no error
        group.kill()
    finally:
        group.kill()
