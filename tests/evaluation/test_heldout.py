"""Held-out environments, cost per correct answer and the Pareto front, each against an
independent statement: which environments the trained agent's own training run drew (read from
the export it carries), the report's differences recomputed by plain means, cost per correct
from the rows by hand, the front by brute force, and the MLflow tags and metrics read back
through MLflow's client.
"""

from __future__ import annotations

import csv
import random
from itertools import product

import pytest

from prompt_r1.config.experiment import parse_config
from prompt_r1.evaluation.compare import cost_points, pareto_front
from prompt_r1.evaluation.heldout import EnvSplit, environment_split, heldout_comparisons

ENV = {"kind": "inprocess", "max_tokens": 16}


def _brute_front(points):
    """On the front = dominated by no other point (the definition, checked pair by pair)."""
    return [not any(cj <= ci and sj >= si and (cj < ci or sj > si) for j, (cj, sj) in enumerate(points) if j != i)
            for i, (ci, si) in enumerate(points)]


def test_pareto_front_matches_the_brute_force_definition():
    rng = random.Random(0)
    for _ in range(3000):  # small integer grids: many ties in cost, in score and of whole points
        n, grid = rng.randrange(0, 12), rng.choice([2, 3, 5, 100])
        points = [(rng.randrange(grid), rng.randrange(grid) / grid) for _ in range(n)]
        assert pareto_front(points) == _brute_front(points), points
    assert pareto_front([(1.0, 0.5), (1.0, 0.5)]) == [True, True]  # equal points: neither dominates


def _trained_config(pool_envs, own_env):
    return parse_config({"environment": own_env, "train": {"environments": pool_envs}})


def test_an_environment_outside_the_trained_agents_pool_is_held_out(tmp_path):
    """Trained pool {a}, evaluated {a, b}: b is held out. The evaluating config's own pool is {b},
    so the answer must come from the agent's training config, not from the evaluating config."""
    import yaml

    from prompt_r1.config.env import EnvConfig
    from prompt_r1.models.agent_files import TRAINING_CONFIG

    a, b = {"name": "a", "model": "tiny", **ENV}, {"name": "b", "model": "tiny-smollm2", **ENV}
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / TRAINING_CONFIG).write_text(yaml.safe_dump(_trained_config([a], a).model_dump(mode="json")))
    evaluating = parse_config({"environment": b, "eval": {"environments": [a, b]}})
    split = environment_split(evaluating, {"base": "tiny", "trained": str(agent)})
    assert split.held_out == {"a": False, "b": True} and str(agent) in split.source
    # without a trained agent the evaluating config's own pool ({b}) decides
    assert environment_split(evaluating, {"base": "tiny"}).held_out == {"a": True, "b": False}
    # the same name with another model is another environment; price and sampling do not matter
    other = [EnvConfig(**{**a, "model": "tiny-smollm2"}), EnvConfig(**{**a, "price_per_1k_prompt": 1.0,
                                                                     "temperature": 0.7})]
    assert [environment_split(evaluating, {"trained": str(agent)}, [e]).held_out["a"] for e in other] == [True, False]
    from tasks.tracking.registry import _run_config_text  # registration reads the same carried config

    assert _run_config_text(agent) == (agent / TRAINING_CONFIG).read_text()


FOREIGN_CONFIGS = ["base_model: NousResearch/Llama-2-7b-hf\nadapter: qlora\nmicro_batch_size: 2\n",
                   "- a\n- list\n", "", "not: [valid yaml\n", "train:\n  stepz: 3\n"]


def test_another_tools_config_yaml_is_not_taken_for_our_training_config(tmp_path):
    """An axolotl output folder (or any folder) holds a `config.yaml` of its own: without a checkpoint's
    files beside it, it is no training config of ours, and held-out marking falls back to the
    evaluating config's pool, as for a hub model."""
    from prompt_r1.models.agent_files import CHECKPOINT_MARKERS, training_config_file

    a = {"name": "a", "model": "tiny", **ENV}
    evaluating = parse_config({"environment": a})
    for i, text in enumerate(FOREIGN_CONFIGS):
        folder = tmp_path / f"foreign{i}"
        folder.mkdir()
        (folder / "config.yaml").write_text(text)
        (folder / "trainer_state.json").write_text("{}")  # HF Trainer's, not ours
        assert training_config_file(folder) is None
        split = environment_split(evaluating, {"trained": str(folder)})
        assert split.held_out == {"a": False} and "carries no training config" in split.source
    import yaml

    for marker in CHECKPOINT_MARKERS:  # a checkpoint of ours: its config.yaml is the training config
        ckpt = tmp_path / f"step-{marker}"
        ckpt.mkdir()
        (ckpt / "config.yaml").write_text(yaml.safe_dump(_trained_config([a], a).model_dump(mode="json")))
        (ckpt / marker).write_text("{}")
        assert training_config_file(ckpt) == ckpt / "config.yaml"


