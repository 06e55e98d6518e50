"""A rollout actor killed with -9 is restarted by Ray and only its share of the batch is redone.

Two actors sample at temperature 1 (draws seeded per question, sample and turn: `policy.hf` gives
each row its own generator) after a weight broadcast, against a real tiny transformers
environment that takes a second per reply and logs which actor process was asked for which episode.
The batch is two questions whose episodes call the environment (`calling_batch`).
One actor is killed in the middle of a batch, the other between batches: each time the batch
equals the one rolled out before any kill (so the restarted actor loaded the broadcast weights,
not the ones it was built with), only the dead actor's questions were asked again, and
`restarts` counts the restarts. With `rollout.actor_restarts` 0 a death fails the batch as before.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.rollout import test_pool
from tests.rollout.test_pool import EchoModelEnv, questions, smoke_cfg

ray = pytest.importorskip("ray")
local_ray = test_pool.local_ray  # the same local Ray, once per module


class SlowLoggedEnv(EchoModelEnv):
    """The tiny model as environment, logging each call as (actor pid, question) when it arrives,
    then taking 1 s to reply: an actor seen in the log is still busy for that second, so a kill
    lands inside its batch however loaded the machine is."""

    def __init__(self, env_cfg, log: str):
        super().__init__(env_cfg)
        self.log = log

    async def reply(self, messages, turn=0):
        import asyncio

        with open(self.log, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "text": messages[-1]["content"][-60:]}) + "\n")
        await asyncio.sleep(1.0)
        return await super().reply(messages, turn)


def perturbed_update(model_path: str, version: int):
    from transformers import AutoModelForCausalLM

    from prompt_r1.core.weights import WeightUpdate

    torch.manual_seed(version)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))  # small: the agent still calls the environment
    return WeightUpdate.make(version, "full", model.state_dict())


def same(a, b) -> bool:
    return [(t.question_id, t.group_index, t.token_ids, t.policy_version) for t in a] == \
        [(t.question_id, t.group_index, t.token_ids, t.policy_version) for t in b]


def kill_when_busy(pool, index: int, log: Path, timeout_s: float = 60.0) -> int:
    """kill -9 actor `index` once its environment has been asked for one reply of the running batch."""
    pid = pool.placements[index]["pid"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and any(json.loads(line)["pid"] == pid for line in log.read_text().splitlines()):
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.1)
    raise AssertionError(f"actor {index} was asked nothing within {timeout_s}s")


@pytest.fixture(scope="module")
def protocol_model(_model_cache):
    """The smoke agent: a tiny model warm-started on the protocol's format, so it calls the environment."""
    from prompt_r1.models.bundled import resolve_model

    return str(resolve_model("tiny-protocol"))


@pytest.fixture
def reply_log(tmp_path):
    for module in (sys.modules[__name__], test_pool):  # the actors unpickle the env class by value
        ray.cloudpickle.register_pickle_by_value(module)
    return tmp_path / "replies.jsonl"


def logged_env(log: Path):
    return functools.partial(SlowLoggedEnv, log=str(log))


def calling_batch(pool, step: int, log: Path):
    """Two questions (one per actor) whose episodes call the environment at `step` under the pool's
    weights: whether a sampled episode calls depends on the draws, and a share that never calls
    gives the kill nothing to wait for. Found by rolling out every candidate once."""
    candidates = questions(5)
    probe = pool.rollout(candidates, step=step)
    calling = [q for q in candidates if any(t.env_calls for t in probe if t.question_id == q.question_id)]
    assert len(calling) >= 2, [(t.question_id, len(t.env_calls)) for t in probe]
    log.unlink(missing_ok=True)
    return calling[:2]


def test_a_killed_actor_is_restarted_and_redoes_only_its_share(local_ray, protocol_model, reply_log):
    from concurrent.futures import ThreadPoolExecutor

    from prompt_r1.rollout.pool import RolloutPool

    cfg = smoke_cfg(model="tiny-protocol", temperature=1.0)
    with RolloutPool(cfg, protocol_model, 2, env_factory=logged_env(reply_log)) as pool:
        pool.broadcast(perturbed_update(protocol_model, 1))
        batch = calling_batch(pool, 3, reply_log)  # one question (two episodes) per actor
        expected = pool.rollout(batch, step=3)
        assert {t.policy_version for t in expected} == {1} and len(expected) == 4
        assert any(t.env_calls for t in expected[:2]) and any(t.env_calls for t in expected[2:])
        first_pids = [where["pid"] for where in pool.placements]
        reply_log.unlink()

        with ThreadPoolExecutor(1) as background:  # killed in the middle of the batch
            running = background.submit(pool.rollout, batch, 3)
            killed = kill_when_busy(pool, 1, reply_log)
            got = running.result(timeout=300)
        assert killed == first_pids[1] and pool.restarts == 1
        assert same(got, expected)
        assert pool.placements[1]["pid"] != killed and pool.placements[0]["pid"] == first_pids[0]
        replies = [json.loads(line) for line in reply_log.read_text().splitlines()]
        survivor = [r for r in replies if r["pid"] == first_pids[0]]
        redone = [r for r in replies if r["pid"] == pool.placements[1]["pid"]]
        before_kill = [r for r in replies if r["pid"] == killed]
        # the survivor asked each of its episodes' calls once: as many as in its share of `got`
        assert len(survivor) == sum(len(t.env_calls) for t in got[:2])
        assert len(redone) == sum(len(t.env_calls) for t in got[2:]) and before_kill  # the dead share, again

        os.kill(pool.placements[0]["pid"], signal.SIGKILL)  # between batches: Ray restarts it while idle
        time.sleep(3)
        assert same(pool.rollout(batch, step=3), expected)
        assert pool.restarts == 2


def test_without_restarts_a_dead_actor_fails_the_batch_naming_it(local_ray, protocol_model, reply_log):
    from concurrent.futures import ThreadPoolExecutor

    from prompt_r1.cluster.actor_group import ActorCallError
    from prompt_r1.core.failures import ProcessesDied
    from prompt_r1.rollout.pool import RolloutPool

    cfg = smoke_cfg(model="tiny-protocol", temperature=1.0)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"actor_restarts": 0})})
    with RolloutPool(cfg, protocol_model, 2, env_factory=logged_env(reply_log)) as pool:
        batch = calling_batch(pool, 0, reply_log)
        with ThreadPoolExecutor(1) as background:
            running = background.submit(pool.rollout, batch, 0)
            killed = kill_when_busy(pool, 0, reply_log)
            # a killed process is no bug: ProcessesDied (exit 3, no traceback) naming the actor, the setting, the resume
            with pytest.raises(ProcessesDied, match=rf"rollout engine 0 \(node [^,]+, pid {killed}\) died during"
                                                    r".*rollout.actor_restarts is 0.*train --resume") as err:
                running.result(timeout=300)
            assert isinstance(err.value.__cause__, ActorCallError)
        assert pool.restarts == 0
