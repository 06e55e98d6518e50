"""What the agent did with the environment, per environment x agent method x dataset.

A score says whether the agent's answer was right; Prompt-R1's claim is about how it got there:
over several turns, reading the environment's reply and asking the next thing. So evaluation also
reports, from every agent episode that no environment failure ended: how many environment calls
it made (mean), the share that made a second call, and, where the config names a task's turn
scorer (`reward.turn.scorer`, `prompt_r1.core.turn_credit`), each judged turn's reward: its mean,
the share of episodes earning full credit (1) and some credit (> 0). On the two-hop task the second
agent turn is judged, so full credit = the follow-up call named the bridge entity the first reply
named, some credit = it reused a name the first reply said; with
`prompt_r1.data.first_call:two_hop_turn_rewards` turn 1 is judged too (its reply named the bridge).
A task's indicators (`reward.turn.indicators`) stand beside as shares: the two-hop task's
`first_hop` (the first call asks the first hop, not the whole question) and two leaks that must
not rise with training (`bridge_before_reply`, `answer_unseen`). All of it goes through the one
reward stage (`prompt_r1.rollout.reward_stage`).

A dataset whose questions the scorer does not define (it raises for them, as it must: see
`turn_credit`) gets the call counts alone: a turn reward is never invented as 0 for it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from prompt_r1.config.experiment import Config
from prompt_r1.core.questions import QuestionRow
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.rollout.reward_stage import RewardStage, indicator_shares


def turn_rows(episodes: Sequence[Mapping[str, Any]], questions: Mapping[str, QuestionRow],
              stage: RewardStage | None = None) -> list[dict[str, Any]]:
    """One row per (env_name, method, dataset) of the agent `episodes` (`episode_record`s with
    `env_name`): `episodes` scored (no failure), `calls` (mean), `second_call` (share), and where the
    reward `stage`'s task defines the dataset's questions, per judged turn t (counted from 1):
    `turn<t>_reward`, `turn<t>_full`, `turn<t>_some` (means over the episodes that reached turn t),
    and each of its indicators' share (`reward.turn.indicators`) under its own name.

    >>> from prompt_r1.config.reward import RewardConfig
    >>> q = QuestionRow("q1", "d", "test", "Q?", ["a"], "qa", "f1")
    >>> ep = {"env_name": "e", "method": "agent:base", "dataset": "d", "question_id": "q1", "error": None,
    ...       "env_calls": [{}, {}], "trajectory": {"agent_turns": ["x", "y", "z"], "env_replies": ["r", "s"]}}
    >>> turn_rows([ep], {"q1": q}, None)
    [{'env_name': 'e', 'method': 'agent:base', 'dataset': 'd', 'episodes': 1, 'calls': 2.0, 'second_call': 1.0}]
    """
    cells: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for e in episodes:
        if e.get("error") is None:
            cells[(e["env_name"], e["method"], e["dataset"])].append(e)
    rows = []
    for (env, method, dataset), members in sorted(cells.items()):
        row: dict[str, Any] = {"env_name": env, "method": method, "dataset": dataset, "episodes": len(members),
                               "calls": statistics.fmean(len(e["env_calls"]) for e in members),
                               "second_call": statistics.fmean(len(e["env_calls"]) >= 2 for e in members)}
        if stage is not None:
            by_turn: dict[int, list[float]] = defaultdict(list)
            indicators = []
            for e in members:
                question = questions[e["question_id"]]
                traj = e["trajectory"]
                trajectory = Trajectory(question.question_id, 0, [], agent_turns=list(traj["agent_turns"]),
                                        env_replies=list(traj.get("env_replies", [])), answer=traj.get("answer", ""))
                for t, value in enumerate(stage.turn_rewards(question, trajectory) or []):
                    if value is not None:
                        by_turn[t].append(value)
                indicators.append(stage.indicators(question, trajectory))
            for t, values in sorted(by_turn.items()):
                row.update({f"turn{t + 1}_reward": statistics.fmean(values),
                            f"turn{t + 1}_full": statistics.fmean(v >= 1.0 for v in values),
                            f"turn{t + 1}_some": statistics.fmean(v > 0.0 for v in values)})
            row.update(indicator_shares(indicators))
        rows.append(row)
    return rows


def evaluation_turns(cfg: Config, episodes: Sequence[Mapping[str, Any]],
                     questions: Sequence[QuestionRow]) -> list[dict[str, Any]]:
    """`turn_rows` of an evaluation's agent episodes, through the config's reward stage (lenient: a
    dataset the task's turn scorer does not define gets the call counts alone) when
    `reward.turn.scorer` names one."""
    stage = RewardStage(cfg.reward, strict=False) if cfg.reward.turn.scorer else None
    return turn_rows(episodes, {q.question_id: q for q in questions}, stage)


BASE_KEYS = ("env_name", "method", "dataset", "episodes", "calls", "second_call")


def turn_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: one line per row of `turn_rows`, the judged turns' columns where any row has them.

    >>> print(turn_table([{"env_name": "e", "method": "agent:base", "dataset": "d", "episodes": 4, "calls": 1.5,
    ...                    "second_call": 0.5, "turn2_reward": 0.25, "turn2_full": 0.25, "turn2_some": 0.25}]))
    | environment | method | dataset | episodes | calls (mean) | second call | turn 2 reward | turn 2 full | turn 2 some |
    | --- | --- | --- | --- | --- | --- | --- | --- | --- |
    | e | agent:base | d | 4 | 1.50 | 0.50 | 0.25 | 0.25 | 0.25 |
    """
    turns = sorted({int(k[4:].split("_")[0]) for r in rows for k in r if k.startswith("turn")})
    extra = [(f"turn{t}_{part}", f"turn {t} {label}") for t in turns
             for part, label in (("reward", "reward"), ("full", "full"), ("some", "some"))]
    extra += [(k, k.replace("_", " ")) for k in dict.fromkeys(k for r in rows for k in r if k not in BASE_KEYS
                                                                and not k.startswith("turn"))]
    head = ["environment", "method", "dataset", "episodes", "calls (mean)", "second call"] + [h for _, h in extra]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        cells = [r["env_name"], r["method"], r["dataset"], str(r["episodes"]), f"{r['calls']:.2f}",
                 f"{r['second_call']:.2f}"] + [f"{r[k]:.2f}" if k in r else "-" for k, _ in extra]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
