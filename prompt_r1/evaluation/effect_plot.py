"""What training changed, as a picture (`training_effect.png`), and error bars for bar charts.

The Markdown section "What training changed" (`training_effect.py`) is exact but slow to read;
this draws the same rows: one panel per environment, per dataset a bar for `agent:base` and
one for `agent:trained`, each with its 95% bootstrap interval as an error bar, and the paired
change over the questions both scored written above the pair (an asterisk when its 95% interval
leaves out 0). Held-out environments (the trained agent never drew them) are titled
"(held out)" and their bars hatched. The plot is drawn from `effect_plot_table`, which the tests
check against the rows; `bar_errors` turns a cell's score and interval into matplotlib's `yerr`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prompt_r1.data.rows import OOD
from prompt_r1.evaluation.training_effect import BASE, TRAINED

FILE_NAME = "training_effect.png"


def bar_errors(score: float | None, low: float | None, high: float | None,
               scale: float = 100.0) -> tuple[float, float]:
    """(below, above) the bar for matplotlib's `yerr`, in the bar's unit (`scale` x the score's):
    0 where the cell has no score or no interval, or where the score lies outside it (an interval
    computed elsewhere must not stop the report: matplotlib refuses a negative error).

    >>> bar_errors(0.5, 0.4, 0.75)
    (10.0, 25.0)
    >>> bar_errors(50.0, 40.0, 75.0, scale=1)
    (10.0, 25.0)
    >>> bar_errors(None, None, None), bar_errors(0.5, None, None), bar_errors(0.5, 0.6, 0.7)
    ((0.0, 0.0), (0.0, 0.0), (0.0, 20.0))
    """
    if score is None or low is None or high is None:
        return 0.0, 0.0
    return max(0.0, round((score - low) * scale, 9)), max(0.0, round((high - score) * scale, 9))


def effect_plot_table(rows: Sequence[Mapping[str, Any]],
                      held_out: Mapping[str, bool] | None = None) -> list[dict[str, Any]]:
    """One panel per environment (by name), its datasets in-domain first then OOD, by name.

    Each panel: `env_name`, `held_out` (True / False / None when the split is unknown) and
    `datasets`: a list of {`dataset`, `n`, `base`, `trained` (score, ci_low, ci_high) x 100, None
    for a missing value, and `change` (diff, ci_low, ci_high) x 100 or None}.

    >>> rows = [{"env_name": "e", "dataset": "d", "n": 4, "base": (0.25, 0.0, 0.5), "trained": (0.5, 0.25, 0.75),
    ...          "change": {"diff": 0.25, "ci_low": 0.0, "ci_high": 0.5}, "shares": {}}]
    >>> effect_plot_table(rows, {"e": True})
    [{'env_name': 'e', 'held_out': True, 'datasets': [{'dataset': 'd', 'n': 4, 'base': (25.0, 0.0, 50.0), 'trained': (50.0, 25.0, 75.0), 'change': (25.0, 0.0, 50.0)}]}]
    """
    def x100(values: Sequence[Any]) -> tuple[float | None, ...]:
        return tuple(None if v is None else round(v * 100, 9) for v in values)

    panels: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        c = r.get("change")
        panels.setdefault(r["env_name"], []).append({
            "dataset": r["dataset"], "n": r["n"], "base": x100(r["base"]), "trained": x100(r["trained"]),
            "change": x100((c["diff"], c["ci_low"], c["ci_high"])) if c else None})
    return [{"env_name": env, "held_out": (held_out or {}).get(env),
             "datasets": sorted(cells, key=lambda d: (d["dataset"] in OOD, d["dataset"]))}
            for env, cells in sorted(panels.items())]


def _change_text(change: tuple[float | None, ...] | None) -> str:
    """The label above a pair: the paired change x 100, `*` when its interval leaves out 0.

    >>> _change_text((25.0, 5.0, 45.0)), _change_text((-2.5, -10.0, 5.0)), _change_text(None)
    ('+25.0*', '-2.5', 'n/a')
    """
    if change is None or change[0] is None:
        return "n/a"
    diff, low, high = change
    sure = low is not None and high is not None and (low > 0 or high < 0)
    return f"{diff:+.1f}" + ("*" if sure else "")


def training_effect_figure(table: Sequence[Mapping[str, Any]]):
    """The matplotlib figure of `effect_plot_table`'s panels (one axis per environment)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = [max(3.0, 1.1 * len(p["datasets"]) + 1.2) for p in table]
    fig, axes = plt.subplots(1, len(table), figsize=(sum(widths), 4.4), squeeze=False, sharey=True,
                             gridspec_kw={"width_ratios": widths})
    for ax, panel in zip(axes[0], table):
        cells = panel["datasets"]
        xs = range(len(cells))
        hatch = "//" if panel["held_out"] else None
        for offset, key, colour in ((-0.2, "base", "#9aa5b1"), (0.2, "trained", "#1f77b4")):
            heights = [c[key][0] or 0.0 for c in cells]  # no score (every call failed): no bar
            errors = [bar_errors(*c[key], scale=1) for c in cells]
            ax.bar([x + offset for x in xs], heights, 0.4, color=colour, hatch=hatch, edgecolor="black",
                   linewidth=0.5, label=BASE if key == "base" else TRAINED,
                   yerr=[[e[0] for e in errors], [e[1] for e in errors]], capsize=3,
                   error_kw={"elinewidth": 0.9, "ecolor": "black"})
        for x, c in zip(xs, cells):
            top = max((v for v in (*c["base"][:3], *c["trained"][:3]) if v is not None), default=0.0)
            ax.annotate(_change_text(c["change"]), (x, top), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=7)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{c['dataset']}\n(n={c['n']})" for c in cells], rotation=30, ha="right", fontsize=7)
        held = {True: " (held out)", False: " (trained on)"}.get(panel["held_out"], "")
        ax.set_title(panel["env_name"] + held, fontsize=9, color="#b03a2e" if panel["held_out"] else "black")
        ax.set_ylim(0, 110)
    axes[0][0].set_ylabel("primary metric x 100 (95% interval)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("What training changed: agent:base vs agent:trained (above a pair: paired change, "
                 "* = its 95% interval excludes 0; hatched = held-out environment)", fontsize=8)
    fig.tight_layout()
    return fig


def plot_training_effect(rows: Sequence[Mapping[str, Any]], out_dir: Path,
                         held_out: Mapping[str, bool] | None = None) -> Path | None:
    """Write `training_effect.png` from `effect_rows` rows; None (no file) when there are none."""
    if not rows:
        return None
    import matplotlib.pyplot as plt

    fig = training_effect_figure(effect_plot_table(rows, held_out))
    path = out_dir / FILE_NAME
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
