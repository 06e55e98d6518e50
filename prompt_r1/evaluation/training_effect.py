"""What training changed: `agent:base` beside `agent:trained`, per environment and dataset.

The question a reader of an evaluation asks first is whether training helped, and how. The
answer is spread over three parts of the report (the wide table's scores with their intervals,
the paired comparison of the two checkpoints on the same questions, and what the agent did with
the environment); this joins them into one row per (environment, dataset): both scores with
their 95% intervals, the paired change with its interval and p-value, and each interaction share
before -> after (the share with a second call, and where the task's turn scorer judges a turn,
the shares of full and some credit: on the two-hop task, the follow-up call names the bridge
entity / reuses a name of the first reply), and each of the task's indicators (the two-hop task's
first-call share `first_hop` and its two leaks).

Any other agent the evaluation scored (`eval.agent_checkpoints`' `LABEL=SPEC`, e.g. a shipped
adapter) gets the same rows against `agent:base` (`after=`): what that agent's training changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BASE, TRAINED = "agent:base", "agent:trained"
# A turns row's keys that are not shares of episodes (`prompt_r1.evaluation.turns.turn_rows`)
NOT_SHARES = ("env_name", "method", "dataset", "episodes", "calls")


def is_share(key: str) -> bool:
    """Whether a turns-row key is a share shown before -> after: the second call, a judged turn's
    full / some credit, or a task indicator (not a turn's mean reward, nor the counts).

    >>> [k for k in ("calls", "second_call", "turn2_reward", "turn2_full", "turn1_some", "first_hop") if is_share(k)]
    ['second_call', 'turn2_full', 'turn1_some', 'first_hop']
    """
    if key in NOT_SHARES:
        return False
    return key.endswith(("_full", "_some")) if key.startswith("turn") else True


def effect_rows(results: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]],
                turns: Sequence[Mapping[str, Any]] = (), after: str = TRAINED) -> list[dict[str, Any]]:
    """One row per (env_name, dataset) that `agent:base` and the `after` agent were both scored on:
    `n`, `base` / `trained` (the `after` agent's score, ci_low, ci_high), `change` (the paired
    comparison row of `after` vs `base`: `comparisons` made with `after` as the reference; None where
    no question was scored by both), and `shares`: name -> (base, after) for every `is_share` key
    both have.

    >>> res = [{"env_name": "e", "dataset": "d", "method": m, "n": 2, "score": s, "ci_low": 0.0, "ci_high": 1.0}
    ...        for m, s in ((BASE, 0.25), (TRAINED, 0.5))]
    >>> cmp = [{"env_name": "e", "method": BASE, "dataset": "d", "diff": 0.25, "ci_low": 0.0, "ci_high": 0.5,
    ...         "p_value": 0.5, "n": 2, "changed": 1, "dropped": 0}]
    >>> trn = [{"env_name": "e", "method": m, "dataset": "d", "second_call": v, "turn2_full": v / 2}
    ...        for m, v in ((BASE, 0.5), (TRAINED, 1.0))]
    >>> row = effect_rows(res, cmp, trn)[0]
    >>> row["base"], row["trained"], row["change"]["diff"], row["shares"]
    ((0.25, 0.0, 1.0), (0.5, 0.0, 1.0), 0.25, {'second_call': (0.5, 1.0), 'turn2_full': (0.25, 0.5)})
    """
    scored = {(r["env_name"], r["dataset"], r["method"]): r for r in results}
    changes = {(c["env_name"], c["dataset"]): c for c in comparisons if c["method"] == BASE}
    did = {(t["env_name"], t["dataset"], t["method"]): t for t in turns}
    rows = []
    for env, dataset, method in scored:
        if method != BASE or (env, dataset, after) not in scored:
            continue
        base, trained = scored[(env, dataset, BASE)], scored[(env, dataset, after)]
        before, later = did.get((env, dataset, BASE), {}), did.get((env, dataset, after), {})
        names = [k for k in before if is_share(k) and k in later and before[k] is not None and later[k] is not None]
        change = changes.get((env, dataset))
        rows.append({"env_name": env, "dataset": dataset, "n": min(base["n"], trained["n"]),
                     "base": (base["score"], base["ci_low"], base["ci_high"]),
                     "trained": (trained["score"], trained["ci_low"], trained["ci_high"]),
                     "change": change if change is not None and change["diff"] is not None else None,
                     "shares": {k: (before[k], later[k]) for k in names}})
    return rows


def _score(triple: tuple[Any, Any, Any]) -> str:
    score, low, high = triple
    if score is None:
        return "n/a"
    return f"{score * 100:.1f} [{low * 100:.1f}, {high * 100:.1f}]" if low is not None else f"{score * 100:.1f}"


def share_label(name: str) -> str:
    """`second_call` -> "second call", `turn2_full` -> "turn 2 full credit", an indicator by its
    name: `first_hop` -> "first hop"."""
    if name.startswith("turn"):
        turn, part = name[4:].split("_")
        return f"turn {turn} {part} credit"
    return name.replace("_", " ")


def effect_table(rows: Sequence[Mapping[str, Any]], after: str = TRAINED) -> str:
    """Markdown: one line per `effect_rows` row; the interaction shares as base -> `after`.

    >>> print(effect_table([{"env_name": "e", "dataset": "d", "n": 40, "base": (0.25, 0.1, 0.4),
    ...     "trained": (0.5, 0.3, 0.7), "change": {"diff": 0.25, "ci_low": 0.05, "ci_high": 0.45,
    ...     "p_value": 0.02, "changed": 9}, "shares": {"second_call": (0.8, 1.0)}}]), end="")
    | environment | dataset | n | agent:base | agent:trained | change [95% CI] | p | answers differ | second call |
    |---|---|---:|---:|---:|---:|---:|---:|---:|
    | e | d | 40 | 25.0 [10.0, 40.0] | 50.0 [30.0, 70.0] | +25.0 [+5.0, +45.0] | 0.02 | 9 | 0.80 -> 1.00 |
    """
    if not rows:
        return f"(no dataset has both `{BASE}` and `{after}`)\n"
    names = list(dict.fromkeys(k for r in rows for k in r["shares"]))
    head = (["environment", "dataset", "n", BASE, after, "change [95% CI]", "p", "answers differ"]
            + [share_label(k) for k in names])
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in rows:
        c = r["change"]
        change = (f"{c['diff'] * 100:+.1f} [{c['ci_low'] * 100:+.1f}, {c['ci_high'] * 100:+.1f}]", f"{c['p_value']:.3g}",
                  str(c["changed"])) if c else ("n/a", "", "")
        shares = [f"{r['shares'][k][0]:.2f} -> {r['shares'][k][1]:.2f}" if k in r["shares"] else "-" for k in names]
        lines.append("| " + " | ".join([r["env_name"], r["dataset"], str(r["n"]), _score(r["base"]),
                                        _score(r["trained"]), *change, *shares]) + " |")
    return "\n".join(lines) + "\n"
