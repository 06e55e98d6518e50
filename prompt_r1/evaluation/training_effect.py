"""What training changed: `agent:base` beside `agent:trained`, per environment and dataset.

The question a reader of an evaluation asks first is whether training helped, and how. The
answer is spread over three parts of the report (the wide table's scores with their intervals,
the paired comparison of the two checkpoints on the same questions, and what the agent did with
the environment); this joins them into one row per (environment, dataset): both scores with
their 95% intervals, the paired change with its interval and p-value, and each interaction share
before -> after (the share with a second call, and where the task's turn scorer judges a turn,
the shares of full and some credit: on the two-hop task, the follow-up call names the bridge
entity / reuses a name of the first reply).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BASE, TRAINED = "agent:base", "agent:trained"


def effect_rows(results: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]],
                turns: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row per (env_name, dataset) that both checkpoints were scored on: `n`, `base` /
    `trained` (score, ci_low, ci_high), `change` (the paired comparison row of `trained` vs `base`,
    None where no question was scored by both), and `shares`: name -> (base, trained) for
    `second_call` and each judged turn's `turn<t>_full` / `turn<t>_some` that both have.

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
        if method != BASE or (env, dataset, TRAINED) not in scored:
            continue
        base, trained = scored[(env, dataset, BASE)], scored[(env, dataset, TRAINED)]
        before, after = did.get((env, dataset, BASE), {}), did.get((env, dataset, TRAINED), {})
        names = [k for k in before if (k == "second_call" or k.endswith(("_full", "_some"))) and k in after]
        change = changes.get((env, dataset))
        rows.append({"env_name": env, "dataset": dataset, "n": min(base["n"], trained["n"]),
                     "base": (base["score"], base["ci_low"], base["ci_high"]),
                     "trained": (trained["score"], trained["ci_low"], trained["ci_high"]),
                     "change": change if change is not None and change["diff"] is not None else None,
                     "shares": {k: (before[k], after[k]) for k in names}})
    return rows


def _score(triple: tuple[Any, Any, Any]) -> str:
    score, low, high = triple
    if score is None:
        return "n/a"
    return f"{score * 100:.1f} [{low * 100:.1f}, {high * 100:.1f}]" if low is not None else f"{score * 100:.1f}"


def share_label(name: str) -> str:
    """`second_call` -> "second call", `turn2_full` -> "turn 2 full credit"."""
    if name == "second_call":
        return "second call"
    turn, part = name[4:].split("_")
    return f"turn {turn} {part} credit"


def effect_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: one line per `effect_rows` row; the interaction shares as base -> trained.

    >>> print(effect_table([{"env_name": "e", "dataset": "d", "n": 40, "base": (0.25, 0.1, 0.4),
    ...     "trained": (0.5, 0.3, 0.7), "change": {"diff": 0.25, "ci_low": 0.05, "ci_high": 0.45,
    ...     "p_value": 0.02, "changed": 9}, "shares": {"second_call": (0.8, 1.0)}}]), end="")
    | environment | dataset | n | agent:base | agent:trained | change [95% CI] | p | answers differ | second call |
    |---|---|---:|---:|---:|---:|---:|---:|---:|
    | e | d | 40 | 25.0 [10.0, 40.0] | 50.0 [30.0, 70.0] | +25.0 [+5.0, +45.0] | 0.02 | 9 | 0.80 -> 1.00 |
    """
    if not rows:
        return "(no dataset has both `agent:base` and `agent:trained`)\n"
    names = list(dict.fromkeys(k for r in rows for k in r["shares"]))
    head = (["environment", "dataset", "n", BASE, TRAINED, "change [95% CI]", "p", "answers differ"]
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
