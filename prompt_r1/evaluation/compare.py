"""Paired comparisons of the trained agent against every other method, and accuracy versus cost
(dollars per question and per correct answer, the Pareto front of accuracy against cost).

Two methods are compared on the questions both scored (a question whose environment call failed
under either method is left out and counted as `dropped`): the difference of their primary
scores, its 95% bootstrap interval and a sign-flip p-value (`prompt_r1.evaluation.stats`), and how many
of those questions got a different final answer (a trained agent can change answers without
changing a score). One row per
environment x other method x dataset, plus one per group of datasets (in-domain, OOD), where the
difference is the mean of the per-dataset differences, as in the paper's averages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prompt_r1.evaluation.stats import cell_seed, paired_comparison
from prompt_r1.data.rows import OOD

REFERENCE = "agent:trained"


def paired_comparisons(predictions: list[dict[str, Any]], reference: str = REFERENCE) -> list[dict[str, Any]]:
    """Rows (env_name, method, dataset, diff, ci_low, ci_high, p_value, n, changed, dropped) comparing
    `reference` with each other method on the same questions; [] when `reference` did not run.

    >>> rows = [{"env_name": "e", "method": m, "dataset": "nq", "question_id": q, "score": s, "error": None}
    ...         for m, scores in (("agent:trained", [1, 1, 0]), ("direct", [0, 1, 0])) for q, s in enumerate(scores)]
    >>> [(r["dataset"], round(r["diff"], 3), r["n"], r["changed"], r["dropped"]) for r in paired_comparisons(rows)]
    [('nq', 0.333, 3, 0, 0), ('avg in_domain', 0.333, 3, 0, 0)]
    """
    by_cell: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for p in predictions:
        by_cell[(p["env_name"], p["method"], p["dataset"])][p["question_id"]] = p
    out: list[dict[str, Any]] = []
    envs = sorted({e for e, m, _ in by_cell if m == reference})
    for env in envs:
        others = sorted({m for e, m, _ in by_cell if e == env and m != reference})
        for method in others:
            strata: dict[str, tuple[list[float], list[float]]] = {}
            dropped: dict[str, int] = {}
            changed: dict[str, int] = {}
            datasets = sorted({d for e, m, d in by_cell if e == env and m == method and (e, reference, d) in by_cell},
                              key=lambda d: (d in OOD, d))
            for d in datasets:
                a, b, changed[d], dropped[d] = paired_scores(by_cell[(env, reference, d)], by_cell[(env, method, d)])
                strata[d] = (a, b)
                out.append(_row(env, method, d, [strata[d]], changed[d], dropped[d]))
            for group in ("in_domain", "ood"):
                members = [d for d in datasets if (d in OOD) == (group == "ood") and strata[d][0]]
                if members:
                    out.append(_row(env, method, f"avg {group}", [strata[d] for d in members],
                                    sum(changed[d] for d in members), sum(dropped[d] for d in members)))
    return out


def paired_scores(ref: dict[str, dict[str, Any]], oth: dict[str, dict[str, Any]]
                  ) -> tuple[list[float], list[float], int, int]:
    """Two methods' scores on the questions both scored (question id -> prediction row each), in
    the same order, how many of those got a different answer, and how many were dropped (asked of
    one method only, or a failed environment call under either)."""
    ok = [q for q in sorted(set(ref) & set(oth)) if not ref[q].get("error") and not oth[q].get("error")
          and ref[q]["score"] is not None and oth[q]["score"] is not None]
    changed = sum(ref[q].get("prediction") != oth[q].get("prediction") for q in ok)
    return ([ref[q]["score"] for q in ok], [oth[q]["score"] for q in ok], changed, len(set(ref) | set(oth)) - len(ok))


def _row(env: str, method: str, dataset: str, strata: list[tuple[list[float], list[float]]],
         changed: int, dropped: int) -> dict[str, Any]:
    stats = paired_comparison([a for a, _ in strata], [b for _, b in strata],
                              seed=cell_seed(env, REFERENCE, method, dataset))
    return {"env_name": env, "reference": REFERENCE, "method": method, "dataset": dataset, **stats,
            "changed": changed, "dropped": dropped}


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: difference x 100 with its 95% interval and p-value, per environment."""
    if not rows:
        return "(no `agent:trained` rows to compare)\n"
    lines = ["| environment | vs method | dataset | Δ (trained − method) | 95% CI | p | n | answers differ | dropped |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["diff"] is None:
            lines.append(f"| {r['env_name']} | {r['method']} | {r['dataset']} | n/a | | | 0 | 0 | {r['dropped']} |")
            continue
        lines.append(f"| {r['env_name']} | {r['method']} | {r['dataset']} | {r['diff'] * 100:+.1f} | "
                     f"[{r['ci_low'] * 100:+.1f}, {r['ci_high'] * 100:+.1f}] | {r['p_value']:.3g} | "
                     f"{r['n']} | {r['changed']} | {r['dropped']} |")
    return "\n".join(lines) + "\n"


def cost_points(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (env, method): mean primary score over its datasets, environment tokens and dollars per
    question (failed rows' tokens count: they were spent), the number of questions scored correct
    (the sum of their primary scores: a count of right answers under EM and substring match,
    partial credit under F1 and SSim) and dollars per correct answer (all dollars / correct; None
    when nothing was correct).

    >>> pts = cost_points([{"env_name": "e", "method": "direct", "score": 0.5, "n": 2, "env_prompt_tokens": 10,
    ...                     "env_completion_tokens": 6, "cost_usd": 0.02, "errors": 0}])
    >>> pts[0]["tokens_per_question"], pts[0]["usd_per_question"], pts[0]["score"], pts[0]["correct"], pts[0]["usd_per_correct"]
    (8.0, 0.01, 0.5, 1.0, 0.02)
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[(r["env_name"], r["method"])].append(r)
    out = []
    for (env, method), rs in sorted(groups.items()):
        n = sum(r["n"] for r in rs)
        scored = [r["score"] for r in rs if r["score"] is not None]
        correct = sum(r["score"] * (r["n"] - r.get("errors", 0)) for r in rs if r["score"] is not None)
        cost = sum(r["cost_usd"] for r in rs)
        out.append({"env_name": env, "method": method, "questions": n,
                    "score": sum(scored) / len(scored) if scored else None,
                    "tokens_per_question": sum(r["env_prompt_tokens"] + r["env_completion_tokens"] for r in rs) / max(1, n),
                    "cost_usd": cost, "usd_per_question": cost / max(1, n), "correct": correct,
                    "usd_per_correct": cost / correct if correct > 0 else None})
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (cost, score) point, whether no other point is at most as costly and at least as
    good and strictly better in one of the two (equal points are both on the front).

    One sweep from the cheapest: a point is on the front when it has the best score of its cost
    and beats every cheaper point's score.

    >>> pareto_front([(1, 0.5), (2, 0.4), (2, 0.7), (0, 0.1), (3, 0.7)])
    [True, False, True, True, False]
    """
    order = sorted(range(len(points)), key=lambda i: points[i][0])
    front = [False] * len(points)
    best_cheaper = float("-inf")
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and points[order[end]][0] == points[order[start]][0]:
            end += 1
        same_cost = order[start:end]
        top = max(points[i][1] for i in same_cost)
        for i in same_cost:
            front[i] = points[i][1] == top and top > best_cheaper
        best_cheaper = max(best_cheaper, top)
        start = end
    return front


def plot_accuracy_vs_cost(results: list[dict[str, Any]], out_dir: Path,
                          held_out: Mapping[str, bool] | None = None) -> Path:
    """Scatter per environment and method: mean primary score against tokens and dollars per
    question, the Pareto front of each panel drawn as a line with ringed points, held-out
    environments (`held_out`: env name -> held out) as diamonds, trained-on ones as circles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held_out = held_out or {}
    pts = [p for p in cost_points(results) if p["score"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "tokens_per_question", "environment tokens per question"),
                           (axes[1], "usd_per_question", "environment USD per question")):
        front = pareto_front([(p[key], p["score"]) for p in pts])
        for p, on_front in zip(pts, front):
            held = held_out.get(p["env_name"])
            ax.scatter(p[key], p["score"] * 100, marker="D" if held else "o")
            if on_front:
                ax.scatter(p[key], p["score"] * 100, s=160, facecolors="none", edgecolors="black", linewidths=1)
            ax.annotate(f"{p['env_name']}{' (held out)' if held else ''}:{p['method']}", (p[key], p["score"] * 100),
                        fontsize=7)
        line = sorted((p[key], p["score"] * 100) for p, f in zip(pts, front) if f)
        if line:
            ax.step([x for x, _ in line], [y for _, y in line], where="post", color="black", linewidth=0.8,
                    label="Pareto front (ringed)")
        ax.scatter([], [], marker="D", color="grey", label="held-out environment")
        ax.scatter([], [], marker="o", color="grey", label="trained-on environment")
        ax.legend(fontsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("mean primary metric x 100")
    fig.suptitle("accuracy versus environment cost")
    fig.tight_layout()
    path = out_dir / "accuracy_vs_cost.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
