"""Turn evaluation rows into what people read: tables (Markdown, CSV), plots (PNG), costs.

The wide table is one block per environment: datasets as rows, methods as columns, the
primary metric x 100 in each cell with its 95% bootstrap interval over questions, the paper's averages (in-domain, OOD) and the change of
each agent method over `direct`. Plots: per-environment bars with and without the agent, and
the OOD averages across environments (the transfer picture), and accuracy versus environment
cost; with both agent checkpoints, what training changed
(`training_effect.png`, `prompt_r1.evaluation.effect_plot`). Bars carry their 95% interval as an
error bar. Given the per-question rows, paired comparisons of `agent:trained` with every other method
(`prompt_r1.evaluation.compare`). Given the environment split (`prompt_r1.evaluation.heldout`),
each environment is marked held out or trained on (block titles, a `held_out` column in
results.csv, the cost table) and the trained agent's differences on held-out environments get
their own section.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prompt_r1.data.rows import OOD

if TYPE_CHECKING:
    from prompt_r1.evaluation.heldout import EnvSplit

REPORT_MARKER = ".prompt-r1-report.json"  # marks folders an evaluation report may be written over (--overwrite)
LONG_COLUMNS = ["env_name", "dataset", "method", "n", "primary_metric", "score", "em", "f1",
                "substring", "ssim", "ci_low", "ci_high", "errors", "env_prompt_tokens", "env_completion_tokens",
                "cost_usd", "held_out"]


def _methods(results: list[dict[str, Any]]) -> list[str]:
    order = {"direct": 0, "cot": 1, "agent_only": 2, "agent": 3}
    return sorted({r["method"] for r in results}, key=lambda m: (order.get(m.split(":")[0], 9), m))


def averages(results: list[dict[str, Any]], env_name: str, method: str) -> dict[str, float | None]:
    """Mean primary score over in-domain and OOD datasets (None when a group is absent)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in results:
        if r["env_name"] == env_name and r["method"] == method and r["score"] is not None:  # None: all failed
            groups["ood" if r["dataset"] in OOD else "in_domain"].append(r["score"])
    return {g: (sum(v) / len(v) if v else None) for g, v in (("in_domain", groups["in_domain"]), ("ood", groups["ood"]))}


def _cell_text(row: dict[str, Any] | None) -> str:
    """A table cell: the score x 100 with its 95% interval, and the count of failed environment
    calls it leaves out.

    >>> _cell_text({"score": 0.5, "errors": 0}), _cell_text({"score": 0.5, "errors": 1}), _cell_text({"score": None, "errors": 2})
    ('50.0', '50.0 (1 err)', 'n/a (2 err)')
    >>> _cell_text({"score": 0.5, "ci_low": 0.41, "ci_high": 0.59, "errors": 0})
    '50.0 [41.0, 59.0]'
    """
    if row is None:
        return ""
    text = "n/a" if row["score"] is None else f"{row['score'] * 100:.1f}"
    if row["score"] is not None and row.get("ci_low") is not None:
        text += f" [{row['ci_low'] * 100:.1f}, {row['ci_high'] * 100:.1f}]"
    return text + (f" ({row['errors']} err)" if row.get("errors") else "")


def _held_text(held_out: Mapping[str, bool] | None, env_name: str) -> str:
    """The held-out column's text: yes, no, or empty when the split is unknown."""
    return {True: "yes", False: "no"}.get((held_out or {}).get(env_name), "")


