"""benchmarks/experiments/learning.py's report of the mechanism on the compositional task: the shares of probe
trajectories with a second call / one that uses the first reply, and the best constant answer
per relation, computed from probe rows (no model runs here).

The constant baseline is checked against a brute force written independently: every string of
the golds' words scored by token F1 over the questions.
"""

from __future__ import annotations

import itertools
import statistics
from types import SimpleNamespace

import pytest

learning = pytest.importorskip("benchmarks.experiments.learning")

from prompt_r1.core.metrics import f1_score  # noqa: E402
from prompt_r1.data.compositional import generate  # noqa: E402

CONTINENT = [q for q in generate(0) if q.chain == "capital>continent"][:12]


def _turns(*prompts: str, answer: str = "Asia") -> list[str]:
    return [f"<think>t</think><interaction_prompt>{p}</interaction_prompt>" for p in prompts] + \
        [f"<think>t</think><answer>{answer}</answer>"]


def test_interaction_reads_the_calls_and_the_follow_up():
    q = next(q for q in CONTINENT if q.source == "Tokyo")
    question = SimpleNamespace(question=q.question, golds=list(q.answers))
    two = SimpleNamespace(agent_turns=_turns(q.question, "On which continent is Japan?"),
                          env_replies=["The capital of Japan is Tokyo.", "Asia"], answer="Asia")
    row = learning.interaction(two, question)
    assert (row["calls"], row["second_call"], row["uses_reply"], row["names_bridge"]) == (2, True, True, True)
    assert row["relation"] == "continent"
    # passed on whole, answered from a reply: no decomposition, no leak
    assert (row["first_hop"], row["bridge_before_reply"], row["answer_unseen"]) == (False, False, False)
    split = SimpleNamespace(agent_turns=_turns(q.hops[0].question, "On which continent is Japan?"),
                            env_replies=["Japan.", "It is in Europe."], answer="Asia")
    assert (lambda r: (r["first_hop"], r["answer_unseen"]))(learning.interaction(split, question)) == (True, True)
    one = SimpleNamespace(agent_turns=_turns(q.question), env_replies=["The capital of Japan is Tokyo."], answer="Asia")
    assert learning.interaction(one, question)["second_call"] is False
    # a prompt in the last turn was never sent: it is no call
    unsent = SimpleNamespace(agent_turns=_turns(q.question, "Japan?")[:2], env_replies=["Japan."], answer="")
    assert learning.interaction(unsent, question)["calls"] == 1
    single_hop = SimpleNamespace(question="What is the capital of France?", golds=["Paris"])
    assert learning.interaction(one, single_hop)["uses_reply"] is None


def _rows(scores, second, uses, first_hop=False, leak=False):
    return [{"question_id": f"q{i}", "answer_score": s, "format_valid": 1.0, "second_call": c, "calls": 1 + c,
             "uses_reply": u, "names_bridge": u, "relation": "continent", "golds": list(q.answers),
             "first_hop": first_hop, "bridge_before_reply": leak, "answer_unseen": False}
            for i, (q, s, c, u) in enumerate(zip(CONTINENT, scores, second, uses))]


def test_mechanism_shares():
    rows = _rows([0, 1, 0, 1], [True, True, False, False], [True, False, False, False])
    m = learning.mechanism(rows)
    assert (m["second_call"], m["uses_reply"], m["answer_score"], m["mean_calls"]) == (0.5, 0.25, 0.5, 1.5)


def test_best_constant_is_the_brute_force_best():
    rows = _rows([0] * len(CONTINENT), [False] * 12, [False] * 12)
    got = learning.best_constant(rows)
    words = sorted({w for r in rows for g in r["golds"] for w in g.split()})
    phrases = {" ".join(p) for k in (1, 2, 3) for p in itertools.permutations(words, k)}
    brute = max(statistics.fmean(f1_score(c, r["golds"]) for r in rows) for c in phrases)
    assert got["score"] == pytest.approx(brute, abs=1e-3)
    assert got["score"] == pytest.approx(statistics.fmean(f1_score(got["answer"], r["golds"]) for r in rows), abs=1e-3)


