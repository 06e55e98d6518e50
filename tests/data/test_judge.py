"""An LLM judge as a dataset's scorer (`prompt_r1.data.judge`): the verdict rule against an
independent restatement over many generated verdicts; a verdict that states no score is a dropped
sample, never a 0, in evaluation rows and in training rewards; the reply cache answers a repeated
judgement without the model; each judgement's cost is priced at the judge's own prices and lands in
the evaluation's cost; a judge is part of a run's identity. The slow tests use the real bundled
SmolLM2-135M-Instruct as the judge."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from prompt_r1.config.env import EnvConfig
from prompt_r1.config.judge import JudgeConfig
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.scorer import ScorerError
from prompt_r1.data.judge import JudgeFailure, close_judges, judge_for, parse_verdict, render_rubric
from prompt_r1.env.base import EnvReply, Environment
from prompt_r1.env.judge import use_judges


# -- the verdict rule ---------------------------------------------------------------------------
def _number(rng: random.Random, value: float, integer: bool) -> str:
    return str(int(value)) if integer else f"{value:.{rng.randint(1, 3)}f}"


def _noise(rng: random.Random) -> str:
    """Text with no digits and no word `score` (so it can state nothing)."""
    words = ["The", "response", "is", "close", "to", "the", "reference", "good", "but", "brief", "Overall", "fine",
             "scored", "scoring", "underscores", "Rating", "verdict", "-", ",", "."]
    return " ".join(rng.choice(words) for _ in range(rng.randint(0, 8)))


def test_the_verdict_rule_matches_an_independent_restatement_over_generated_verdicts():
    """Built from the parts the rule names: a `Score` statement N/M (or `N out of M`) with 0 <= N <= M
    is N/M; a `Score: x` or a bare reply x in [0, 1] is x; text around it does not matter. Anything
    else (no statement, N > M, x > 1, a negative, two statements that disagree) is a JudgeFailure."""
    rng = random.Random(0)
    for _ in range(3000):
        kind = rng.choice(["fraction", "unit", "bare", "none", "over", "unit_over", "negative", "disagree", "repeat"])
        key = rng.choice(["Score", "score", "SCORE", "**Score**", "Final score"])
        sep = rng.choice([":", ": ", " = ", " ", ":  ", " is ", ":**"])
        den = rng.choice([1, 4, 5, 10, 100])
        num = rng.randint(0, den)
        slash = rng.choice(["/", " / ", " out of "])
        before, after = _noise(rng), rng.choice(["", ".", "\n", " " + _noise(rng)])
        unit = rng.choice([0.0, 1.0, round(rng.random(), 3)])
        if kind == "fraction":
            text, want = f"{before} {key}{sep}{num}{slash}{den}{after}", num / den
        elif kind == "repeat":
            text, want = f"{key}{sep}{num}{slash}{den}. {before} Score: {num}/{den}", num / den
        elif kind == "unit":
            written = _number(rng, unit, unit in (0.0, 1.0))
            text, want = f"{before} {key}{sep}{written}{after}", float(written)
        elif kind == "bare":
            written = _number(rng, unit, unit in (0.0, 1.0))
            text, want = rng.choice(["", " ", "\n"]) + written + rng.choice(["", "\n"]), float(written)
        elif kind == "none":
            text, want = before + after, None
        elif kind == "over":
            text, want = f"{key}{sep}{den + rng.randint(1, 9)}{slash}{den}", None
        elif kind == "unit_over":
            text, want = f"{key}{sep}{rng.randint(2, 99)}", None
        elif kind == "negative":
            text, want = f"{key}{sep}-{rng.randint(1, 9)}{slash}{den}", None
        else:  # two statements that disagree
            other = (num + 1) % (den + 1)
            text, want = f"{key}{sep}{num}/{den}, then Score: {other}/{den}", None
        if want is None:
            with pytest.raises(JudgeFailure):
                parse_verdict(text)
        else:
            assert parse_verdict(text) == pytest.approx(want, abs=1e-9), text


@pytest.mark.parametrize("text", ["", "   ", "I'm ready to help. What's your request?", "Score: ten", "7/10",
                                  "Score: 1e-3", "Score: 7", "1.5", "Score: 11/10", "Score: 3/0"])
def test_a_verdict_that_states_no_score_is_a_failure_not_a_zero(text):
    with pytest.raises(JudgeFailure) as err:
        parse_verdict(text)
    assert "verdict" in str(err.value)


def test_the_rubric_is_filled_once_and_needs_the_response():
    assert render_rubric("{question}|{golds}|{response}", "Q {golds}", ["a", "b"], "R {question}") == \
        "Q {golds}|a\nb|R {question}"
    with pytest.raises(ValueError, match="no `{response}`"):
        JudgeConfig(rubric="Rate {question}")


# -- the judge against a scripted environment (verdicts chosen by the test) --------------------
class ScriptedJudge(Environment):
    """An environment whose reply is chosen per answer (the text after `Response: `): it counts the
    calls that reach it and answers concurrently like a real one. Its reply cache is the base
    class's, the one every environment has (`Environment.reply`)."""

    def __init__(self, cfg: EnvConfig, verdicts: dict[str, str], fail: set[str] = frozenset(), warehouse=None):
        super().__init__(cfg, warehouse)
        self.verdicts, self.fail, self.calls, self.in_flight, self.most_in_flight = verdicts, fail, 0, 0, 0

    async def generate(self, messages, turn, started):
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        answer = messages[-1]["content"].rsplit("Response: ", 1)[1]
        if answer in self.fail:
            return self.failed(turn, "HTTP 503: overloaded", time.perf_counter(), attempts=5)
        return EnvReply(self.verdicts[answer], self.new_call(turn, prompt_tokens=100, completion_tokens=10,
                                                             latency_s=0.01, attempts=1))