def markdown_table(results: list[dict[str, Any]], held_out: Mapping[str, bool] | None = None) -> str:
    """Results as Markdown, one block per environment (scores x 100), its title saying whether
    the environment was held out from training (`held_out`: env name -> held out)."""
    methods = _methods(results)
    lines: list[str] = []
    for env_name in sorted({r["env_name"] for r in results}):
        cell = {(r["dataset"], r["method"]): r for r in results if r["env_name"] == env_name}
        datasets = sorted({d for d, _ in cell}, key=lambda d: (d in OOD, d))
        held = _held_text(held_out, env_name)
        title = f"### environment: {env_name}" + (f" (held out: {held})" if held else "")
        lines += [title, "",
                  "| dataset | metric | " + " | ".join(methods) + " |",
                  "|---|---|" + "---:|" * len(methods)]
        for d in datasets:
            metric = next(r["primary_metric"] for (dd, _), r in cell.items() if dd == d)
            vals = [_cell_text(cell.get((d, m))) for m in methods]
            lines.append(f"| {d}{' (OOD)' if d in OOD else ''} | {metric} | " + " | ".join(vals) + " |")
        for group in ("in_domain", "ood"):
            avg = {m: averages(results, env_name, m)[group] for m in methods}
            if all(v is None for v in avg.values()):
                continue
            lines.append(f"| **avg {group}** | | " + " | ".join(
                f"**{v * 100:.1f}**" if v is not None else "" for v in avg.values()) + " |")
            base = avg.get("direct")
            if base is not None:
                lines.append(f"| Δ vs direct ({group}) | | " + " | ".join(
                    f"{(v - base) * 100:+.1f}" if v is not None and m.startswith("agent") else ""
                    for m, v in avg.items()) + " |")
        lines.append("")
    return "\n".join(lines)


