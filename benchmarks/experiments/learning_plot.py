"""The figure of `benchmarks/experiments/learning.py`: curves per step beside the control, and each probe question.

Four panels: (1) training reward per step, trained vs shuffled-reward control (the control's
true reward, not the shuffled one it learned from); (2) answer score and format-valid share per
step; (3) share of informative GRPO groups, the KL to the reference and, for a task with a
first-call indicator, the share of sampled members whose first call asks the first hop (the
scaffolded members are left out: their first call is written); (4) every probe question
before -> after training (trained arm), with both arms' means and the paired change in the title.
"""

from __future__ import annotations

from pathlib import Path

COLOURS = {"trained": "tab:blue", "control": "tab:grey"}
OTHER_COLOURS = ("tab:purple", "tab:brown", "tab:olive", "tab:cyan")  # further seeds; not the probe panel's green/red


def _colours(arms: list[str]) -> dict[str, str]:
    """One colour per arm: the fixed ones, then the others in order (each seed its own).

    >>> _colours(["trained", "trained-seed1", "control"])
    {'trained': 'tab:blue', 'trained-seed1': 'tab:purple', 'control': 'tab:grey'}
    """
    others = iter(OTHER_COLOURS * len(arms))
    return {arm: COLOURS.get(arm) or next(others) for arm in arms}


def _series(curve: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(p["step"], p[key]) for p in curve if p.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def plot(saved: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, verdict = saved["results"], saved.get("verdict")
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    (reward_ax, answer_ax), (groups_ax, probe_ax) = axes
    colours = _colours(list(results))
    for arm, result in results.items():
        colour = colours[arm]
        reward_ax.plot(*_series(result["curve"], "reward_mean"), marker="o", color=colour, label=arm)
        answer_ax.plot(*_series(result["curve"], "answer_mean"), marker="o", color=colour, label=f"{arm}: answer")
        answer_ax.plot(*_series(result["curve"], "format_valid"), ls="--", color=colour, label=f"{arm}: format valid")
        groups_ax.plot(*_series(result["curve"], "informative_share"), marker="o", color=colour,
                       label=f"{arm}: informative groups")
        kl_steps, kl = _series(result["curve"], "kl")
        if any(kl):
            groups_ax.plot(kl_steps, kl, ls=":", color=colour, label=f"{arm}: KL")
        first_hop = _series(result["curve"], "indicator_first_hop")
        if first_hop[0]:
            groups_ax.plot(*first_hop, ls="-.", marker="x", color=colour, label=f"{arm}: first call asks the first hop")
    reward_ax.set(title="training reward per step (true reward)", xlabel="GRPO step", ylabel="mean reward")
    answer_ax.set(title="answer score and format-valid share per step", xlabel="GRPO step", ylim=(-0.05, 1.05))
    groups_ax.set(title="informative groups, KL, first calls that decompose", xlabel="GRPO step", ylim=(-0.05, 1.05))
    for ax in (reward_ax, answer_ax, groups_ax):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _probe_panel(probe_ax, results, verdict)
    fig.suptitle(f"{saved['config']}: {saved['steps']} steps per arm", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _probe_panel(ax, results: dict, verdict: dict | None) -> None:
    trained = results.get("trained") or next(iter(results.values()))
    before = [r["answer_score"] for r in trained["probe_before"]]
    after = [r["answer_score"] for r in trained["probe_after"]]
    for b, a in zip(before, after):
        colour = "tab:green" if a > b else ("tab:red" if a < b else "lightgrey")
        ax.plot([0, 1], [b, a], color=colour, alpha=0.6, lw=1)
    for arm, result in results.items():
        means = [sum(r["answer_score"] for r in result[k]) / len(result[k]) for k in ("probe_before", "probe_after")]
        ax.plot([0, 1], means, color=_colours(list(results))[arm], lw=3, marker="o", label=f"{arm} mean")
    title = f"probe answer score, {len(before)} questions (green up, red down)"
    if verdict:
        gains = verdict.get("seed_gains") or {"trained": verdict["trained_gain"]}
        versus = verdict.get("seeds_vs_control") or (
            {"trained": verdict["trained_vs_control"]} if "trained_vs_control" in verdict else {})
        interval = (lambda g: f"{g['diff']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]")
        for arm, g in gains.items():  # one line per seed: a wide title runs off the panel
            title += f"\n{arm} {interval(g)}" + (f", vs control {interval(versus[arm])}" if arm in versus else "")
    ax.set(title=title, xticks=[0, 1], xticklabels=["before", "after"], ylim=(-0.05, 1.05))
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