def _judge_cfg(**env) -> JudgeConfig:
    return JudgeConfig(name="j", rubric="Q: {question}\nRef: {golds}\nResponse: {response}", environment=EnvConfig(
        name="jenv", kind="inprocess", model="scripted", price_per_1k_prompt=1.0, price_per_1k_completion=2.0, **env))


def _q(i: int) -> QuestionRow:
    return QuestionRow(f"q{i}", "rewrites", "test", f"Rewrite {i}", [f"ref {i}"], "custom", "f1", scorer="judge:j")


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """`make(verdicts, fail, **env)`: the judge `j`, whose environment (opened by the judge through
    `open_environment` with its warehouse, when it first needs a call) is a `ScriptedJudge`."""
    import contextlib

    import prompt_r1.env
    from prompt_r1.api import open_warehouse

    opened = []
    with open_warehouse(tmp_path / "wh.duckdb") as wh:
        def make(verdicts, fail=frozenset(), **env):
            @contextlib.contextmanager
            def open_scripted(env_cfg, warehouse=None, log_dir=None):
                opened.append(env_cfg.name)
                yield ScriptedJudge(env_cfg, verdicts, set(fail), warehouse)

            monkeypatch.setattr(prompt_r1.env, "open_environment", open_scripted)
            use_judges([_judge_cfg(**env)], wh)
            return judge_for("judge:j")
        make.opened = opened
        yield make, wh
    close_judges()


def test_judged_scores_carry_their_cost_and_go_out_concurrently(scripted):
    from prompt_r1.data.scorers import score_many

    make, _ = scripted
    judge = make({f"a{i}": f"Score: {i}/10" for i in range(8)}, concurrency=16)
    results = score_many([(_q(i), f"a{i}") for i in range(8)])
    assert [r.score for r in results] == pytest.approx([i / 10 for i in range(8)])
    assert judge._env.calls == 8 and judge._env.most_in_flight == 8  # one batch, all at once
    usd = 100 / 1000 * 1.0 + 10 / 1000 * 2.0
    assert all(r.parts == {"judge_prompt_tokens": 100.0, "judge_completion_tokens": 10.0,
                           "judge_cost_usd": pytest.approx(usd)} for r in results)
    assert results[3].note == "Score: 3/10"