def cost_table(results: list[dict[str, Any]], held_out: Mapping[str, bool] | None = None) -> str:
    """Per environment and method: tokens, dollars, dollars per question and per correct answer
    (`compare.cost_points`: correct = the sum of primary scores; n/a when nothing was correct).

    >>> print(cost_table([{"env_name": "e", "method": "direct", "score": 0.5, "n": 4, "errors": 0,
    ...     "env_prompt_tokens": 10, "env_completion_tokens": 6, "cost_usd": 0.02}], {"e": True}))
    | environment | held out | method | prompt tokens | completion tokens | cost (USD) | questions | correct | USD per question | USD per correct |
    |---|---|---|---:|---:|---:|---:|---:|---:|---:|
    | e | yes | direct | 10 | 6 | 0.0200 | 4 | 2.0 | 0.005000 | 0.010000 |
    """
    from prompt_r1.evaluation.compare import cost_points

    tokens: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        tokens[(r["env_name"], r["method"])][0] += r["env_prompt_tokens"]
        tokens[(r["env_name"], r["method"])][1] += r["env_completion_tokens"]
    lines = ["| environment | held out | method | prompt tokens | completion tokens | cost (USD) | questions | correct "
             "| USD per question | USD per correct |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in cost_points(results):
        pt, ct = tokens[(p["env_name"], p["method"])]
        per_correct = "n/a" if p["usd_per_correct"] is None else f"{p['usd_per_correct']:.6f}"
        lines.append(f"| {p['env_name']} | {_held_text(held_out, p['env_name'])} | {p['method']} | {int(pt)} | {int(ct)} "
                     f"| {p['cost_usd']:.4f} | {p['questions']} | {p['correct']:.1f} | {p['usd_per_question']:.6f} "
                     f"| {per_correct} |")
    return "\n".join(lines)


def baseline_table(baselines: list[dict[str, Any]]) -> str:
    """The optimised instructions (`EvalOutcome.baselines`): training score and optimisation spend.

    An optimisation that failed (`error`) shows that error instead of an instruction.

    >>> print(baseline_table([{"env_name": "e", "method": "opro", "instruction": "Be | brief.",
    ...     "train_score": 0.5, "env_calls": 9, "cost_usd": 0.0, "cached": True},
    ...     {"env_name": "e", "method": "gepa", "instruction": "", "train_score": None, "env_calls": 4,
    ...      "cached": False, "error": "gepa optimisation failed: connection refused"}]))
    | environment | method | instruction | train score | optimiser env calls | cost (USD) | reused |
    |---|---|---|---:|---:|---:|---|
    | e | gepa | (gepa optimisation failed: connection refused) | n/a | 4 | 0.0000 | no |
    | e | opro | Be \\| brief. | 50.0 | 9 | 0.0000 | yes |
    """
    lines = ["| environment | method | instruction | train score | optimiser env calls | cost (USD) | reused |",
             "|---|---|---|---:|---:|---:|---|"]
    for b in sorted(baselines, key=lambda b: (b["env_name"], b["method"])):
        shown = f"({b['error']})" if b.get("error") else b["instruction"]
        text = " ".join(shown.split()).replace("|", "\\|")
        score = "n/a" if b["train_score"] is None else f"{b['train_score'] * 100:.1f}"
        lines.append(f"| {b['env_name']} | {b['method']} | {text} | {score} | {b.get('env_calls', 0)} | "
                     f"{b.get('cost_usd', 0.0):.4f} | {'yes' if b['cached'] else 'no'} |")
    return "\n".join(lines)


def bar_heights(cells: Mapping[tuple[str, str], Mapping[str, Any]], datasets: Sequence[str],
                method: str) -> tuple[list[float], list[list[float]]]:
    """One method's bars over `datasets` (cells: (dataset, method) -> result row): the scores x 100
    (0 where absent or every call failed) and `yerr` [below, above] from each cell's 95% interval.

    >>> bar_heights({("d", "m"): {"score": 0.5, "ci_low": 0.25, "ci_high": 0.6}}, ["d", "x"], "m")
    ([50.0, 0.0], [[25.0, 0.0], [10.0, 0.0]])
    """
    from prompt_r1.evaluation.effect_plot import bar_errors

    rows = [cells.get((d, method)) or {} for d in datasets]
    errors = [bar_errors(r.get("score"), r.get("ci_low"), r.get("ci_high")) for r in rows]
    return [(r.get("score") or 0.0) * 100 for r in rows], [[e[0] for e in errors], [e[1] for e in errors]]


def plot_results(results: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Per-environment grouped bars (datasets x methods, each with its 95% interval as an error
    bar) and OOD averages across environments."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    methods = _methods(results)
    envs = sorted({r["env_name"] for r in results})
    for env_name in envs:
        cell = {(r["dataset"], r["method"]): r for r in results if r["env_name"] == env_name}
        datasets = sorted({d for d, _ in cell}, key=lambda d: (d in OOD, d))
        fig, ax = plt.subplots(figsize=(max(6, len(datasets) * 0.9), 4))
        width = 0.8 / max(1, len(methods))
        for i, m in enumerate(methods):
            xs = [j + i * width for j in range(len(datasets))]
            heights, errors = bar_heights(cell, datasets, m)
            ax.bar(xs, heights, width, label=m, yerr=errors, capsize=2,  # absent/failed: no bar
                   error_kw={"elinewidth": 0.8, "ecolor": "black"})
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(datasets))])
        ax.set_xticklabels(datasets, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("primary metric x 100 (95% interval)")
        ax.set_title(f"{env_name}: with and without the agent")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"bars_{env_name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    groups = [g for g in ("in_domain", "ood")
              if any(averages(results, e, m)[g] is not None for e in envs for m in methods)]
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        width = 0.8 / max(1, len(methods))
        for i, m in enumerate(methods):
            vals = [(averages(results, e, m)[group] or 0) * 100 for e in envs]
            ax.bar([j + i * width for j in range(len(envs))], vals, width, label=m)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(envs))])
        ax.set_xticklabels(envs, fontsize=8)
        ax.set_title(f"average over {group} datasets")
        ax.set_ylabel("primary metric x 100")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "averages_by_environment.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return paths + [path]