def test_a_training_config_that_cannot_be_read_stops_evaluate_before_any_work(home, tmp_path, monkeypatch):
    """A carried training config that is broken names the agent and the file, before a model loads or
    a question is asked (it used to come after the whole evaluation, with no report)."""
    from prompt_r1 import api
    from prompt_r1.config.base import ConfigError
    from prompt_r1.evaluation import evaluate as evaluate_module
    from prompt_r1.models.agent_files import TRAINING_CONFIG

    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **k: pytest.fail("the evaluation ran"))
    cfg = parse_config({"environment": {"name": "a", "model": "tiny", **ENV}})
    for i, text in enumerate(FOREIGN_CONFIGS[:2] + FOREIGN_CONFIGS[3:]):
        agent = tmp_path / f"agent{i}"
        agent.mkdir()
        (agent / "config.json").write_text("{}")
        (agent / TRAINING_CONFIG).write_text(text)
        with pytest.raises(ConfigError, match=rf"agent:trained \({agent}\) carries the training config"):
            api.evaluate(cfg, agents=[f"trained={agent}"], warehouse=tmp_path / "wh.duckdb")
        assert not (home / cfg.name).exists()


def test_an_exported_agent_carries_the_pool_it_was_trained_on(tiny_model_path, tmp_path):
    """From a real checkpoint through `export_checkpoint` to the split (grpo_helpers' learner)."""
    from grpo_helpers import make_config

    from prompt_r1.learner.checkpoint import save_checkpoint
    from prompt_r1.models.export import export_checkpoint
    from prompt_r1.learner.grpo_learner import GRPOLearner

    cfg = make_config()
    cfg.train.environments = parse_config({"train": {"environments": [{"name": "a", "model": "tiny", **ENV},
                                                                      {"name": "c", "model": "m2", **ENV}]}}
                                          ).train.environments
    ckpt = save_checkpoint(GRPOLearner(cfg, tiny_model_path), tmp_path / "ckpts", 1, {"position": 1}, cfg)
    export = export_checkpoint(ckpt, tmp_path / "agent")
    evaluating = parse_config({"eval": {"environments": [{"name": n, "model": m, **ENV}
                                                         for n, m in (("a", "tiny"), ("b", "tiny"), ("c", "m2"))]}})
    assert environment_split(evaluating, {"trained": str(export)}).held_out == {"a": False, "b": True, "c": False}


METHODS = ("agent:trained", "agent:base", "direct")


def _predictions(rng):
    """3 environments x 3 methods x 2 datasets x 6 questions, 0/1 scores, one failed call."""
    rows = []
    for env, method, dataset, q in product("abc", METHODS, ("nq", "hotpotqa"), range(6)):
        error = "HTTP 500" if (env, method, dataset, q) == ("b", "direct", "nq", 0) else None
        score = None if error else float(rng.random() < {"agent:trained": 0.7, "agent:base": 0.4, "direct": 0.5}[method])
        rows.append({"env_name": env, "method": method, "dataset": dataset, "question_id": f"{dataset}{q}",
                     "score": score, "error": error, "prediction": str(score)})
    return rows


def _mean(xs):
    return sum(xs) / len(xs)


def _hand_diff(preds, env, method, dataset):
    """Mean per-question difference on the questions both methods scored."""
    by = {(p["method"], p["question_id"]): p for p in preds if p["env_name"] == env and p["dataset"] == dataset}
    qs = [q for (m, q) in by if m == "agent:trained"
          and by[("agent:trained", q)]["score"] is not None and by[(method, q)]["score"] is not None]
    return _mean([by[("agent:trained", q)]["score"] - by[(method, q)]["score"] for q in qs]), len(qs)