def test_the_reply_cache_answers_a_repeated_judgement_without_the_model(scripted):
    from prompt_r1.data.scorers import score_question

    make, wh = scripted
    judge = make({"good": "Score: 9/10"})
    first = score_question(_q(0), "good")
    assert judge._env.calls == 1 and judge.model_calls == 1
    # a fresh judge (a new process): its memory is empty, the warehouse's cache answers
    use_judges([], wh)
    again = make({"good": "Score: 1/10"})  # would disagree, were it asked
    second = score_question(_q(0), "good")
    assert again._env is None and again.model_calls == 0 and second.score == first.score == 0.9
    assert make.opened == ["jenv"]  # the second judge never opened its environment
    assert second.parts["judge_cost_usd"] == first.parts["judge_cost_usd"]  # priced as the call it stands for


def test_the_judge_caches_through_the_environments_own_reply_cache(scripted):
    """One reply cache: the judge's verdicts are stored by its environment's `reply` (the path every
    environment call takes), under the key an ordinary call of that environment has; a second run's
    judgements come from there and the judge's environment (its model) is never opened."""
    from prompt_r1.data.scorers import score_many
    from prompt_r1.env.base import sent_key

    make, wh = scripted
    items = [(_q(i), f"a{i}") for i in range(4)]
    judge = make({f"a{i}": f"Score: {i}/4" for i in range(4)}, concurrency=4)
    first = score_many(items)
    assert judge._env.calls == 4 and judge.model_calls == 4
    messages = judge.messages(_q(2), "a2")
    assert wh.cache_get(sent_key(judge.cfg.environment, messages))[0] == "Score: 2/4"
    ordinary = ScriptedJudge(judge.cfg.environment, {}, warehouse=wh)  # the same environment, called as any other
    reply = asyncio.run(ordinary.reply(messages))
    assert reply.call.cached and reply.text == "Score: 2/4" and ordinary.calls == 0
    use_judges([], wh)  # a second run
    again = make({f"a{i}": "Score: 0/4" for i in range(4)}, concurrency=4)  # would disagree, were it asked
    second = score_many(items)
    assert again._env is None and again.model_calls == 0 and make.opened == ["jenv"]
    assert [r.score for r in second] == [r.score for r in first] == [0.0, 0.25, 0.5, 0.75]
    assert [r.parts for r in second] == [r.parts for r in first]  # priced as the calls they stand for


def test_a_failed_judgement_is_a_dropped_evaluation_row_and_no_cost_is_invented(scripted):
    from prompt_r1.evaluation.scoring import Prediction, aggregate, score_predictions

    make, _ = scripted
    make({"ok": "Score: 4/5", "chatty": "I'm ready to help. What's your request?"}, fail={"down"},
         max_error_rate=1.0)
    preds = [Prediction(_q(0), "direct", "ok"), Prediction(_q(1), "direct", "chatty"),
             Prediction(_q(2), "direct", "down"), Prediction(_q(3), "direct", "  ")]
    rows = score_predictions(preds)
    by = {r["question_id"]: r for r in rows}
    assert by["q0"]["score"] == pytest.approx(0.8) and by["q0"]["error"] is None
    assert by["q0"]["judge"]["verdict"] == "Score: 4/5" and by["q0"]["judge"]["name"] == "j"
    assert by["q1"]["score"] is None and "states no score" in by["q1"]["error"] and by["q1"]["judge_failed"]
    assert by["q2"]["score"] is None and "HTTP 503" in by["q2"]["error"]
    assert by["q3"]["score"] == 0.0 and by["q3"]["judge"] is None  # a blank answer: 0 with no call, as always
    for r in rows:
        r["env_name"] = "e"
    cell = aggregate(rows, EnvConfig(name="e"))[0]
    assert cell["errors"] == 2 and cell["score"] == pytest.approx(0.4)
    assert cell["cost_usd"] == pytest.approx(0.12)  # the one call that was judged, at the judge's prices


def test_too_many_failed_judgements_stop_the_run_naming_the_judge(scripted):
    from prompt_r1.data.scorers import score_many

    make, _ = scripted
    make({"a": "Score: 1/2", "b": "no idea"}, max_error_rate=0.05)
    with pytest.raises(ScorerError, match=r"judge `judge:j` failed on 1 of 2 answers.*max_error_rate"):
        score_many([(_q(0), "a"), (_q(1), "b")])