def write_report(results: list[dict[str, Any]], examples: list[dict[str, Any]], out_dir: Path,
                 seconds: dict[str, float] | None = None,
                 predictions: list[dict[str, Any]] | None = None,
                 baselines: list[dict[str, Any]] | None = None, split: EnvSplit | None = None,
                 suites: Mapping[str, Sequence[str]] | None = None,
                 turns: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Path]:
    """Write results.md / results.csv / costs.md / examples.json / plots into `out_dir`, and with
    the per-question `predictions`, paired comparisons (in results.md and comparisons.csv); with
    `baselines`, the optimised instructions (results.md and baselines.json); with the environment
    `split`, held-out marks and the trained agent on held-out environments per suite (`suites`:
    suite -> datasets; results.md and heldout.csv); with the agent's `turns` (`turns.turn_rows`), what
    it did with the environment (results.md and turns.csv); with both agent checkpoints, what
    training changed (`training_effect`: results.md, training_effect.md and training_effect.png). A folder the user named
    is checked first (`check_report_folder`)."""
    from prompt_r1.evaluation.compare import paired_comparisons, plot_accuracy_vs_cost
    from prompt_r1.evaluation.heldout import heldout_comparisons

    mark_report_folder(out_dir)
    files = {"markdown": out_dir / "results.md", "csv": out_dir / "results.csv",
             "costs": out_dir / "costs.md", "examples": out_dir / "examples.json"}
    timing = "".join(f"\n- {k}: {v:.1f} s" for k, v in sorted((seconds or {}).items()))
    comparisons = paired_comparisons(predictions) if predictions else []
    held_out = split.held_out if split is not None else None
    heldout_rows = heldout_comparisons(predictions, split, suites) if split is not None and predictions else []
    heldout_md = _heldout_section(heldout_rows, split) if split is not None else ""
    paired = _paired_section(comparisons) if predictions is not None else ""
    effect = _effect_section(results, comparisons, turns) + _other_agents_sections(results, predictions, turns)
    if effect:
        files["training_effect"] = out_dir / "training_effect.md"
        files["training_effect"].write_text(effect.lstrip("\n"))
        files["training_effect_plot"] = _effect_plot(results, comparisons, turns, out_dir, held_out)
    files["markdown"].write_text("# Evaluation results\n\nPrimary metric x 100 [95% bootstrap interval over "
                                 "questions].\n\n" + markdown_table(results, held_out) + effect + heldout_md + paired
                                 + _turns_section(turns)
                                 + ("\n## Optimised instructions (prompt-optimisation baselines)\n\n"
                                    "Optimised on training questions; spend = optimisation only (the evaluation "
                                    "is in the cost table).\n\n" + baseline_table(baselines) + "\n"
                                    if baselines else "")
                                 + "\n## Environment tokens and cost\n\n" + cost_table(results, held_out) + "\n"
                                 + (f"\n## Time per stage\n{timing}\n" if timing else ""))
    for name, rows in (("comparisons", comparisons), ("heldout", heldout_rows), ("turns", list(turns or []))):
        if rows:
            files[name] = _write_rows(out_dir / f"{name}.csv", rows)
    files["accuracy_vs_cost"] = plot_accuracy_vs_cost(results, out_dir, held_out)
    with files["csv"].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=LONG_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, "held_out": _held_text(held_out, r["env_name"])} for r in results)
    files["costs"].write_text(cost_table(results, held_out) + "\n")
    files["examples"].write_text(json.dumps(examples, indent=2, ensure_ascii=False))
    if baselines:
        files["baselines"] = out_dir / "baselines.json"
        files["baselines"].write_text(json.dumps(baselines, indent=2, ensure_ascii=False))
    for i, path in enumerate(plot_results(results, out_dir)):
        files[f"plot{i}"] = path
    return files


def _heldout_section(rows: list[dict[str, Any]], split: EnvSplit) -> str:
    from prompt_r1.evaluation.heldout import heldout_table

    return ("\n## Held-out environments (agent:trained − method, same questions)\n\n"
            "Differences x 100 over each suite's datasets; 95% bootstrap interval over questions (the worst "
            "environment's interval is that of the minimum).\n\n" + heldout_table(rows, split))


