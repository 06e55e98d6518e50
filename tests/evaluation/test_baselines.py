"""Prompt-optimisation baselines on tiny models: the budget holds exactly, the optimised
instruction is the one evaluated, and a rerun reuses the stored instruction with identical rows."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from prompt_r1.evaluation.baselines.base import Budget, BudgetExhausted, baseline_prompt
from prompt_r1.evaluation.baselines.opro import meta_prompt, parse_instruction
from prompt_r1.config.experiment import load_config
from prompt_r1.env.base import EnvReply
from prompt_r1.env.inprocess import InProcessEnvironment
from prompt_r1.config.env import EnvConfig
from prompt_r1.evaluation.evaluate import evaluate
from prompt_r1.data.ingest import ingest
from prompt_r1.core.trajectory import EnvCall

ROOT = Path(__file__).resolve().parents[2]


class _CountingEnv:
    """Replies after a random delay; costs 1000 prompt tokens at the configured price."""

    def __init__(self, price: float = 0.0):
        self.cfg = EnvConfig(price_per_1k_prompt=price)
        self.name = "fake"
        self.sent = 0

    async def reply(self, messages, turn=0):
        self.sent += 1
        await asyncio.sleep(random.random() / 1000)
        return EnvReply("ok", EnvCall(turn=turn, env_name="fake", model="m", prompt_tokens=1000))


@pytest.mark.parametrize("case", range(25))
def test_budget_stops_exactly_at_max_calls_even_with_concurrent_callers(case):
    rng = random.Random(case)
    max_calls, attempts = rng.randint(1, 30), rng.randint(0, 60)
    env, budget = _CountingEnv(), Budget(max_calls)

    async def go():
        return await asyncio.gather(*[budget.call(env, [{"role": "user", "content": "x"}]) for _ in range(attempts)],
                                    return_exceptions=True)

    out = asyncio.run(go())
    assert env.sent == budget.calls == min(max_calls, attempts)
    assert sum(isinstance(o, BudgetExhausted) for o in out) == max(0, attempts - max_calls)


@pytest.mark.parametrize("price,max_usd", [(0.01, 0.05), (0.003, 0.01), (1.0, 0.5)])
def test_dollar_budget_passes_the_cap_by_at_most_one_call(price, max_usd):
    env, budget = _CountingEnv(price), Budget(1000, max_usd)

    async def go():
        return await asyncio.gather(*[budget.call(env, [{"role": "user", "content": "x"}]) for _ in range(50)],
                                    return_exceptions=True)

    asyncio.run(go())
    assert budget.usd >= max_usd and budget.usd - max_usd < price + 1e-12
    assert budget.calls == env.sent == -(-round(max_usd * 1e6) // round(price * 1e6))  # ceil(cap / price)


def test_meta_prompt_round_trip():
    assert parse_instruction(meta_prompt([], [("q", "a")], 3).replace("<INS> and </INS>", "<INS>x</INS>")) == "x"


@pytest.fixture
def opro_cfg():
    return load_config(ROOT / "configs" / "smoke.yaml", {
        "eval.methods": ["opro"], "eval.suites": ["sample"], "eval.limit_per_dataset": 1,
        "eval.baselines.max_env_calls": 9, "eval.baselines.train_questions": 2,
        "eval.baselines.steps": 5, "eval.baselines.candidates_per_step": 1})


def test_opro_budget_instruction_and_cached_rerun(monkeypatch, warehouse, opro_cfg):
    ingest(warehouse, [ROOT / "data" / "sample"])
    sent: list[str] = []
    real = InProcessEnvironment.reply
    proposals = iter(range(100))

    async def reply(self, messages, turn=0):
        text = messages[-1]["content"]
        sent.append(text)
        if "<INS>" in text:  # the optimiser: the tiny model writes no tags, so propose for it
            return EnvReply(f"<INS>Candidate {next(proposals)}: end with 'Answer: <answer>'.</INS>",
                            EnvCall(turn=turn, env_name=self.name, model=self.model, prompt_tokens=3))
        return await real(self, messages, turn)

    monkeypatch.setattr(InProcessEnvironment, "reply", reply)
    first = evaluate(opro_cfg, warehouse, "opro-a", {})
    (info,) = first.baselines
    optimisation = sent[: info["env_calls"]]
    # seed (2) + [proposal (1) + score (2)] x 2 = 8; a third round needs 3 of the 1 left: stops
    assert info["env_calls"] == 8 <= opro_cfg.eval.baselines.max_env_calls and not info["cached"]
    assert sum("<INS>" in t for t in optimisation) == 2
    evaluated = sent[info["env_calls"]:]
    questions = {p["question_id"] for p in first.predictions}
    assert len(evaluated) == len(questions) == 4  # one per sample dataset, nothing else
    assert all(t.endswith("\n" + info["instruction"]) for t in evaluated)
    history = warehouse.baseline_get(info["cache_key"])
    assert history["instruction"] == info["instruction"] and history["train_score"] == info["train_score"]

    sent.clear()
    second = evaluate(opro_cfg, warehouse, "opro-b", {})
    assert second.baselines[0]["cached"] and second.baselines[0]["instruction"] == info["instruction"]
    assert len(sent) == 4  # no optimisation calls: the stored instruction is reused
    strip = lambda rows: sorted((r["question_id"], r["prediction"], r["score"]) for r in rows)  # noqa: E731
    assert strip(second.predictions) == strip(first.predictions)

    changed = opro_cfg.model_copy(deep=True)
    changed.eval.baselines.max_env_calls = 5  # another budget: optimise again
    sent.clear()
    third = evaluate(changed, warehouse, "opro-c", {})
    assert not third.baselines[0]["cached"] and third.baselines[0]["env_calls"] == 5


def test_baseline_prompt_is_the_cot_layout():
    from prompt_r1.evaluation.baselines.base import SEED_INSTRUCTION
    from prompt_r1.evaluation.answers import COT_SUFFIX

    assert baseline_prompt("Q?", SEED_INSTRUCTION) == "Q?" + COT_SUFFIX


def test_gepa_budget_instruction_and_cached_rerun(monkeypatch, warehouse, opro_cfg):
    cfg = opro_cfg.model_copy(deep=True)
    cfg.eval.methods = ["gepa"]
    cfg.eval.baselines.max_env_calls = 12
    ingest(warehouse, [ROOT / "data" / "sample"])
    sent: list[str] = []
    real = InProcessEnvironment.reply

    async def reply(self, messages, turn=0):
        sent.append(messages[-1]["content"])
        return await real(self, messages, turn)

    monkeypatch.setattr(InProcessEnvironment, "reply", reply)
    first = evaluate(cfg, warehouse, "gepa-a", {})
    (info,) = first.baselines
    assert len(warehouse.baseline_get(info["cache_key"])["history"]) > 2
    assert 2 <= info["env_calls"] <= 12 and len(sent) == info["env_calls"] + 4
    assert info["train_score"] is not None  # the seed at least was scored on every training question
    assert all(t.endswith("\n" + info["instruction"]) for t in sent[info["env_calls"]:])
    sent.clear()
    second = evaluate(cfg, warehouse, "gepa-b", {})
    assert second.baselines[0]["cached"] and len(sent) == 4
    strip = lambda rows: sorted((r["question_id"], r["prediction"], r["score"]) for r in rows)  # noqa: E731
    assert strip(second.predictions) == strip(first.predictions)


def test_textgrad_budget_instruction_and_cached_rerun(monkeypatch, warehouse, opro_cfg):
    """TextGrad's forward, backward and optimiser calls all reach the project's environment and
    count against the budget; the instruction TGD wrote (and that scored best) is the one evaluated."""
    import importlib.util

    if importlib.util.find_spec("textgrad") is None:  # import needs the litellm stub the module installs
        pytest.skip("scripts/setup.sh installs textgrad")
    from prompt_r1.evaluation.baselines.textgrad_opt import step_calls

    cfg = opro_cfg.model_copy(deep=True)
    cfg.eval.methods = ["textgrad"]
    cfg.eval.baselines.max_env_calls = 2 + 2 * step_calls(1, 2) + 3  # seed, two steps, a remainder too small
    cfg.eval.baselines.minibatch = 1
    ingest(warehouse, [ROOT / "data" / "sample"])
    sent: list[list[dict]] = []
    real = InProcessEnvironment.reply
    proposals = iter(range(100))

    async def reply(self, messages, turn=0):
        sent.append(messages)
        if "<IMPROVED_VARIABLE>" in messages[-1]["content"]:  # TGD's update: the tiny model writes no tags
            return EnvReply(f"<IMPROVED_VARIABLE>Variant {next(proposals)}: end with 'Answer: <answer>'."
                            "</IMPROVED_VARIABLE>", EnvCall(turn=turn, env_name=self.name, model=self.model))
        return await real(self, messages, turn)

    monkeypatch.setattr(InProcessEnvironment, "reply", reply)
    first = evaluate(cfg, warehouse, "tg-a", {})
    (info,) = first.baselines
    assert info["env_calls"] == 2 + 2 * step_calls(1, 2) == len(sent) - 4 and not info["cached"]
    optimisation = sent[: info["env_calls"]]
    assert sum("<IMPROVED_VARIABLE>" in m[-1]["content"] for m in optimisation) == 2  # one TGD update per step
    assert sum(m[0]["role"] == "system" for m in optimisation) == 2 * 3  # backward x2 + update, per step
    history = json.loads(warehouse.baseline_get(info["cache_key"])["history"])
    assert [h["instruction"] for h in history[1:]] == ["Variant 0: end with 'Answer: <answer>'.",
                                                       "Variant 1: end with 'Answer: <answer>'."]
    best = max((h for h in history if h["train_score"] is not None), key=lambda h: h["train_score"])
    assert info["train_score"] == best["train_score"]
    assert all(m[-1]["content"].endswith("\n" + info["instruction"]) and len(m) == 1
               for m in sent[info["env_calls"]:])
    sent.clear()
    second = evaluate(cfg, warehouse, "tg-b", {})
    assert second.baselines[0]["cached"] and len(sent) == 4
    strip = lambda rows: sorted((r["question_id"], r["prediction"], r["score"]) for r in rows)  # noqa: E731
    assert strip(second.predictions) == strip(first.predictions)


def test_optimised_instructions_reach_mlflow_and_the_report(home, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from prompt_r1.evaluation.report import write_report
    from tasks.tracking.eval_runs import log_eval_environment
    from tasks.tracking.runs import setup_mlflow

    row = {"env_name": "e1", "dataset": "gsm8k", "method": "opro", "n": 2, "primary_metric": "em", "score": 0.5,
           "em": 0.5, "errors": 0, "env_prompt_tokens": 10, "env_completion_tokens": 5, "cost_usd": 0.0}
    base = [{"env_name": "e1", "method": "opro", "instruction": "Think | then answer.", "train_score": 0.75,
             "cached": False, "cache_key": "k1", "env_calls": 9, "prompt_tokens": 90, "completion_tokens": 40,
             "cost_usd": 0.002},
            {"env_name": "e2", "method": "opro", "instruction": "Other env.", "train_score": None,
             "cached": True, "cache_key": "k2", "env_calls": 0, "cost_usd": 0.0}]
    setup_mlflow("t")
    with mlflow.start_run() as parent:
        env_run = log_eval_environment(parent.info.run_id, "e1", "m", ["sample"], [row], base)
    client = MlflowClient()
    (child,) = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{env_run}'")
    assert child.data.params["instruction"] == "Think | then answer." and child.data.params["cache_key"] == "k1"
    assert child.data.metrics["train_score"] == 0.75 and child.data.metrics["opt_env_calls"] == 9
    logged = json.loads((Path(client.download_artifacts(env_run, "baselines/e1.json"))).read_text())
    assert logged == base[:1]  # only this environment's instructions

    files = write_report([row], [], tmp_path / "rep", baselines=base)
    text = files["markdown"].read_text()
    assert "| e1 | opro | Think \\| then answer. | 75.0 | 9 | 0.0020 | no |" in text
    assert "| e2 | opro | Other env. | n/a | 0 | 0.0000 | yes |" in text
    assert json.loads(files["baselines"].read_text()) == base


def _baseline_cfg(opro_cfg, method: str):
    cfg = opro_cfg.model_copy(deep=True)
    cfg.eval.methods = ["direct", method]
    if method == "gepa":
        cfg.eval.baselines.max_env_calls = 12
    if method == "textgrad":
        from prompt_r1.evaluation.baselines.textgrad_opt import step_calls

        cfg.eval.baselines.max_env_calls, cfg.eval.baselines.minibatch = 2 + 2 * step_calls(1, 2) + 3, 1
    return cfg


def _flaky_reply(monkeypatch, fails):
    """InProcessEnvironment.reply, failing the calls `fails(text)` picks as a dead endpoint would;
    the optimisers' proposal calls answer with tags the tiny model never writes. Returns the texts sent."""
    import time

    real = InProcessEnvironment.reply
    sent: list[str] = []
    proposals = iter(range(1000))

    async def reply(self, messages, turn=0):
        text = messages[-1]["content"]
        sent.append(text)
        if fails(text):
            return self.failed(turn, "connection refused (environment down)", time.perf_counter(), attempts=1)
        if "<INS>" in text:
            return EnvReply(f"<INS>Candidate {next(proposals)}: end with 'Answer: <answer>'.</INS>",
                            EnvCall(turn=turn, env_name=self.name, model=self.model, prompt_tokens=3))
        if "<IMPROVED_VARIABLE>" in text:
            return EnvReply(f"<IMPROVED_VARIABLE>Variant {next(proposals)}: end with 'Answer: <answer>'."
                            "</IMPROVED_VARIABLE>", EnvCall(turn=turn, env_name=self.name, model=self.model))
        return await real(self, messages, turn)

    monkeypatch.setattr(InProcessEnvironment, "reply", reply)
    return sent