def test_heldout_figures_match_a_hand_computation():
    preds = _predictions(random.Random(3))
    split = EnvSplit({"a": False, "b": True, "c": True}, "test")
    rows = heldout_comparisons(preds, split, {"sample": ["nq", "hotpotqa"]})
    got = {(r["method"], r["scope"]): r for r in rows}
    for method in ("agent:base", "direct"):
        per_env = {e: _mean([_hand_diff(preds, e, method, d)[0] for d in ("nq", "hotpotqa")]) for e in "abc"}
        for e in "abc":
            (r,) = [r for r in rows if r["method"] == method and r["scope"] == "env" and r["env_name"] == e]
            assert r["diff"] == pytest.approx(per_env[e]) and r["held_out"] == split.held_out[e]
            assert r["n"] == sum(_hand_diff(preds, e, method, d)[1] for d in ("nq", "hotpotqa"))
            assert r["ci_low"] <= r["diff"] <= r["ci_high"]
        held = got[(method, "held-out mean")]
        assert held["diff"] == pytest.approx(_mean([per_env["b"], per_env["c"]])) and held["env_name"] == "b,c"
        assert got[(method, "trained-on mean")]["diff"] == pytest.approx(per_env["a"])
        worst = got[(method, "held-out worst")]
        assert worst["diff"] == pytest.approx(min(per_env["b"], per_env["c"]))
        assert worst["env_name"] == min("bc", key=per_env.get)
        assert -1 <= worst["ci_low"] <= worst["diff"] and worst["ci_low"] <= worst["ci_high"] <= 1
    assert len(rows) == 2 * (3 + 3)  # per method: 3 environments, 2 means, 1 worst


def test_constant_differences_have_exact_intervals():
    """Every question of an environment differs by the same amount: the bootstrap has nothing to
    vary, so each interval is its point, the worst one's included."""
    preds = [{"env_name": e, "method": m, "dataset": "nq", "question_id": str(q), "error": None, "prediction": m,
              "score": {"agent:trained": 1.0, "agent:base": 0.0 if e == "b" else 0.5, "direct": 0.0}[m]}
             for e, m, q in product("bc", METHODS, range(5))]
    rows = heldout_comparisons(preds, EnvSplit({"b": True, "c": True}, "test"), {"s": ["nq"]})
    got = {(r["method"], r["scope"]): (r["diff"], r["ci_low"], r["ci_high"], r["env_name"]) for r in rows}
    assert got[("agent:base", "held-out worst")] == (0.5, 0.5, 0.5, "c")
    assert got[("agent:base", "held-out mean")][:3] == (0.75, 0.75, 0.75)
    assert got[("direct", "held-out worst")][:3] == (1.0, 1.0, 1.0)


def _results():
    # two datasets of one (env, method): 4 questions scored 0.5 on average, 3 of 4 scored (one failed) at 1/3
    return [{"env_name": "b", "method": "direct", "dataset": "nq", "n": 4, "errors": 0, "score": 0.5,
             "env_prompt_tokens": 100, "env_completion_tokens": 20, "cost_usd": 0.03, "primary_metric": "em"},
            {"env_name": "b", "method": "direct", "dataset": "hotpotqa", "n": 4, "errors": 1, "score": 1 / 3,
             "env_prompt_tokens": 80, "env_completion_tokens": 20, "cost_usd": 0.02, "primary_metric": "em"},
            {"env_name": "a", "method": "direct", "dataset": "nq", "n": 4, "errors": 0, "score": 0.0,
             "env_prompt_tokens": 10, "env_completion_tokens": 2, "cost_usd": 0.01, "primary_metric": "em"}]


def test_cost_per_correct_is_all_dollars_over_the_answers_scored_right():
    (a, b) = cost_points(_results())
    assert b["correct"] == pytest.approx(2 + 1) and b["usd_per_correct"] == pytest.approx(0.05 / 3)
    assert b["usd_per_question"] == pytest.approx(0.05 / 8)  # the failed question's spend counts
    assert a["correct"] == 0 and a["usd_per_correct"] is None


def test_the_report_marks_held_out_environments_and_gives_cost_per_correct(tmp_path):
    from prompt_r1.evaluation.report import write_report

    preds = _predictions(random.Random(1))
    split = EnvSplit({"a": False, "b": True, "c": True}, "the test's pool")
    files = write_report(_results(), [], tmp_path / "rep", predictions=preds, split=split,
                         suites={"sample": ["nq", "hotpotqa"]})
    text = files["markdown"].read_text()
    assert "### environment: b (held out: yes)" in text and "### environment: a (held out: no)" in text
    assert "Held out: b, c; trained on: a (from the test's pool)." in text
    assert "| b | yes | direct | 180 | 40 | 0.0500 | 8 | 3.0 | 0.006250 | 0.016667 |" in text
    assert "| a | no | direct | 10 | 2 | 0.0100 | 4 | 0.0 | 0.002500 | n/a |" in text
    with files["csv"].open() as fh:
        assert {r["env_name"]: r["held_out"] for r in csv.DictReader(fh)} == {"a": "no", "b": "yes"}
    with files["heldout"].open() as fh:
        scopes = {(r["method"], r["scope"]) for r in csv.DictReader(fh)}
    assert ("direct", "held-out worst") in scopes and ("agent:base", "held-out mean") in scopes
    assert files["accuracy_vs_cost"].stat().st_size > 0