def test_best_constant_stated_case():
    """Two Europe, one Asia: "Europe" scores 2/3; hedging with "Europe Asia" scores 2/3 as well
    (F1 2/3 on each); nothing scores more. South / North America: "America North South" has
    precision 2/3 and recall 1 on each, F1 0.8, above "America" (2/3)."""
    rows = [{"golds": ["Europe"]}, {"golds": ["Europe"]}, {"golds": ["Asia"]}]
    assert learning.best_constant(rows)["score"] == pytest.approx(0.667, abs=1e-3)
    assert learning.best_constant([{"golds": ["South America"]}, {"golds": ["North America"]}]) == \
        {"answer": "America North South", "score": pytest.approx(0.8, abs=1e-3)}


def test_judge_reports_the_mechanism_and_the_constant():
    n = len(CONTINENT)
    before = _rows([0.0] * n, [False] * n, [False] * n)
    after = _rows([1.0] * n, [True] * n, [True] * n)
    results = {"trained": {"probe_before": before, "probe_after": after, "train_s": 60.0},
               "control": {"probe_before": before, "probe_after": before, "train_s": 60.0}}
    verdict = learning.judge(results)
    assert verdict["mechanism"]["trained"]["before"]["uses_reply"] == 0.0
    assert verdict["mechanism"]["trained"]["after"]["uses_reply"] == 1.0
    assert verdict["mechanism"]["control"]["after"]["second_call"] == 0.0
    entry = verdict["by_relation"]["continent"]
    assert (entry["n"], entry["before"], entry["after"]) == (n, 0.0, 1.0)
    assert 0 < entry["best_constant"]["score"] < 1
    text = learning.report(verdict)
    assert "second call 0.0 -> 1.0" in text and "best constant" in text


def _arm(scores_before, scores_after, train_s=60.0, first_hop=False, leak=False):
    n = len(scores_before)
    return {"probe_before": _rows(scores_before, [False] * n, [False] * n),
            "probe_after": _rows(scores_after, [True] * n, [True] * n, first_hop, leak), "train_s": train_s}


def test_the_first_call_criteria_bind_only_when_registered():
    n = len(CONTINENT)
    zeros, strong = [0.0] * n, [1.0 if i % 2 == 0 else 0.0 for i in range(n)]
    control = _arm(zeros, zeros)
    criteria = {**learning.CRITERIA, "min_first_call_share": 0.5, "max_leak_rise": 0.05}
    decomposes = {"trained": _arm(zeros, strong, first_hop=True), "trained-seed1": _arm(zeros, strong, first_hop=True),
                  "control": control}
    assert learning.judge(decomposes, criteria)["passed"]
    passes_on = {**decomposes, "trained-seed1": _arm(zeros, strong)}
    assert not learning.judge(passes_on, criteria)["checks"]["first_call_share"]
    assert "first_call_share" not in learning.judge(passes_on)["checks"] and learning.judge(passes_on)["passed"]
    leaking = {**decomposes, "trained": _arm(zeros, strong, first_hop=True, leak=True)}
    verdict = learning.judge(leaking, criteria)
    assert not verdict["checks"]["no_leak_rise"] and not verdict["passed"]
    assert "first call asks the first hop 0.0 -> 1.0" in learning.report(verdict)