@pytest.mark.parametrize("method", ["opro", "gepa", "textgrad"])
def test_an_optimisation_against_a_dead_environment_is_never_stored(monkeypatch, warehouse, opro_cfg, method):
    """The environment is down: the optimisation fails, nothing is stored, the method's rows carry that
    failure and the evaluation stops (exit 3). Once the environment is back the next run optimises
    (it does not reuse the seed instruction the failed optimiser fell back to) and stores the result."""
    import importlib.util

    from prompt_r1.core.failures import EnvironmentFailure

    if method == "textgrad" and importlib.util.find_spec("textgrad") is None:
        pytest.skip("scripts/setup.sh installs textgrad")
    cfg = _baseline_cfg(opro_cfg, method)
    ingest(warehouse, [ROOT / "data" / "sample"])
    down = [True]
    _flaky_reply(monkeypatch, lambda text: down[0])
    with pytest.raises(EnvironmentFailure, match="environment `tiny-env`"):
        evaluate(cfg, warehouse, "dead", {})
    assert warehouse.query("SELECT COUNT(*) FROM baseline_instructions") == [(0,)]
    rows = warehouse.query("SELECT error, score, prediction FROM eval_predictions WHERE run_id = 'dead' "
                           "AND method = ?", [method])
    assert len(rows) == 4 and all(f"{method} optimisation failed" in e and "connection refused" in e
                                  and s is None and p == "" for e, s, p in rows)

    down[0] = False
    back = evaluate(cfg, warehouse, "back", {})
    (info,) = back.baselines
    assert not info["cached"] and info["env_calls"] > 0 and info["env_errors"] == 0 and "error" not in info
    assert info["train_score"] is not None  # scored on every training question this time
    stored = warehouse.baseline_get(info["cache_key"])
    assert stored["instruction"] == info["instruction"] and stored["train_score"] == info["train_score"]
    assert all(r["error"] is None and r["score"] is not None for r in back.predictions)


