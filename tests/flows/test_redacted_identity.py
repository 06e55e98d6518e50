"""MLflow's record of a run (params, the resolved config artifacts) never holds an environment URL's
credentials (issue 62 item 13), in the main environment, a training pool or an evaluation list."""

from __future__ import annotations

import json

import pytest

from prompt_r1.config.experiment import parse_config

PASSWORD, QUERY_KEY = "pw-CANARY-0123456789", "qk-CANARY-9876543210"
URL = f"https://probeuser:{PASSWORD}@gw.example/v1?key={QUERY_KEY}"


@pytest.mark.parametrize("section", ["environment", "eval", "pool"])
def test_run_identity_is_logged_without_url_credentials(home, tmp_path, section) -> None:
    import mlflow

    from tasks.tracking.runs import log_run_identity, setup_mlflow

    env = {"name": "gw", "kind": "openai", "model": "m", "base_url": URL}
    data = {"environment": {"environment": env}, "eval": {"eval": {"environments": [env]}},
            "pool": {"train": {"environments": [{**env, "weight": 1.0}]}}}[section]
    cfg = parse_config(data)
    setup_mlflow("redact")
    with mlflow.start_run() as run:
        log_run_identity(cfg, "evaluate", {})
    client = mlflow.MlflowClient()
    stored = json.dumps(client.get_run(run.info.run_id).data.params)
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="config", dst_path=str(tmp_path))
    texts = [stored] + [p.read_text() for p in sorted((tmp_path / "config").iterdir())]
    for text in texts:
        assert PASSWORD not in text and QUERY_KEY not in text
    assert "probeuser:***@gw.example" in stored
    assert local