def test_a_failed_judgement_drops_the_trajectory_in_training_never_a_zero_reward(scripted):
    from prompt_r1.config.reward import RewardConfig
    from prompt_r1.core.trajectory import Trajectory
    from prompt_r1.rollout.reward_stage import score_trajectories
    from prompt_r1.training.batch_stats import env_error_trajectories

    make, _ = scripted
    make({"good": "Score: 10/10", "bad": "Maybe."}, max_error_rate=1.0)
    ask = "<think>t</think><interaction_prompt>q</interaction_prompt>"
    trajs = [Trajectory(f"q{i}", 0, [], agent_turns=[ask, f"<think>t</think><answer>{a}</answer>"])
             for i, a in enumerate(["good", "bad"])]
    stats = score_trajectories(trajs, {f"q{i}": _q(i) for i in range(2)}, RewardConfig())
    assert stats == {"judge_cost_usd": pytest.approx(0.12), "judge_dropped": 1.0}  # the step's metrics
    assert trajs[0].reward.total == pytest.approx(1.0) and trajs[0].error is None
    assert trajs[1].reward is None and "judge `j`" in trajs[1].error and "states no score" in trajs[1].error
    # dropped, not an environment failure: the step's judge_dropped counts it, env_error_trajectories does not
    ended = Trajectory("q0", 1, [], stop_reason="env_error", error="HTTP 500")
    assert env_error_trajectories([*trajs, ended]) == 1


class Answering(Environment):
    """An environment that answers `Rewrite i` with `a<i>`: the answers the scripted judge judges."""

    async def generate(self, messages, turn, started):
        answer = "a" + messages[-1]["content"].split()[1]
        return EnvReply(answer, self.new_call(turn, prompt_tokens=5, completion_tokens=1, attempts=1))


def test_a_failed_judgement_in_a_baseline_is_a_dropped_sample_never_a_stop(scripted):
    """`direct` and the prompt optimisers drop a sample whose judgement failed, as the agent method
    does: the evaluation goes on (the row has the judge's reason as its error, the cell counts it), a
    candidate instruction is scored over the judged questions; past the judge's `max_error_rate` the
    run stops naming the judge."""
    from prompt_r1.config.experiment import parse_config
    from prompt_r1.evaluation.baselines.base import Budget, score_instruction
    from prompt_r1.evaluation.evaluate import EvalOutcome, _evaluate_env
    from prompt_r1.evaluation.scoring import aggregate

    make, _ = scripted
    make({"a0": "Score: 1/2", "a1": "no idea", "a2": "Score: 1/1", "a3": "Score: 0/1"}, max_error_rate=0.5)
    questions = [_q(i) for i in range(4)]
    env = Answering(EnvConfig(name="e", kind="inprocess", model="m"))
    cfg = parse_config({"eval": {"methods": ["direct"]}})
    rows = asyncio.run(_evaluate_env(env, cfg, questions, {}, {}, EvalOutcome(suites={}), True))
    by = {r["question_id"]: r for r in rows}
    assert by["q1"]["judge_failed"] and by["q1"]["score"] is None and "states no score" in by["q1"]["error"]
    assert [by[f"q{i}"]["score"] for i in (0, 2, 3)] == [0.5, 1.0, 0.0]
    for r in rows:
        r["env_name"] = "e"
    cell = aggregate(rows, env.cfg)[0]
    assert cell["errors"] == 1 and cell["score"] == pytest.approx(0.5)
    # the agent method: an episode whose judgement failed in the rollout's reward stage is the judge's drop
    from prompt_r1.core.trajectory import Trajectory
    from prompt_r1.evaluation.evaluate import agent_prediction
    from prompt_r1.evaluation.scoring import score_predictions

    judged_out = "judge `j` for question 'q1': the verdict states no score"
    episodes = [Trajectory("q0", 0, [], answer="a0", stop_reason="answered"),
                Trajectory("q1", 0, [], answer="a1", stop_reason="answered", error=judged_out),
                Trajectory("q2", 0, [], stop_reason="env_error", error="HTTP 503"),
                Trajectory("q3", 0, [], answer="a3", stop_reason="answered")]
    agent_rows = score_predictions([agent_prediction(q, t, "base") for q, t in zip(questions, episodes)])
    assert [r["judge_failed"] for r in agent_rows] == [False, True, False, False]
    assert "states no score" in agent_rows[1]["error"] and agent_rows[2]["error"] == "HTTP 503"
    assert [r["score"] for r in agent_rows] == [0.5, None, None, 0.0]
    scored = asyncio.run(score_instruction(env, Budget(10), questions, "Be polite."))
    assert scored.per_question == [0.5, None, 1.0, 0.0] and scored.score == pytest.approx(0.5)
    make({"a1": "no idea"}, max_error_rate=0.2)  # the others' verdicts come from the reply cache
    with pytest.raises(ScorerError, match=r"judge `judge:j` failed on 1 of 4 answers.*max_error_rate 0.2"):
        asyncio.run(score_instruction(env, Budget(10), questions, "Be polite."))


