"""What the flows publish beside their results: Prefect artifacts (tasks/artifacts.py: keys,
tables, the training progress) and MLflow dataset inputs and system metrics (tasks/tracking/runs.py).

The pure parts are checked against independent statements over generated cases; the artifacts
themselves are created in flows under Prefect's test harness and read back through its API, the
MLflow inputs in a real sqlite tracking store.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from pathlib import Path

import pytest

from tasks.artifacts import (EVAL_COLUMNS, artifact_key, publish_eval_table, publish_training_metrics,
                             training_metrics_table, training_progress)


def test_artifact_keys_are_always_valid_and_keep_the_words():
    rng = random.Random(0)
    alphabet = "abcXYZ019-_. /:@"
    for _ in range(500):
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12))) for _ in range(rng.randrange(1, 4))]
        key = artifact_key(*parts)
        words = re.findall(r"[a-z0-9]+", "-".join(parts).lower())
        if words:
            assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key), (parts, key)
        assert re.findall(r"[a-z0-9]+", key) == words  # nothing lost, nothing added


def test_training_metrics_table_matches_an_independent_statement():
    rng = random.Random(1)
    names = ["reward_mean", "kl", "pg_loss", "env_error_rate"]
    for _ in range(200):
        history = [(rng.randrange(8), {k: rng.random() for k in rng.sample(names, rng.randrange(1, 4))})
                   for _ in range(rng.randrange(0, 12))]
        table = training_metrics_table(history)
        steps = sorted({s for s, _ in history})
        assert [r["step"] for r in table] == steps
        kept = [[m for s, m in history if s == step][-1] for step in steps]  # the last entry of a step wins
        for row, last in zip(table, kept):
            for name in names:
                if any(name in m for m in kept):  # a column for every metric of a kept entry
                    expected = round(last[name], 4) if name in last else None
                    assert row[name] == expected
                else:
                    assert name not in row


def test_progress_rejects_a_step_outside_the_run():
    with pytest.raises(ValueError, match="step 5 is outside 0..4"):
        training_progress(5, 5, {})


# -- MLflow: dataset inputs and system metrics ---------------------------------------------------
def test_training_run_logs_its_datasets_and_system_metrics(warehouse):
    import mlflow
    from mlflow import MlflowClient

    from prompt_r1.config.experiment import load_config
    from prompt_r1.evaluation.questions import select_questions
    from prompt_r1.data.ingest import ingest
    from prompt_r1.data.pool import TrainingPool
    from tasks.tracking.runs import log_datasets, setup_mlflow, start_training_run

    ingest(warehouse, [Path("data/sample")])
    cfg = load_config("configs/smoke.yaml", {"data": {"validation_fraction": 0.25}})
    reseeded = cfg.model_copy(update={"seed": cfg.seed + 1})
    setup_mlflow(cfg.name)
    mlflow.set_system_metrics_sampling_interval(0.5)
    mlflow.set_system_metrics_samples_before_logging(1)
    try:
        runs = []
        for c in (cfg, reseeded):
            with start_training_run(run_name="t") as run:
                counts = log_datasets(warehouse, c, "training")
                counts.update(log_datasets(warehouse, c, "evaluation"))
                time.sleep(2.0)  # a few system-metric samples
            runs.append(MlflowClient().get_run(run.info.run_id))
    finally:
        mlflow.set_system_metrics_sampling_interval(None)
        mlflow.set_system_metrics_samples_before_logging(None)
    pool = TrainingPool.load(warehouse, cfg)
    train, val = pool.train, pool.validation
    suite = select_questions(warehouse, cfg.eval.suites, cfg.eval.limit_per_dataset)
    assert counts == {"training": len(train), "validation": len(val), f"suite:{cfg.eval.suites[0]}": len(suite)}
    digests = []
    for run in runs:
        inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
        assert sorted(inputs) == sorted(f"smoke/{n}" for n in counts)
        contexts = {n: {t.key: t.value for t in i.tags}["mlflow.data.context"] for n, i in inputs.items()}
        assert contexts == {"smoke/training": "training", "smoke/validation": "validation",
                            "smoke/suite:sample": "evaluation"}
        rows = {n: json.loads(i.dataset.profile)["num_rows"] for n, i in inputs.items()}
        assert rows == {f"smoke/{n}": k for n, k in counts.items()}
        assert all(json.loads(i.dataset.source)["uri"].endswith("warehouse.duckdb") for i in inputs.values())
        digests.append({n: i.dataset.digest for n, i in inputs.items()})
        assert any(k.startswith("system/cpu") for k in run.data.metrics), sorted(run.data.metrics)
    # another seed shuffles another pool: other training digests; the evaluation suite is the same
    assert digests[0]["smoke/training"] != digests[1]["smoke/training"]
    assert digests[0]["smoke/suite:sample"] == digests[1]["smoke/suite:sample"]


def test_log_datasets_rejects_an_unknown_purpose(warehouse):
    from prompt_r1.config.experiment import load_config
    from tasks.tracking.runs import log_datasets

    with pytest.raises(ValueError, match="purpose must be `training` or `evaluation`, not 'tuning'"):
        log_datasets(warehouse, load_config("configs/smoke.yaml"), "tuning")


# -- against a Prefect API ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def _artifacts(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))

    return asyncio.run(read())


def _data(artifact):
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


RESULTS = [
    {"env_name": "tiny-env", "method": m, "dataset": d, "primary_metric": "em", "n": 8, "score": s,
     "ci_low": s - 0.125, "ci_high": min(1.0, s + 0.1251), "em": s, "f1": s, "substring": s, "ssim": s,
     "errors": e, "env_prompt_tokens": 40, "env_completion_tokens": 12, "cost_usd": 0.0}
    for m, d, s, e in [("direct", "nq", 0.5, 0), ("agent:trained", "nq", 0.625, 1), ("direct", "hotpotqa", 0.25, 0)]
]


@pytest.mark.slow  # the harness starts a Prefect server: about a minute on a loaded machine
def test_eval_table_and_report_artifacts(prefect_api):
    from prefect import flow

    @flow
    def publish():
        return publish_eval_table(RESULTS, key="eval-Smoke")

    publish()
    (table,) = _artifacts("eval-smoke")
    rows = _data(table)
    assert table.type == "table" and len(rows) == len(RESULTS)
    assert all(list(r) == list(EVAL_COLUMNS) for r in rows)
    by_cell = {(r["method"], r["dataset"]): r for r in rows}
    assert by_cell[("agent:trained", "nq")]["ci_high"] == 0.7501 and by_cell[("agent:trained", "nq")]["errors"] == 1
    assert by_cell[("direct", "hotpotqa")]["ci_low"] == 0.125
    (report,) = _artifacts("eval-smoke-report")
    assert report.type == "markdown" and "62.5 [50.0, 75.0] (1 err)" in report.data


@pytest.mark.slow
def test_training_progress_is_one_artifact_per_flow_run_then_the_metrics_table(prefect_api):
    from prefect import flow

    @flow
    def train(total: int, start: int):
        ids = {training_progress(step, total, {"reward_mean": step / 10}, key="progress-t") for step in
               range(start, total)}
        publish_training_metrics([(step, {"reward_mean": step / 10, "kl": 0.01}) for step in range(start, total)],
                                 key="metrics-t")
        return ids

    first, resumed = train(4, 0), train(4, 2)  # a resumed run is a new flow run
    assert len(first) == len(resumed) == 1 and first != resumed
    progress = sorted(_artifacts("progress-t"), key=lambda a: a.created)
    assert len(progress) == 2 and all(a.type == "progress" for a in progress)
    assert [float(_data(a)) for a in progress] == [100.0, 100.0]  # updated up to the last step
    assert progress[0].description == "step 4 of 4: reward_mean=0.3"
    latest = max(_artifacts("metrics-t"), key=lambda a: a.created)
    assert _data(latest) == [{"step": 2, "kl": 0.01, "reward_mean": 0.2}, {"step": 3, "kl": 0.01, "reward_mean": 0.3}]
