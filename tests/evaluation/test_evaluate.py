"""Evaluation on a slice of all 12 benchmark files against an in-process environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prompt_r1.models.resolver import resolve_agents
from prompt_r1.config.experiment import load_config
from prompt_r1.evaluation.answers import extract_cot_answer
from prompt_r1.evaluation.evaluate import EvalError, evaluate, suite_datasets
from prompt_r1.data.ingest import ingest
from prompt_r1.data.rows import IN_DOMAIN, OOD, PROMPT_R1_FILES
from prompt_r1.core.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"direct", "cot", "agent:base", "agent_only:base"}


@pytest.fixture
def smoke_all_suites():
    return load_config(ROOT / "configs" / "smoke.yaml",
                       {"eval.suites": ["in_domain", "ood"], "eval.limit_per_dataset": 1})


def test_all_methods_on_all_12_datasets(warehouse, shared_data, smoke_all_suites):
    ingest(warehouse, [shared_data])
    agents = resolve_agents(smoke_all_suites)
    assert set(agents) == {"base"}  # `trained` is skipped when no checkpoint is given
    first = evaluate(smoke_all_suites, warehouse, "run-a", agents)
    assert len(first.predictions) == 12 * len(METHODS)
    assert len(first.results) == 12 * len(METHODS)
    assert {r["method"] for r in first.results} == METHODS
    assert {r["dataset"] for r in first.results} == set(IN_DOMAIN) | set(OOD)
    for row in first.results:  # each dataset scored with its primary metric
        assert row["primary_metric"] == PROMPT_R1_FILES[row["dataset"]][1]
        assert row["score"] == row[row["primary_metric"]]
    counts = warehouse.query("SELECT COUNT(*) FROM eval_predictions WHERE run_id = 'run-a'")[0][0]
    assert counts == 12 * len(METHODS)
    agent_rows = [p for p in first.predictions if p["method"] == "agent:base"]
    assert all(p["num_turns"] >= 1 for p in agent_rows)
    assert any(p["env_prompt_tokens"] > 0 for p in agent_rows), "the agent should have called the environment"

    second = evaluate(smoke_all_suites, warehouse, "run-b", agents)
    key = lambda r: (r["env_name"], r["method"], r["dataset"])  # noqa: E731
    assert sorted(map(str, sorted(first.results, key=key))) == sorted(map(str, sorted(second.results, key=key)))


def test_agents_are_loaded_once_for_every_environment(monkeypatch, warehouse):
    """The flow's one-task-per-environment evaluation: an open `EvalAgents` passed to each call
    builds each policy once and generates `agent_only` once, and every environment gets the same
    `agent_only` rows; it is closed by its owner, not by `evaluate`."""
    import prompt_r1.policy as policy_module
    from prompt_r1.evaluation.evaluate import EvalAgents

    built, real_make = [], policy_module.make_policy

    def counting_make_policy(*args, **kwargs):  # spy: the real policy, counted
        built.append(args[1])
        return real_make(*args, **kwargs)

    monkeypatch.setattr(policy_module, "make_policy", counting_make_policy)
    ingest(warehouse, [ROOT / "data" / "sample"])
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"eval.limit_per_dataset": 1})
    second_env = cfg.environment.model_copy(update={"name": "tiny-env-2"})
    with EvalAgents(cfg, resolve_agents(cfg)) as opened:
        first = evaluate(cfg, warehouse, "once", opened, [cfg.environment])
        second = evaluate(cfg, warehouse, "once", opened, [second_env])
        assert opened._policies is not None  # still open between the environments
    assert opened._policies is None
    assert len(built) == 1
    assert set(opened.policies) == {"base"} and len(built) == 2  # closed (as after a crash): built anew on use
    opened.close()
    assert "agent_only:base" in first.seconds and "agent_only:base" not in second.seconds
    only = lambda out: [(r["question_id"], r["prediction"]) for r in out.predictions  # noqa: E731
                        if r["method"] == "agent_only:base"]
    assert only(first) and only(first) == only(second)
    assert {r["env_name"] for r in second.predictions} == {"tiny-env-2"}


def test_environment_suites_keep_an_environment_to_its_datasets(warehouse):
    """`eval.environment_suites`: the named environment answers its suites' questions alone (every
    method, agent_only included); the other environment answers all; an unknown name or suite stops."""
    from prompt_r1.config.base import ConfigError

    ingest(warehouse, [ROOT / "data" / "sample", ROOT / "data" / "compositional"])
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {
        "eval.limit_per_dataset": 1, "eval.suites": ["sample", "compositional_probe"],
        "eval.environment_suites": {"tiny-env-2": ["sample"]}})
    second_env = cfg.environment.model_copy(update={"name": "tiny-env-2"})
    out = evaluate(cfg, warehouse, "split", resolve_agents(cfg), [cfg.environment, second_env])
    datasets = {e: {r["dataset"] for r in out.predictions if r["env_name"] == e} for e in (cfg.environment.name, "tiny-env-2")}
    sample = {d for d, _ in suite_datasets(warehouse, ["sample"])}
    assert datasets["tiny-env-2"] == sample and datasets[cfg.environment.name] == sample | {"compositional_probe"}
    methods = {r["method"] for r in out.predictions if r["env_name"] == "tiny-env-2"}
    assert methods == METHODS  # agent_only rows too, only for that environment's questions
    both = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"environments": [cfg.environment, second_env]})})
    alone = evaluate(both, warehouse, "one-of-two", resolve_agents(cfg), [cfg.environment])  # a call may evaluate some
    assert {r["env_name"] for r in alone.predictions} == {cfg.environment.name}
    with pytest.raises(EvalError, match=r"environment_suites names \['nope'\]"):
        evaluate(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"environment_suites": {"nope": ["sample"]}})}),
                 warehouse, "bad", resolve_agents(cfg), [cfg.environment])
    with pytest.raises(ConfigError, match=r"environment_suites\['tiny-env-2'\].*not in eval.suites"):
        load_config(ROOT / "configs" / "smoke.yaml", {"eval.environment_suites": {"tiny-env-2": ["ood"]}})


def test_unknown_suite_and_missing_data(warehouse, smoke_all_suites):
    ingest(warehouse, [ROOT / "data" / "sample"])
    with pytest.raises(EvalError, match="ingest"):
        suite_datasets(warehouse, ["in_domain"])
    with pytest.raises(EvalError, match="unknown suite"):
        suite_datasets(warehouse, ["nope"])
    assert len(suite_datasets(warehouse, ["sample"])) == 4


def test_cot_extraction_rule():
    assert extract_cot_answer("Let me think.\nSo 3+4=7.\nAnswer: 7") == "7"
    assert extract_cot_answer("first answer: 3\nfinal Answer: 4") == "4"
    assert extract_cot_answer("") == ""


def test_cli_evaluate_writes_report(home, shared_data):
    exe = [sys.executable, "-m", "flows.cli"]
    subprocess.run(exe + ["ingest", str(shared_data), "data/sample"], cwd=ROOT, check=True, capture_output=True)
    out = home / "report"
    proc = subprocess.run(
        exe + ["evaluate", "-c", "configs/smoke.yaml", "--out", str(out), "--run-id", "cli-run",
               "--set", "eval.suites=" + json.dumps(["sample", "ood"]), "--set", "eval.limit_per_dataset=1",
               "--set", "eval.methods=" + json.dumps(["direct", "cot"])],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = (out / "results.md").read_text()
    assert "sample_math" in table and "Xsum_ood (OOD)" in table and "avg ood" in table
    assert (out / "results.csv").read_text().count("\n") == 1 + 8 * 2
    assert (out / "bars_tiny-env.png").exists() and (out / "averages_by_environment.png").exists()
    assert "cost (USD)" in (out / "costs.md").read_text()



@pytest.mark.parametrize("overrides,expected", [
    ({"eval.temperature": 0.7, "eval.top_p": 0.8, "eval.max_turns": 10}, (0.7, 0.8, 10)),  # the reference's
    ({}, (0.0, 1.0, 3)),  # defaults: greedy, the rollout's turn budget
])
def test_agent_evaluation_uses_the_eval_decoding(monkeypatch, warehouse, overrides, expected):
    """`eval.temperature/top_p/max_turns` reach the policy's settings and the rollout loop."""
    import asyncio

    import prompt_r1.rollout.episode as rollout_module
    from prompt_r1.evaluation.evaluate import _agent_method, eval_agent

    ingest(warehouse, [ROOT / "data" / "sample"])
    questions = warehouse.questions(splits=["test"], limit_per_dataset=1)[:2]
    seen = []

    async def fake_rollout(policy, env, chunk, agent_cfg, rollout_cfg, reward_cfg, group_size=None, seed=0):
        seen.append((agent_cfg.temperature, agent_cfg.top_p, rollout_cfg.max_turns, group_size))
        return [Trajectory(q.question_id, 0, [1]) for q in chunk]

    monkeypatch.setattr(rollout_module, "rollout_batch", fake_rollout)
    cfg = load_config(ROOT / "configs" / "smoke.yaml", overrides)
    preds = asyncio.run(_agent_method(None, type("Env", (), {"name": "e"})(), questions, cfg, "base", 0))
    assert len(preds) == len(questions) and seen and all(s == (*expected, 1) for s in seen)
    policy_cfg = eval_agent(cfg)  # what make_policy builds the evaluated policy from
    assert (policy_cfg.temperature, policy_cfg.top_p) == expected[:2]
    assert (cfg.agent.temperature, cfg.agent.top_p) == (1.0, 1.0)  # training sampling is untouched


