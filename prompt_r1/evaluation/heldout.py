"""Which environments the evaluated agent was trained on, and how the trained agent does on the others.

An environment is held out when the training run that produced `agent:trained` never drew it.
That run's pool is read from the training config the agent carries (`training_config_file` of
the one agent resolver: an exported agent's copy of its checkpoint's `config.yaml`, or a
checkpoint folder's own); with no trained agent, or one that carries no config (a bundled or
hub model), the evaluating config's own training pool stands in, and the report says which.

Two environments are the same when their `name` and `model` are equal: price, sampling,
endpoint and limits may differ between the training and the evaluation config of one model.

`heldout_comparisons` compares `agent:trained` with `agent:base` and with `direct` per suite:
on each environment (the paired difference over its datasets, `compare`'s pairing), the mean
over held-out environments (and over trained-on ones) and the worst held-out environment, each
with its 95% bootstrap interval (`stats.paired_comparison`, `stats.paired_worst`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompt_r1.config.env import EnvConfig
from prompt_r1.config.experiment import Config, ConfigError, load_config
from prompt_r1.evaluation.compare import REFERENCE, paired_scores
from prompt_r1.evaluation.stats import cell_seed, paired_comparison, paired_worst

log = logging.getLogger(__name__)

TRAINED_LABEL = "trained"  # the agent label whose training pool decides what is held out
VERSUS = ("agent:base", "direct")  # what `agent:trained` is compared with on held-out environments


def env_identity(env: EnvConfig) -> tuple[str, str]:
    """What makes two environment configs the same environment: its name and its model."""
    return env.name, env.model


@dataclass(frozen=True)
class EnvSplit:
    """Environment name -> held out (True) or trained on (False), and where the pool came from."""

    held_out: dict[str, bool]
    source: str

    def names(self, held_out: bool) -> list[str]:
        return sorted(n for n, h in self.held_out.items() if h == held_out)


def environment_split(cfg: Config, agents: Mapping[str, Path | str],
                      environments: Sequence[EnvConfig] | None = None) -> EnvSplit:
    """Mark each of `environments` (default: the config's evaluation environments) as held out
    or trained on, from the training pool of the agent labelled `trained` in `agents`.

    >>> from prompt_r1.config.experiment import parse_config
    >>> cfg = parse_config({"environment": {"name": "a", "model": "tiny"}})
    >>> split = environment_split(cfg, {}, [EnvConfig(name="a", model="tiny"), EnvConfig(name="b", model="tiny")])
    >>> split.held_out
    {'a': False, 'b': True}
    """
    from prompt_r1.models.agent_files import training_config_file

    pool, source = cfg.training_environments(), "the evaluating config's training pool (no agent:trained)"
    if TRAINED_LABEL in agents:
        found = training_config_file(agents[TRAINED_LABEL])
        if found is None:
            log.warning("agent:trained (%s) carries no training config; held-out environments are marked "
                        "against this config's training pool instead", agents[TRAINED_LABEL])
            source = "the evaluating config's training pool (agent:trained carries no training config)"
        else:
            try:
                pool = load_config(found).training_environments()
            except ConfigError as err:
                raise ConfigError(f"agent:trained ({agents[TRAINED_LABEL]}) carries the training config {found}, which "
                                  f"says which environments it trained on, but it cannot be read: {err}") from None
            source = f"the training config of agent:trained ({found})"
    trained = {env_identity(e) for e in pool}
    envs = list(environments if environments is not None else cfg.eval_environments())
    return EnvSplit({e.name: env_identity(e) not in trained for e in envs}, source)


def heldout_comparisons(predictions: list[dict[str, Any]], split: EnvSplit,
                        suites: Mapping[str, Sequence[str]] | None = None) -> list[dict[str, Any]]:
    """Rows (suite, method, scope, env_name, held_out, diff, ci_low, ci_high, n) for
    `agent:trained` − method, method in `VERSUS`: scope `env` per environment, `held-out mean`,
    `trained-on mean` and `held-out worst` (its `env_name` the worst one). A suite's datasets are
    its strata; a group mean gives each (environment, dataset) the same weight. [] without
    `agent:trained` predictions. `suites` (suite -> datasets) defaults to one suite `all`."""
    by_cell: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for p in predictions:
        by_cell.setdefault((p["env_name"], p["method"], p["dataset"]), {})[p["question_id"]] = p
    if not any(m == REFERENCE for _, m, _ in by_cell):
        return []
    suites = suites or {"all": sorted({d for _, _, d in by_cell})}
    envs = sorted({e for e, m, _ in by_cell if m == REFERENCE})
    out: list[dict[str, Any]] = []
    for suite, datasets in suites.items():
        for method in VERSUS:
            strata: dict[str, tuple[list[list[float]], list[list[float]]]] = {}
            for env in envs:
                pairs = [paired_scores(by_cell[(env, REFERENCE, d)], by_cell[(env, method, d)])[:2] for d in datasets
                         if (env, REFERENCE, d) in by_cell and (env, method, d) in by_cell]
                pairs = [p for p in pairs if p[0]]
                if pairs:
                    strata[env] = ([a for a, _ in pairs], [b for _, b in pairs])
            for env, (a, b) in strata.items():
                out.append(_row(suite, method, "env", env, split.held_out.get(env),
                                paired_comparison(a, b, seed=cell_seed("heldout", suite, method, env))))
            for held, scope in ((True, "held-out mean"), (False, "trained-on mean")):
                members = [e for e in strata if split.held_out.get(e) is held]
                if members:
                    a = [s for e in members for s in strata[e][0]]
                    b = [s for e in members for s in strata[e][1]]
                    out.append(_row(suite, method, scope, ",".join(members), held,
                                    paired_comparison(a, b, seed=cell_seed("heldout", suite, method, scope))))
            members = [e for e in strata if split.held_out.get(e) is True]
            if members:
                worst = paired_worst([strata[e] for e in members], seed=cell_seed("heldout", suite, method, "worst"))
                out.append(_row(suite, method, "held-out worst", members[worst["index"]], True, worst))
    return out


def _row(suite: str, method: str, scope: str, env: str, held_out: bool | None, stats: dict[str, Any]) -> dict[str, Any]:
    return {"suite": suite, "reference": REFERENCE, "method": method, "scope": scope, "env_name": env,
            "held_out": held_out, **{k: stats[k] for k in ("diff", "ci_low", "ci_high", "n")}}


def heldout_table(rows: list[dict[str, Any]], split: EnvSplit) -> str:
    """Markdown: the split, then each comparison's difference x 100 with its 95% interval."""
    lines = [f"Held out: {', '.join(split.names(True)) or 'none'}; trained on: "
             f"{', '.join(split.names(False)) or 'none'} (from {split.source}).", ""]
    if not rows:
        return "\n".join(lines + ["(no `agent:trained` rows to compare)", ""])
    lines += ["| suite | vs method | scope | environment | held out | Δ (trained − method) | 95% CI | n |",
              "|---|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        held = {True: "yes", False: "no"}.get(r["held_out"], "?")
        if r["diff"] is None:
            lines.append(f"| {r['suite']} | {r['method']} | {r['scope']} | {r['env_name']} | {held} | n/a | | 0 |")
            continue
        lines.append(f"| {r['suite']} | {r['method']} | {r['scope']} | {r['env_name']} | {held} | "
                     f"{r['diff'] * 100:+.1f} | [{r['ci_low'] * 100:+.1f}, {r['ci_high'] * 100:+.1f}] | {r['n']} |")
    return "\n".join(lines) + "\n"