def test_two_seeds_pass_only_when_each_is_above_zero_and_their_mean_reaches_the_bar():
    n = len(CONTINENT)
    zeros = [0.0] * n
    strong = [1.0 if i % 2 == 0 else 0.0 for i in range(n)]           # +0.5 on half the questions
    weak = [1.0 if i == 0 else 0.0 for i in range(n)]                   # one question better: interval reaches 0
    none = zeros
    control = _arm(zeros, zeros)
    both = learning.judge({"trained": _arm(zeros, strong), "trained-seed1": _arm(zeros, strong), "control": control})
    assert both["passed"] and set(both["seed_gains"]) == {"trained", "trained-seed1"}
    one_weak = learning.judge({"trained": _arm(zeros, strong), "trained-seed1": _arm(zeros, weak), "control": control})
    assert not one_weak["checks"]["answer_gain"] and not one_weak["passed"]
    low_mean = learning.judge({"trained": _arm(zeros, weak), "trained-seed1": _arm(zeros, none), "control": control},
                              {**learning.CRITERIA, "min_answer_gain": 0.15})
    assert low_mean["mean_gain"] < 0.15 and not low_mean["passed"]
    slow = learning.judge({"trained": _arm(zeros, strong), "trained-seed1": _arm(zeros, strong, train_s=3601),
                           "control": control})
    assert not slow["checks"]["wall_time"]
    assert "trained-seed1 answer-score change" in learning.report(both) and "names the bridge" in learning.report(both)
    assert learning.arm_runs(["control", "trained"], [3, 5, 7]) == {"control": 3, "trained": 3, "trained-seed5": 5,
                                                                     "trained-seed7": 7}


def test_the_control_shuffles_each_outcome_with_its_turn_rewards():
    from prompt_r1.core.reward import RewardBreakdown
    from prompt_r1.core.trajectory import Trajectory

    fit = learning.ProbedSession._fit
    assert fit([None, 1.0], 3) == [None, 1.0, None] and fit([None, 1.0, 0.5], 2) == [None, 1.0] and fit([], 2) == []
    session = object.__new__(type("C", (learning.ProbedSession,), {"shuffle_rewards": True}))
    session.cfg = learning.load_config(learning.ROOT / "configs" / "smoke.yaml")
    session.step = 0
    trajectories = [Trajectory("q", i, [], agent_turns=["a", "b"], reward=RewardBreakdown(1.0, 0.0, float(i)),
                               turn_rewards=[None, float(i) / 10]) for i in range(10)]
    base = learning.TrainingSession.score
    try:
        learning.TrainingSession.score = lambda self, ts: None   # the rewards above stand for the scored ones
        session.score(trajectories)
    finally:
        learning.TrainingSession.score = base
    pairs = [(t.reward.total, t.turn_rewards[1]) for t in trajectories]
    assert sorted(pairs) == [(float(i), i / 10) for i in range(10)]          # moved together
    assert [p[0] for p in pairs] != [float(i) for i in range(10)]            # and moved


def test_arms_probed_under_other_question_ids_are_paired_by_their_untrained_probe():
    """Arms of one experiment on either side of a change of question ids (rows keyed by text, not
    line) pair row by row when their untrained probes match; a probe that differs still refuses."""
    n = len(CONTINENT)
    zeros, ones = [0.0] * n, [1.0] * n
    trained, control = _arm(zeros, ones), _arm(zeros, zeros)
    for part in ("probe_before", "probe_after"):
        control[part] = [{**row, "question_id": "new-" + row["question_id"]} for row in control[part]]
    verdict = learning.judge({"trained": trained, "control": control})
    assert verdict["trained_vs_control"]["diff"] == pytest.approx(1.0)
    other = dict(control, probe_before=[{**r, "golds": ["elsewhere"]} for r in control["probe_before"]])
    with pytest.raises(ValueError, match="different probe questions"):
        learning.judge({"trained": trained, "control": other})


def test_the_stop_rule_stops_an_arm_whose_first_calls_never_decompose():
    from prompt_r1.training.hooks import StepResult

    rule = {"metric": "indicator_first_hop", "first_step": 2, "last_step": 3, "below": 0.10}
    true = {"reward_mean": 0.0, "answer_score": 0.0, "format_valid_rate": 1.0, "turns": 2.0}
    for shares, stops in (([0.0, 0.05, 0.1], True), ([0.0, 0.1, 0.1], False), ([0.5, None, None], True)):
        hooks = learning.CurveHooks(SimpleNamespace(true_stats=true), 5, rule)
        raised = False
        try:
            for step, share in enumerate(shares):
                hooks.on_step(StepResult(step, {} if share is None else {"indicator_first_hop": share}, []))
        except learning.ArmStopped as stop:
            raised = "below 0.1" in str(stop)
        assert raised == stops and hooks.curve[-1].get("indicator_first_hop") == shares[-1]
