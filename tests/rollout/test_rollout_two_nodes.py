"""Rollouts and training on a two-node Ray cluster simulated on one machine (`ray.cluster_utils.Cluster`).

Each rollout actor has its own placement group, so two actors of one CPU each on two nodes of one
CPU each must land one per node; the trajectories must equal those of a single-node run with the
same seed (the transformers backend draws each row from seeds of (run seed, step, question,
sample, turn), so where a question runs never matters). The local reference run is started while
the cluster runs, which `ray.init()` without an address would have joined (Cluster records its
address as the machine's latest), and a pool too big for the cluster fails by its deadline.

A smoke training with a learner group of two ranks spread over both nodes (`train.placement_strategy:
SPREAD`, gloo between the nodes' processes) exports the agent a one-rank run on a local instance
exports.
"""

from __future__ import annotations

import time

import pytest

from prompt_r1.config.experiment import RolloutConfig, load_config
from prompt_r1.core.questions import QuestionRow

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # What `ray.init(address="local")` does before it starts an instance, done before the Cluster
    # starts: token authentication on, with a token. Cluster skips it, and the local instance the
    # test starts afterwards switches this process to token mode, after which the cluster's nodes
    # (without tokens) cancel every actor this driver creates ("cancelled before it started").
    from ray._private.authentication.authentication_token_setup import (enable_token_auth_by_default,
                                                                        ensure_token_if_auth_enabled)

    enable_token_auth_by_default()
    ensure_token_if_auth_enabled(None, create_token_if_missing=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes(timeout=60)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def sampling_config(workers: int, address: str | None = None, timeout_s: float = 300.0):
    cfg = load_config("configs/smoke.yaml")
    return cfg.model_copy(update={
        "seed": 7,
        "agent": cfg.agent.model_copy(update={"model": "tiny", "temperature": 1.0}),
        "rollout": cfg.rollout.model_copy(update={"group_size": 2, "num_workers": workers, "ray_address": address,
                                                  "ray_num_cpus": 2, "actor_start_timeout_s": timeout_s}),
    })


def questions(n: int) -> list[QuestionRow]:
    texts = ["What is the capital of France?", "Who wrote Hamlet?", "How many legs has a spider?",
             "Which planet is largest?"]
    return [QuestionRow(f"q{i}", "sample", "train", texts[i % len(texts)], ["x"], "standard_qa", "f1")
            for i in range(n)]


def run(cfg, model_path) -> tuple[list, list[dict]]:
    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.rollout.pool import RolloutPool

    init_ray(cfg.rollout)
    with RolloutPool(cfg, model_path) as pool:
        return pool.rollout(questions(4), step=3), pool.placements


def view(trajectories) -> list[tuple]:
    return [(t.question_id, t.group_index, t.token_ids, t.logprobs, t.stop_reason, t.reward)
            for t in trajectories]


def test_actors_on_both_nodes_roll_out_what_one_node_does(two_nodes, tiny_model_path, home, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", two_nodes.address)  # `address="local"` must ignore it, and the Cluster
    local, local_places = run(sampling_config(workers=1), tiny_model_path)
    local_node_ids = {n["NodeID"] for n in ray.nodes()}
    ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS")
    assert len(local_node_ids) == 1  # a fresh one-node instance, not the two-node cluster

    spread, places = run(sampling_config(workers=2, address=two_nodes.address), tiny_model_path)
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2 and not nodes & local_node_ids
    assert {p["node_id"] for p in places} == nodes  # one actor on each node
    assert places[0]["pid"] != places[1]["pid"] and local_places[0]["node_id"] in local_node_ids
    assert len(spread) == 4 * 2 and all(t.token_ids for t in spread)
    assert view(spread) == view(local)
    assert len({tuple(t.token_ids) for t in spread}) > 4  # sampled (temperature 1), not one greedy answer


def test_a_pool_bigger_than_the_cluster_fails_by_its_deadline_and_frees_what_it_placed(two_nodes, tiny_model_path):
    from prompt_r1.cluster.placement import PlacementError
    from prompt_r1.cluster.connect import init_ray
    from prompt_r1.rollout.pool import RolloutPool

    cfg = sampling_config(workers=3, address=two_nodes.address, timeout_s=3.0)  # 3 actors x 1 CPU, 2 CPUs
    init_ray(cfg.rollout)
    started = time.monotonic()
    with pytest.raises(PlacementError) as caught:
        RolloutPool(cfg, tiny_model_path)
    elapsed = time.monotonic() - started
    assert 3 <= elapsed < 12, elapsed  # a cluster may grow: it waits for the deadline, then fails
    message = str(caught.value)
    assert "within 3s (rollout.actor_start_timeout_s)" in message and "3 x {CPU: 1}" in message, message
    assert "2 placed" in message and "missing: 1 CPU" in message
    assert "rollout.num_workers" in message and "rollout.cpus_per_worker" in message
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_a_learner_group_over_both_nodes_trains_the_agent_of_one_rank(two_nodes, home, warehouse, monkeypatch):
    from transformers import AutoModelForCausalLM

    from prompt_r1.data.ingest import ingest
    from prompt_r1.learner import ray_group
    from prompt_r1.training.session import TrainingSession

    groups = []
    opened = ray_group.LearnerGroup.__init__

    def recording(self, *args, **kwargs):  # keeps each group, to read where its ranks ran
        opened(self, *args, **kwargs)
        groups.append(self)

    monkeypatch.setattr(ray_group.LearnerGroup, "__init__", recording)
    ingest(warehouse, ["data/sample"])
    agents = {}
    # four questions a step (two groups per rank), no validation rollouts; half a CPU per actor and
    # per rank, so the cluster's 2 CPUs hold the rollout actor beside the ranks
    settings = {"rollout.batch_questions": 4, "data.validation_fraction": 0, "train.dist_timeout_s": 120,
                "rollout.cpus_per_worker": 0.5, "train.cpus_per_rank": 0.5, "rollout.ray_num_cpus": 2}
    for name, layout in [("one-rank-local", {"train.world_size": 1}),
                         ("two-nodes", {"train.world_size": 2, "train.placement_strategy": "SPREAD",
                                        "rollout.ray_address": two_nodes.address})]:
        if ray.is_initialized():
            ray.shutdown()
        cfg = load_config("configs/smoke.yaml", {**settings, **layout})
        with TrainingSession(cfg, warehouse, name, home / "smoke" / name) as session:
            outcome = session.run()
        agents[name] = AutoModelForCausalLM.from_pretrained(outcome.agent).state_dict()
    [group] = groups
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2 and {p["node_id"] for p in group.placements} == nodes  # one rank on each node
    assert group.placements[0]["pid"] != group.placements[1]["pid"]
    diff = max((agents["two-nodes"][k] - agents["one-rank-local"][k]).abs().max().item() for k in agents["two-nodes"])
    assert diff < 1e-5, diff