def test_whole_files_when_limit_is_null(warehouse, shared_data):
    """`limit_per_dataset: null` (paper.yaml) evaluates every question of a file, with an interval
    per cell that holds the score and is stored in the warehouse."""
    paper = load_config(ROOT / "configs" / "paper.yaml")
    assert paper.eval.limit_per_dataset is None
    cfg = load_config(ROOT / "configs" / "smoke.yaml",
                      {"eval.suites": ["PopQA"], "eval.limit_per_dataset": None, "eval.methods": ["direct"]})
    ingest(warehouse, [shared_data])
    out = evaluate(cfg, warehouse, "whole", {})
    assert len(out.predictions) == 128  # the whole file, not the default 8
    (cell,) = out.results
    assert cell["n"] == 128 and cell["ci_low"] <= cell["score"] <= cell["ci_high"]
    (stored,) = warehouse.eval_results("whole")
    assert (stored["ci_low"], stored["ci_high"]) == (cell["ci_low"], cell["ci_high"])


def test_report_has_intervals_paired_comparisons_and_cost_plot(home):
    from prompt_r1.config.env import EnvConfig
    from prompt_r1.evaluation.report import write_report
    from prompt_r1.evaluation.scoring import aggregate

    preds = []
    for q in range(40):
        for method, score in (("agent:trained", 1.0 if q % 4 else 0.0), ("direct", 1.0 if q % 2 else 0.0)):
            failed = method == "direct" and q == 3
            preds.append({"env_name": "e", "method": method, "dataset": "PopQA", "question_id": f"q{q}",
                          "prediction": "", "primary_metric": "em", "num_turns": 1, "env_prompt_tokens": 10,
                          "env_completion_tokens": 5, "error": "HTTP 500" if failed else None,
                          **dict.fromkeys(("score", "em", "f1", "substring", "ssim"), None if failed else score)})
    results = aggregate(preds, EnvConfig())
    direct = next(r for r in results if r["method"] == "direct")
    assert direct["errors"] == 1 and direct["score"] == pytest.approx(19 / 39)  # failed row out of the mean
    files = write_report(results, [], home / "rep", predictions=preds)
    text = files["markdown"].read_text()
    assert f"[{direct['ci_low'] * 100:.1f}, {direct['ci_high'] * 100:.1f}]" in text
    rows = files["comparisons"].read_text().splitlines()
    assert rows[0].startswith("env_name,reference,method,dataset,diff,ci_low,ci_high,p_value,n,changed,dropped")
    cell = rows[1].split(",")
    assert cell[2:4] == ["direct", "PopQA"] and int(cell[8]) == 39 and int(cell[10]) == 1
    assert int(cell[9]) == 0  # both methods answered "" to every question: no answer differs
    assert float(cell[4]) == pytest.approx(29 / 39 - 19 / 39)
    assert files["accuracy_vs_cost"].stat().st_size > 1000