def _paired_section(comparisons: list[dict[str, Any]]) -> str:
    from prompt_r1.evaluation.compare import comparison_table

    return ("\n## Paired comparisons (agent:trained − method, same questions)\n\n"
            "Differences x 100; 95% bootstrap interval over questions; two-sided sign-flip p-value; "
            "`answers differ`: of the `n` questions, how many got a different final answer; "
            "`dropped`: questions left out because an environment call failed under either method.\n\n"
            + comparison_table(comparisons))


def _write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """`rows` as a CSV with every key any row has, in order of first appearance."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _effect_section(results: list[dict[str, Any]], comparisons: list[dict[str, Any]],
                    turns: Sequence[Mapping[str, Any]] | None, after: str = "agent:trained") -> str:
    from prompt_r1.evaluation.training_effect import TRAINED, effect_rows, effect_table

    rows = effect_rows(results, comparisons, turns or [], after)
    if not rows:
        return ""
    title = "What training changed" if after == TRAINED else f"What {after}'s training changed"
    return (f"\n## {title} ({after} vs agent:base, same questions)\n\nScores x 100 [95% "
            "bootstrap interval over questions]; the change is paired over the questions both scored, with its "
            f"two-sided sign-flip p-value; the shares (of agent episodes no failure ended) are base -> "
            f"{after.partition(':')[2]}.\n\n" + effect_table(rows, after))


def _other_agents_sections(results: list[dict[str, Any]], predictions: list[dict[str, Any]] | None,
                           turns: Sequence[Mapping[str, Any]] | None) -> str:
    """The effect section of every other agent the evaluation scored (`eval.agent_checkpoints`'
    `LABEL=SPEC`, e.g. a shipped adapter) against `agent:base`, paired over the same questions."""
    from prompt_r1.evaluation.compare import paired_comparisons
    from prompt_r1.evaluation.training_effect import BASE, TRAINED

    others = dict.fromkeys(r["method"] for r in results if r["method"].startswith("agent:")
                           and r["method"] not in (BASE, TRAINED))

    def versus_base(label: str) -> list[dict[str, Any]]:
        return paired_comparisons([p for p in predictions or [] if p["method"] in (BASE, label)], reference=label)

    return "".join(_effect_section(results, versus_base(label), turns, after=label) for label in others)


def _effect_plot(results: list[dict[str, Any]], comparisons: list[dict[str, Any]],
                 turns: Sequence[Mapping[str, Any]] | None, out_dir: Path, held_out: Mapping[str, bool] | None) -> Path:
    """training_effect.png: the section's rows as bars with intervals (`effect_plot`)."""
    from prompt_r1.evaluation.effect_plot import plot_training_effect
    from prompt_r1.evaluation.training_effect import effect_rows

    return plot_training_effect(effect_rows(results, comparisons, turns or []), out_dir, held_out)


def _turns_section(turns: Sequence[Mapping[str, Any]] | None) -> str:
    from prompt_r1.evaluation.turns import turn_table

    if not turns:
        return ""
    return ("\n## What the agent did with the environment\n\nPer agent episode that no failure ended: environment "
            "calls, the share with a second call, and each turn the task's turn scorer judges (`reward.turn.scorer`): "
            "mean reward, share with full credit (1) and with some (> 0); then the share of each of the task's "
            "indicators (`reward.turn.indicators`) over the episodes it defines.\n\n" + turn_table(turns) + "\n")


def check_report_folder(out_dir: Path, overwrite: bool) -> None:
    """Before an evaluation writes into a folder the user named (`evaluate --out`): refuse one
    holding anything but an earlier report (an earlier report only with `overwrite`), the rule
    `export` follows."""
    from prompt_r1.core.fsutil import check_output_folder

    check_output_folder(out_dir, overwrite, REPORT_MARKER, "evaluation report")


def mark_report_folder(out_dir: Path) -> None:
    """Mark `out_dir` as a report folder once the evaluation starts writing there (its logs come
    first), so a run that fails midway can be rerun into it with `--overwrite`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_MARKER).write_text(json.dumps({"written_by": "prompt-r1 evaluate"}) + "\n")