def test_held_out_tags_and_metrics_reach_mlflow(home):
    import mlflow
    from mlflow import MlflowClient

    from tasks.tracking.eval_runs import log_eval_environment, log_heldout_metrics
    from tasks.tracking.runs import setup_mlflow

    preds = _predictions(random.Random(2))
    split = EnvSplit({"a": False, "b": True, "c": True}, "test")
    results = [{**r, "method": "agent:trained"} for r in _results()]
    setup_mlflow("t")
    with mlflow.start_run() as parent:
        for env in ("a", "b"):
            log_eval_environment(parent.info.run_id, env, f"model-{env}", ["sample"], results,
                                 suite_datasets={"sample": ["nq", "hotpotqa"]}, held_out=split.held_out[env])
        rows = heldout_comparisons(preds, split, {"sample": ["nq", "hotpotqa"]})
        log_heldout_metrics(rows)
    client = MlflowClient()
    runs = client.search_runs([parent.info.experiment_id], "tags.method = 'agent:trained'")
    assert {r.info.run_name: r.data.tags["held_out"] for r in runs} == {
        "eval-a-agent:trained": "false", "eval-b-agent:trained": "true"}
    b_run = next(r for r in runs if r.data.tags["env_name"] == "b")
    assert b_run.data.metrics["usd_per_correct"] == pytest.approx(0.05 / 3)
    assert b_run.data.metrics["correct"] == pytest.approx(3)
    metrics = client.get_run(parent.info.run_id).data.metrics
    want = {(r["method"], r["scope"]): r for r in rows}
    for method, key in (("direct", "vs_direct"), ("agent:base", "vs_agent-base")):
        assert metrics[f"heldout/mean/sample/{key}"] == pytest.approx(want[(method, "held-out mean")]["diff"])
        assert metrics[f"heldout/worst/sample/{key}"] == pytest.approx(want[(method, "held-out worst")]["diff"])
        assert metrics[f"heldout/worst/sample/{key}/ci_low"] == pytest.approx(want[(method, "held-out worst")]["ci_low"])
        assert metrics[f"heldout/env/c/sample/{key}"] == pytest.approx(
            next(r["diff"] for r in rows if r["method"] == method and r["env_name"] == "c" and r["scope"] == "env"))
    assert client.get_run(parent.info.run_id).data.tags["heldout/worst/sample/vs_direct/env"] == \
        want[("direct", "held-out worst")]["env_name"]


@pytest.mark.slow
def test_the_evaluate_flow_marks_what_the_trained_agents_run_never_drew(home, tmp_path):
    """The evaluate flow on configs/smoke.yaml with an `agent:trained` whose carried training pool
    is {tiny-smollm2-env}: the opposite of the smoke config's own pool ({tiny-env}), so the tags
    and metrics can only come from the agent's config."""
    import shutil

    import yaml
    from prefect.testing.utilities import prefect_test_harness

    from flows.evaluate import evaluate_flow
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.models.agent_files import TRAINING_CONFIG
    from tests.flows.test_mlflow_ui import SMOKE_ENVS, _client

    trained = tmp_path / "trained"
    shutil.copytree(resolve_model("tiny-protocol"), trained)
    pool = parse_config({"train": {"environments": [SMOKE_ENVS[1]]}})
    (trained / TRAINING_CONFIG).write_text(yaml.safe_dump(pool.model_dump(mode="json")))
    overrides = {"eval.environments": SMOKE_ENVS, "eval.methods": ["direct", "agent"], "eval.trace_episodes": 0}
    with prefect_test_harness(server_startup_timeout=180):
        result = evaluate_flow("configs/smoke.yaml", agents={"trained": str(trained)}, overrides=overrides)
    client = _client()
    exp = client.get_experiment_by_name("smoke")
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=200)
            if r.data.tags.get("method") not in (None, "all")]
    assert {(r.data.tags["env_name"], r.data.tags["held_out"]) for r in runs} == {
        ("tiny-env", "true"), ("tiny-smollm2-env", "false")}
    parent = client.get_run(result["run_id"]).data
    for key in ("vs_direct", "vs_agent-base"):
        assert -1 <= parent.metrics[f"heldout/mean/sample/{key}"] <= 1
        assert parent.metrics[f"heldout/worst/sample/{key}"] == parent.metrics[f"heldout/mean/sample/{key}"]  # one held out
        assert parent.tags[f"heldout/worst/sample/{key}/env"] == "tiny-env"
        assert f"trainedon/mean/sample/{key}" in parent.metrics
    assert str(trained) in parent.tags["held_out_from"]
    text = open(result["report"]).read()
    assert "Held out: tiny-env; trained on: tiny-smollm2-env" in text and "(held out: yes)" in text