def test_an_optimisation_with_failures_within_the_rate_is_used_but_not_stored(monkeypatch, warehouse, opro_cfg):
    """One optimiser call failed, within a generous max_error_rate: the best scored instruction is
    evaluated, but not stored, so the next run optimises again. A dead environment under that rate
    gives the method's cells as errors (n/a), never the seed instruction's scores."""
    cfg = _baseline_cfg(opro_cfg, "opro")
    cfg.environment.max_error_rate = 0.5
    ingest(warehouse, [ROOT / "data" / "sample"])
    first_proposal = [True]

    def fails(text: str) -> bool:  # the first optimiser call fails, nothing else
        if "<INS>" in text and first_proposal[0]:
            first_proposal[0] = False
            return True
        return False

    _flaky_reply(monkeypatch, fails)
    out = evaluate(cfg, warehouse, "flaky", {})
    (info,) = out.baselines
    assert info["env_errors"] == 1 and info["train_score"] is not None and not info["cached"]
    assert warehouse.query("SELECT COUNT(*) FROM baseline_instructions") == [(0,)]
    assert all(r["error"] is None for r in out.predictions)
    again = evaluate(cfg, warehouse, "again", {})
    assert not again.baselines[0]["cached"] and again.baselines[0]["env_errors"] == 0
    assert warehouse.baseline_get(again.baselines[0]["cache_key"]) is not None

    cfg.environment.max_error_rate = 1.0  # and another budget, so nothing stored above is reused
    cfg.eval.baselines.max_env_calls = 8
    _flaky_reply(monkeypatch, lambda text: True)
    dead = evaluate(cfg, warehouse, "dead", {})
    (info,) = dead.baselines
    assert info["error"].startswith("opro optimisation failed") and info["instruction"] == ""
    cells = [r for r in dead.results if r["method"] == "opro"]
    assert cells and all(r["score"] is None and r["errors"] == r["n"] for r in cells)
    assert warehouse.baseline_get(info["cache_key"]) is None