def test_a_judge_is_part_of_the_run_identity_and_must_be_declared():
    from prompt_r1.config.experiment import parse_config

    source = {"path": "x.jsonl", "scorer": "judge"}
    base = parse_config({"data": {"sources": [source], "judges": [{"name": "judge"}]}})
    other = parse_config({"data": {"sources": [source], "judges": [{"name": "judge", "rubric": "Rate: {response}"}]}})
    assert base.hash() != other.hash()
    assert parse_config({}).hash() == parse_config({"data": {"judges": []}}).hash()  # no judge: hashes unchanged
    with pytest.raises(Exception, match="names judge `strict`"):
        parse_config({"data": {"sources": [{"path": "x.jsonl", "scorer": "judge:strict"}]}})
    use_judges([base.data.judges[0]])
    try:
        from prompt_r1.data.scorers import scorer_fingerprints

        q = QuestionRow("q", "d", "test", "Q", ["g"], "custom", "f1", scorer="judge:judge")
        first = scorer_fingerprints([q])["judge:judge"]
        use_judges([other.data.judges[0]])
        assert scorer_fingerprints([q])["judge:judge"] != first
    finally:
        close_judges()
    with pytest.raises(ScorerError, match="no judge named `judge`"):
        judge_for("judge:judge")


# -- the real judge model ----------------------------------------------------------------------
@pytest.mark.slow
def test_the_bundled_smollm2_judges_a_batch_in_one_generate_and_its_cache_spares_the_model(tmp_path):
    """The real SmolLM2-135M-Instruct in this process as the judge: a batch of answers is one
    `generate`; each answer gets a score or a JudgeFailure (never a 0 for an unreadable verdict); a
    second judge over the same warehouse gets every verdict from the reply cache, no generate at all."""
    from prompt_r1.api import open_warehouse
    from prompt_r1.config.experiment import load_config
    from prompt_r1.data.scorers import score_many

    cfg = load_config("configs/own-task-judge.yaml")
    judge_cfg = cfg.data.judges[0].model_copy(update={"environment": cfg.data.judges[0].environment.model_copy(
        update={"max_error_rate": 1.0, "price_per_1k_prompt": 0.5, "price_per_1k_completion": 1.5})})
    items = [(QuestionRow(f"q{i}", "rewrites", "test", "Rewrite politely: Send me the report now.",
                          ["Could you please send me the report?"], "custom", "f1", scorer="judge:judge"), answer)
             for i, answer in enumerate(["Could you please send me the report?", "banana", "Send the report.",
                                         "Please, could I have the report now?"])]
    from prompt_r1.core.scorer_deadline import DEFAULT_DEADLINE_S, set_deadline

    with open_warehouse(tmp_path / "wh.duckdb") as wh:
        try:
            set_deadline(cfg.data.scorer_timeout_s)  # the config's: a busy CPU is slow, not a hung judge
            use_judges([judge_cfg], wh)
            first = score_many(items)
            judge = judge_for("judge:judge")
            assert judge.environment().batch_sizes == [4] and judge.model_calls == 4
            for result in first:
                assert isinstance(result, JudgeFailure) or 0.0 <= result.score <= 1.0
                if not isinstance(result, JudgeFailure):
                    assert result.parts["judge_cost_usd"] > 0 and result.note
            use_judges([], wh)
            use_judges([judge_cfg], wh)
            second = score_many(items)
            again = judge_for("judge:judge")
            assert again.model_calls == 0 and again._env is None  # the cache answered: the model never loaded
            assert [getattr(r, "score", str(r)) for r in second] == [getattr(r, "score", str(r)) for r in first]
        finally:
            close_judges()
            set_deadline(DEFAULT_DEADLINE_S)
