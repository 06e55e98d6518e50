"""Does GRPO make the demo agent better? A pre-registered experiment with a shuffled-reward control.

The demo pair (agent `smollm2-135m-protocol`, environment SmolLM2-135M-Instruct on a managed vLLM
server) is trained on the screened training pool (`benchmarks/screens/screen.py`: questions the
environment answers when asked well) through the real training loop (`TrainingSession.run()`, as
`prompt-r1 train` runs it), twice with the same budget and seed:

- `trained`: the dual-constrained reward, as always;
- `control`: the same rewards shuffled across the step's trajectories before the update, so any
  gain the control also shows comes from something other than the reward (the update itself,
  format drift, evaluation noise).

Before and after each run the agent answers the probe set (`data/screened/test`, never trained on)
greedily; each question's answer score (token F1 of the final answer, the reward's answer part)
is paired before -> after, and the changes are compared with a paired bootstrap over questions
(`prompt_r1.evaluation.stats.paired_comparison`). The pass criterion is printed before any
training starts and judged at the end; results go to `learning.json` and `learning.png`.

    .venv/bin/python -m benchmarks.experiments.learning                        # both arms, configs/learning-smollm.yaml
    .venv/bin/python -m benchmarks.experiments.learning --arms trained --steps 2   # a shorter look
    .venv/bin/python -m benchmarks.experiments.learning --replot               # judge and redraw from the saved JSON

On the compositional (two-hop) task (`configs/learning-compositional.yaml`, probe dataset
`compositional_probe`) the result also holds the mechanism: per arm, the share of probe
trajectories that make a second environment call and the share whose second call uses the first
reply (`prompt_r1.data.compositional.follow_up`), before -> after; and per relation the score of
the best constant answer (on continents a fixed guess scores well: a learned guess is not learned
interaction). `--probe-only` measures the untrained agent alone (no training, OUT/probe-only.json):

    .venv/bin/python -m benchmarks.experiments.learning --config configs/learning-compositional.yaml \
        --probe-dataset compositional_probe --probe-only
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.experiments.leak_audit import LEAKS
from benchmarks.experiments.learning_plot import plot
from prompt_r1.cli.logging_setup import setup_logging
from prompt_r1.config.experiment import Config, load_config, parse_overrides
from prompt_r1.core.fsutil import atomic_write_text
from prompt_r1.core.metrics import f1_score
from prompt_r1.core.protocol import parse_turn
from prompt_r1.core.reward import GATE_TOLERANCE
from prompt_r1.core.seeding import derive_seed
from prompt_r1.core.trajectory import rollout_stats
from prompt_r1.data.compositional import follow_up, known_questions
from prompt_r1.data.first_call import two_hop_indicators
from prompt_r1.rollout.scaffold import assert_unscaffolded
from prompt_r1.evaluation.stats import paired_comparison
from prompt_r1.learner.checkpoint import latest_checkpoint
from prompt_r1.models.adapter import export_adapter
from prompt_r1.training.hooks import StepResult, TrainingHooks
from prompt_r1.training.session import TrainingSession

log = logging.getLogger("benchmarks.experiments.learning")

# Pre-registered (issue: "visible learning"): judged on the probe set, never tuned after a run.
CRITERIA = {
    "min_answer_gain": 0.15,       # trained: paired answer-score change >= +0.15 with its 95% CI above 0
    "beats_control": 0.0,          # trained after - control after: 95% CI of the difference above 0
    "max_format_drop": 0.05,       # format-valid share falls by at most 0.05
    "max_wall_minutes": 60.0,      # the trained run's wall time on this machine
}
# The two-hop task's first-call indicators (`prompt_r1.data.first_call.two_hop_indicators`): the share
# that decomposes, and two leaks that must not rise with training.
INDICATORS = ("first_hop", "bridge_before_reply", "answer_unseen")
MIN_PROBE = 32  # fewer probe questions cannot resolve the criterion's +0.15 (BENCHMARKS.md)


class ProbedSession(TrainingSession):
    """The training session plus a probe evaluation, and (control arm) shuffled rewards.

    `score` keeps the true rewards of each step (the control's curve shows those, not the
    shuffled ones it learns from); the shuffle is a seeded permutation over the step's scored
    trajectories, so the control sees the same reward values in random places."""

    shuffle_rewards = False

    def score(self, trajectories):
        super().score(trajectories)
        scored = [t for t in trajectories if t.reward is not None]
        self.true_stats = rollout_stats(scored, self.cfg.reward.format_cap)
        if self.shuffle_rewards:  # a trajectory's outcome and turn rewards move together (reward.turn)
            rewards = [(t.reward, t.turn_rewards) for t in scored]
            random.Random(derive_seed("shuffled_reward_control", self.cfg.seed, self.step)).shuffle(rewards)
            for trajectory, (reward, turns) in zip(scored, rewards):
                trajectory.reward = reward
                trajectory.turn_rewards = self._fit(turns, len(trajectory.agent_turns))

    @staticmethod
    def _fit(turns: list, n: int) -> list:
        """Shuffled turn rewards on a trajectory of `n` agent turns: cut, or padded with None (not judged)."""
        return (list(turns) + [None] * n)[:n] if turns else turns

    def probe(self, questions) -> list[dict]:
        """Greedy answers to `questions`, one row per question in order; a failed environment
        call stops the benchmark (it is not a score)."""
        trajectories = self.pool.rollout(questions, self.step, greedy=True, group_size=1)
        assert_unscaffolded(trajectories, f"probe after {self.step} update(s)")
        failed = [t for t in trajectories if t.error]
        if failed:
            raise SystemExit(f"probe after {self.step} update(s): {len(failed)} environment call(s) failed "
                             f"({failed[0].error}); no result is computed from failures")
        cap = self.cfg.reward.format_cap
        texts = {q.question_id: q for q in questions}
        return [{"question_id": t.question_id, "answer_score": t.reward.answer, "reward": t.reward.total,
                 "format_valid": float(t.reward.format >= cap - GATE_TOLERANCE), "answer": t.answer,
                 "turns": len(t.agent_turns), **interaction(t, texts[t.question_id])} for t in trajectories]


def interaction(trajectory, question) -> dict:
    """What the trajectory did with the environment: its calls, and for a two-hop question whether
    the second call used the first reply (`follow_up`); `relation` and `golds` serve the constant
    baseline. Non-compositional questions get None for the two-hop fields."""
    prompts = [p for p in (parse_turn(turn).interaction_prompt for turn in trajectory.agent_turns) if p is not None]
    sent = prompts[: len(trajectory.env_replies)]   # a last-turn prompt that was never sent does not count
    known = known_questions().get(question.question)
    row = {"calls": len(sent), "second_call": len(sent) >= 2, "prompts": sent,
           "replies": list(trajectory.env_replies), "golds": list(question.golds),
           "relation": None, "uses_reply": None, "names_bridge": None}
    if known is not None:
        used = follow_up(known, sent, trajectory.env_replies)
        row.update(relation=known.chain.split(">")[1], uses_reply=used.uses_reply, names_bridge=used.names_bridge,
                   **two_hop_indicators(question, trajectory))
    return row


class ArmStopped(Exception):
    """The registered stop rule ended an arm early (`CurveHooks`)."""


class CurveHooks(TrainingHooks):
    """Per step: the true reward figures (see `ProbedSession.score`), the learner's metrics and the
    task's indicator shares. With a registered `stop_rule` ({metric, first_step, last_step, below})
    the arm stops after `last_step` when the metric's mean over those steps is below the bound."""

    def __init__(self, session: ProbedSession, total_steps: int, stop_rule: dict | None = None):
        super().__init__(total_steps)
        self.session, self.curve, self.stop_rule = session, [], stop_rule

    def on_step(self, result: StepResult) -> None:
        super().on_step(result)
        true = self.session.true_stats
        self.curve.append({
            "step": result.step + 1, "reward_mean": true["reward_mean"], "answer_mean": true["answer_score"],
            "format_valid": true["format_valid_rate"], "turns": true["turns"],
            **{k: result.metrics.get(k) for k in ("kl", "informative_share", "groups_informative", "pg_loss",
                                                   "clip_fraction", "step_time_s", "rollout_time_s")},
            **{k: v for k, v in true.items() if k.startswith("turn_reward_")},
            **{k: v for k, v in result.metrics.items() if k.startswith(("indicator_", "scaffolded_"))}})
        rule = self.stop_rule
        if rule and result.step + 1 == rule["last_step"]:
            values = [p.get(rule["metric"]) for p in self.curve if rule["first_step"] <= p["step"] <= rule["last_step"]]
            values = [v for v in values if v is not None]
            mean = statistics.fmean(values) if values else 0.0
            if mean < rule["below"]:
                raise ArmStopped(f"stop rule: {rule['metric']} averaged {mean:.3f} over steps {rule['first_step']}-"
                                 f"{rule['last_step']}, below {rule['below']}")


def run_arm(cfg: Config, arm: str, home: Path, probe_dataset: str, probe_limit: int | None = None,
            train: bool = True, keep_agent: Path | None = None, stop_rule: dict | None = None) -> dict:
    """One training run (arm `trained`, `trained-seedN` or `control`) in a fresh warehouse, probed
    before and after (`train=False`: the untrained probe only); the trained agent is kept in
    `keep_agent` (a folder `prompt-r1 evaluate --agent NAME=FOLDER` loads) and its path recorded:
    the exported model, or under LoRA the adapter alone (a few MiB, small enough to commit; the
    resolver merges it into its base on any machine)."""
    from prompt_r1.data.ingest import ingest
    from warehouse.store import Warehouse

    started = time.perf_counter()
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, cfg.data.sources, cfg.data.max_question_chars)
        probes = wh.questions(splits=["test"], datasets=[probe_dataset])[:probe_limit]
        if len(probes) < min(MIN_PROBE, probe_limit or MIN_PROBE):
            raise SystemExit(f"{len(probes)} probe questions in {cfg.data.sources} (dataset {probe_dataset}); "
                             "run benchmarks/screens/screen.py (or compose_screen.py) first (it writes at least 32)")
        session_cls = type("ControlSession", (ProbedSession,), {"shuffle_rewards": True}) if arm == "control" \
            else ProbedSession
        with session_cls(cfg, wh, arm, home / arm) as session:
            log.info("%s: probing the untrained agent on %d questions", arm, len(probes))
            before = session.probe(probes)
            if not train:
                return {"arm": arm, "probe_questions": len(probes), "wall_s": round(time.perf_counter() - started, 1),
                        "probe_before": before}
            hooks = CurveHooks(session, cfg.train.steps, stop_rule if arm != "control" else None)
            train_started = time.perf_counter()
            stopped = None
            try:
                outcome = session.run(hooks)
            except ArmStopped as stop:  # reported with the agent as it is at that step, never kept
                stopped, outcome = str(stop), None
                log.warning("%s: %s", arm, stop)
            train_s = time.perf_counter() - train_started
            log.info("%s: probing the trained agent", arm)
            after = session.probe(probes)
    agent = None
    if keep_agent is not None and outcome is not None and outcome.agent is not None:
        if keep_agent.exists():  # never overwrite a kept agent: it may be the one a result names
            raise SystemExit(f"{keep_agent} exists; move it away or pass another --agents folder")
        keep_agent.parent.mkdir(parents=True, exist_ok=True)
        if cfg.agent.lora.enabled:  # the final checkpoint's adapter, the one the export merged
            agent = str(export_adapter(latest_checkpoint(session.ckpt_dir), keep_agent))
        else:
            agent = str(shutil.copytree(outcome.agent, keep_agent))
        log.info("%s: trained agent kept in %s", arm, agent)
    return {"arm": arm, "seed": cfg.seed, "train_questions": len(session.train_questions),
            "probe_questions": len(probes), "train_s": round(train_s, 1),
            "wall_s": round(time.perf_counter() - started, 1), "agent": agent, "stopped": stopped,
            "curve": hooks.curve, "probe_before": before, "probe_after": after}


def compare(a: list[dict], b: list[dict], key: str, *seed: object) -> dict:
    """Paired A - B over the same probe questions (same order), with its bootstrap interval."""
    if [r["question_id"] for r in a] != [r["question_id"] for r in b]:
        raise ValueError("paired comparison over different probe questions")
    return paired_comparison([[r[key] for r in a]], [[r[key] for r in b]], seed=derive_seed("learning", *seed))


def trained_arms(results: dict[str, dict]) -> list[str]:
    """`trained` (the config's seed) first, then `trained-seedN` in the order they ran."""
    return [arm for arm in results if arm == "trained"] + [a for a in results if a.startswith("trained-seed")]


def same_probe_ids(results: dict[str, dict], reference: str) -> dict[str, dict]:
    """`results` with every arm's probe rows under `reference`'s question ids. Arms of one experiment
    that ran on either side of a change of question ids (rows without an `id` are keyed by their
    text since INGEST_FORMAT 4, by their line before) probe the same questions in the same (row)
    order under other ids; an arm is relabelled only when its untrained probe matches the
    reference's row by row in gold answers and environment prompts (the greedy untrained agent
    passes each question on), else it is left as it is and the pairing refuses it."""
    ref = results[reference]["probe_before"]
    out = {}
    for arm, r in results.items():
        rows = r["probe_before"]
        same = len(rows) == len(ref) and all(
            (a["golds"], a.get("prompts")) == (b["golds"], b.get("prompts")) for a, b in zip(rows, ref))
        if not same or [x["question_id"] for x in rows] == [x["question_id"] for x in ref]:
            out[arm] = r
            continue
        ids = [x["question_id"] for x in ref]
        out[arm] = {**r, **{part: [{**row, "question_id": qid} for row, qid in zip(r[part], ids)]
                            for part in ("probe_before", "probe_after") if part in r}}
    return out


def judge(results: dict[str, dict], criteria: dict | None = None) -> dict:
    """The pre-registered criteria against the arms' figures. With several trained seeds, every
    seed's change must have its interval above 0 and their mean must reach the bar; each seed must
    keep its format, keep to the time budget and beat the control."""
    criteria = criteria or CRITERIA
    arms = trained_arms(results)
    results = same_probe_ids(results, arms[0])
    trained = results[arms[0]]
    gains = {arm: compare(results[arm]["probe_after"], results[arm]["probe_before"], "answer_score", "gain")
             for arm in arms}
    verdict: dict = {"trained_gain": gains[arms[0]], "seed_gains": gains,
                     "mean_gain": statistics.fmean(g["diff"] for g in gains.values())}
    checks = {"answer_gain": verdict["mean_gain"] >= criteria["min_answer_gain"]
              and all(g["ci_low"] > 0 for g in gains.values())}
    fmt = {arm: {"before": statistics.fmean(r["format_valid"] for r in results[arm]["probe_before"]),
                 "after": statistics.fmean(r["format_valid"] for r in results[arm]["probe_after"])} for arm in arms}
    verdict["format_valid"], verdict["format_valid_by_seed"] = fmt[arms[0]], fmt
    checks["format_kept"] = all(f["after"] >= f["before"] - criteria["max_format_drop"] for f in fmt.values())
    checks["wall_time"] = all(results[arm]["train_s"] <= criteria["max_wall_minutes"] * 60 for arm in arms)
    if any(results[arm].get("stopped") for arm in arms):  # a stopped arm never passes
        checks["not_stopped"] = False
    if "control" in results:
        control = results["control"]
        verdict["control_gain"] = compare(control["probe_after"], control["probe_before"], "answer_score", "ctl")
        versus = {arm: compare(results[arm]["probe_after"], control["probe_after"], "answer_score", "vs")
                  for arm in arms}
        verdict["trained_vs_control"], verdict["seeds_vs_control"] = versus[arms[0]], versus
        checks["beats_control"] = all(v["ci_low"] > criteria["beats_control"] for v in versus.values())
    else:
        checks["beats_control"] = None  # not run: the experiment cannot pass
    verdict["mechanism"] = {arm: {"before": mechanism(r["probe_before"]), "after": mechanism(r["probe_after"])}
                            for arm, r in results.items()}
    if "min_first_call_share" in criteria:  # every seed's probe first calls decompose after training
        checks["first_call_share"] = all((verdict["mechanism"][arm]["after"]["first_hop"] or 0.0)
                                         >= criteria["min_first_call_share"] for arm in arms)
    if "max_leak_rise" in criteria:  # neither leak indicator rises past the bound in any seed
        checks["no_leak_rise"] = all(
            (verdict["mechanism"][arm]["after"][leak] or 0.0) - (verdict["mechanism"][arm]["before"][leak] or 0.0)
            <= criteria["max_leak_rise"] for arm in arms for leak in LEAKS)
    verdict["checks"] = checks
    verdict["passed"] = all(v is True for v in checks.values())
    verdict["by_relation"] = by_relation(trained["probe_before"], trained["probe_after"])
    return verdict


def mechanism(rows: list[dict]) -> dict:
    """Shares of probe trajectories with a second environment call, and (two-hop questions) with
    one that uses the first reply / names the bridge entity; the mean answer score beside them."""
    two_hop = [r for r in rows if r.get("uses_reply") is not None]
    share = (lambda xs: round(statistics.fmean(xs), 3) if xs else None)
    return {"n": len(rows), "answer_score": share([r["answer_score"] for r in rows]),
            "second_call": share([float(r.get("second_call", False)) for r in rows]),
            "uses_reply": share([float(r["uses_reply"]) for r in two_hop]),
            "names_bridge": share([float(r["names_bridge"]) for r in two_hop]),
            "mean_calls": share([r.get("calls", 0) for r in rows]),
            **{name: share([float(r[name]) for r in two_hop if r.get(name) is not None]) for name in INDICATORS}}


def best_constant(rows: list[dict], max_words: int = 3) -> dict:
    """The single answer that scores best on these questions (token F1, as the reward): every gold
    answer, and every set of up to `max_words` words of the golds (a hedge such as "Europe Asia"
    earns F1 on both): what a fixed guess earns without any interaction."""
    golds = {g for r in rows for g in r["golds"]}
    words = sorted({w for g in golds for w in g.split()})
    candidates = golds | {" ".join(c) for k in range(1, max_words + 1) for c in itertools.combinations(words, k)}
    scored = [(statistics.fmean(f1_score(c, r["golds"]) for r in rows), c) for c in sorted(candidates)]
    score, answer = max(scored, key=lambda x: x[0])   # the first of equals in sorted order
    return {"answer": answer, "score": round(score, 3)}


def by_relation(before: list[dict], after: list[dict] | None = None) -> dict:
    """Per relation of the two-hop probe questions: n, answer score before (-> after), the best
    constant answer and its score."""
    out = {}
    keyed = sorted((r for r in before if r.get("relation")), key=lambda r: r["relation"])
    later = {r["question_id"]: r for r in after or []}
    for relation, group in itertools.groupby(keyed, key=lambda r: r["relation"]):
        group = list(group)
        entry = {"n": len(group), "distinct_answers": len({tuple(r["golds"]) for r in group}),
                 "before": round(statistics.fmean(r["answer_score"] for r in group), 3),
                 "best_constant": best_constant(group)}
        if later:
            entry["after"] = round(statistics.fmean(later[r["question_id"]]["answer_score"] for r in group), 3)
        out[relation] = entry
    return out


def load_criteria(path: Path | None) -> dict:
    """The pass criterion: a pre-registered criterion file (JSON: the keys of `CRITERIA`, `seeds`,
    and a `registered` note saying what it is for), or the built-in `CRITERIA` for one seed."""
    if path is None:
        return {**CRITERIA, "seeds": None}
    saved = json.loads(path.read_text())
    missing = sorted(set(CRITERIA) - set(saved))
    if missing:
        raise SystemExit(f"{path}: missing criterion key(s) {missing}")
    return saved


def print_criteria(cfg: Config, arms: list[str], criteria: dict, source: Path | None) -> None:
    seeds = criteria.get("seeds") or [cfg.seed]
    several = len(seeds) > 1
    print(f"Pre-registered pass criterion ({source or 'built in'}; judged on the probe set after training):\n"
          + (f"  note: {criteria['registered']}\n" if criteria.get("registered") else "")
          + (f"  1. trained, seeds {seeds}: every seed's paired answer-score change has its 95% interval above 0 "
             f"and their mean is >= +{criteria['min_answer_gain']}\n" if several else
             f"  1. trained: paired answer-score change >= +{criteria['min_answer_gain']} with its 95% interval above 0\n")
          + "  2. trained after - shuffled-reward control after: 95% interval of the difference above 0"
          + (" (every seed)\n" if several else "\n")
          + f"  3. format-valid share falls by at most {criteria['max_format_drop']}\n"
          f"  4. the trained run takes at most {criteria['max_wall_minutes']:.0f} minutes\n"
          + (f"  5. after training, at least {criteria['min_first_call_share']} of the probe's first calls ask the "
             "first hop (every seed)\n" if "min_first_call_share" in criteria else "")
          + (f"  6. neither leak indicator ({', '.join(LEAKS)}) rises by more than {criteria['max_leak_rise']}\n"
             if "max_leak_rise" in criteria else "")
          + f"Budget per arm: {cfg.train.steps} steps x {cfg.rollout.batch_questions} questions x "
          f"{cfg.rollout.group_size} samples; turn credit: "
          f"{cfg.reward.turn.scorer + f' (weight {cfg.reward.turn.weight})' if cfg.reward.turn.scorer else 'off'}; "
          f"scaffold: {_scaffold_text(cfg)}; arms: {', '.join(arms)}", flush=True)


def _scaffold_text(cfg: Config) -> str:
    scaffold = cfg.rollout.scaffold
    if scaffold.fn is None:
        return "off"
    return f"{scaffold.fn} for {scaffold.members} of {cfg.rollout.group_size} members, CE {scaffold.ce_coef}"


def report(verdict: dict) -> str:
    def line(name: str, c: dict) -> str:
        return f"{name}: {c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] (n={c['n']}, p={c['p_value']:.3f})"

    gains = verdict.get("seed_gains") or {"trained": verdict["trained_gain"]}
    lines = [line(f"{arm} answer-score change", gain) for arm, gain in gains.items()]
    if len(gains) > 1:
        lines.append(f"mean change over seeds: {verdict['mean_gain']:+.3f}")
    if "control_gain" in verdict:
        lines += [line("control answer-score change", verdict["control_gain"]),
                  line("trained - control (after)", verdict["trained_vs_control"])]
    fmt = verdict["format_valid"]
    lines.append(f"format-valid share: {fmt['before']:.3f} -> {fmt['after']:.3f}")
    for arm, m in verdict.get("mechanism", {}).items():
        lines.append(f"{arm}: second call {m['before']['second_call']} -> {m['after']['second_call']}; uses the first "
                     f"reply {m['before']['uses_reply']} -> {m['after']['uses_reply']}; names the bridge "
                     f"{m['before']['names_bridge']} -> {m['after']['names_bridge']}; first call asks the first hop "
                     f"{m['before'].get('first_hop')} -> {m['after'].get('first_hop')}; leaks "
                     + ", ".join(f"{k} {m['before'].get(k)} -> {m['after'].get(k)}" for k in LEAKS)
                     + " (two-hop questions)")
    for relation, e in verdict.get("by_relation", {}).items():
        lines.append(f"  {relation}: n={e['n']} answer score {e['before']} -> {e.get('after')}; best constant "
                     f"{e['best_constant']['answer']!r} scores {e['best_constant']['score']}")
    lines += [f"  {name}: {'PASS' if ok else ('not run' if ok is None else 'FAIL')}"
              for name, ok in verdict["checks"].items()]
    lines.append("PASSED" if verdict["passed"] else "NOT PASSED")
    return "\n".join(lines)


def kept_arms(path: Path, saved: dict, rerun: list[str]) -> dict[str, dict]:
    """The arms of an earlier part of the same experiment, minus those about to run again."""
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    same = ("config", "overrides", "steps", "criteria", "probe_dataset", "probe_limit", "seeds")
    earlier = {"probe_dataset": "screened_probe", "probe_limit": None, "seeds": None, **earlier}  # older files
    if any(earlier.get(k) != saved[k] for k in same):
        raise SystemExit(f"{path} holds another experiment ({ {k: earlier.get(k) for k in same[:3]} }); "
                         "--keep needs the same --config, --set and --steps (or use another --out)")
    return {arm: r for arm, r in earlier["results"].items() if arm not in rerun}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/learning-smollm.yaml")
    parser.add_argument("--arms", nargs="+", default=["trained", "control"], metavar="ARM",
                        help="trained (every seed of the criterion), control, or trained:SEED (one seed alone; "
                             "with --keep the experiment is run in parts).")
    parser.add_argument("--steps", type=int, help="Override train.steps (the budget of each arm).")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="Extra config override KEY=VALUE (as `prompt-r1 train --set`), repeatable.")
    parser.add_argument("--probe-dataset", default="screened_probe",
                        help="Dataset of the probe set (split test): compositional_probe for the two-hop task.")
    parser.add_argument("--probe-limit", type=int, metavar="N",
                        help="Probe only the first N questions (an end-to-end check with a tiny budget; the "
                             "criterion needs the whole probe set).")
    parser.add_argument("--probe-only", action="store_true",
                        help="Only probe the untrained agent (no training): OUT/probe-only.json.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the arms already in OUT/learning.json that this call does not run (an experiment "
                             "run in parts, e.g. the control after a crash); they must have the same config, "
                             "overrides and steps.")
    parser.add_argument("--replot", action="store_true", help="No training: judge the arms in OUT/learning.json again "
                        "against its recorded criteria, rewrite its verdict and redraw OUT/learning.png.")
    parser.add_argument("--criteria", type=Path, metavar="FILE",
                        help="A pre-registered criterion file (JSON, e.g. benchmarks/criteria/*.json): the bar, and "
                             "the seeds of the trained arm; printed before training. Default: the built-in bar, one seed.")
    parser.add_argument("--agents", type=Path, metavar="DIR",
                        help="Keep each arm's trained agent in DIR/ARM (default runs/learning-agents/<OUT's name>): "
                             "under LoRA the adapter alone (a few MiB); the results record the path, for "
                             "`prompt-r1 evaluate --agent trained=PATH`.")
    args = parser.parse_args()
    setup_logging()
    json_path, png_path = args.out / "learning.json", args.out / "learning.png"
    if args.replot:
        saved = json.loads(json_path.read_text())
        results = saved["results"]
        if "trained" in results:
            saved["verdict"] = judge(results, saved.get("criteria"))
            atomic_write_text(json_path, json.dumps(saved, indent=1))
            print(report(saved["verdict"]))
        return plot(saved, png_path)
    overrides = parse_overrides(args.overrides)
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    cfg = load_config(ROOT / args.config, overrides)
    if args.probe_only:
        return probe_only(cfg, args)
    criteria = load_criteria(args.criteria)
    seeds = criteria.pop("seeds", None) or [cfg.seed]
    runs = arm_runs(args.arms, seeds)
    print_criteria(cfg, list(runs), {**criteria, "seeds": seeds}, args.criteria)
    saved = {"config": args.config, "overrides": args.overrides, "steps": cfg.train.steps, "criteria": criteria,
             "probe_dataset": args.probe_dataset, "probe_limit": args.probe_limit,
             "seeds": seeds if len(seeds) > 1 else None}
    agents = args.agents or ROOT / "runs" / "learning-agents" / args.out.resolve().name
    results = kept_arms(json_path, saved, list(runs)) if args.keep else {}
    for arm, seed in runs.items():
        arm_cfg = cfg.model_copy(update={"seed": seed})
        with tempfile.TemporaryDirectory(prefix=f"learning-{arm}-") as home:
            results[arm] = run_arm(arm_cfg, arm, Path(home), args.probe_dataset, args.probe_limit,
                                   keep_agent=agents / arm, stop_rule=criteria.get("stop_rule"))
        print(f"{arm}: trained {cfg.train.steps} steps in {results[arm]['train_s'] / 60:.1f} min; reward per step "
              + " ".join(f"{p['reward_mean']:+.2f}" for p in results[arm]["curve"]), flush=True)
        # Written after every arm: a long experiment keeps what it finished.
        atomic_write_text(json_path, json.dumps({**saved, "results": results}, indent=1))
    results = {arm: results[arm] for arm in [*arm_runs(["trained"], seeds), "control"] if arm in results}
    verdict = judge(results, criteria) if "trained" in results else None
    saved = {**saved, "results": results, "verdict": verdict}
    atomic_write_text(json_path, json.dumps(saved, indent=1))
    plot(saved, png_path)
    if verdict:
        print(report(verdict))
    print(f"wrote {json_path} and {png_path}")


def arm_runs(arms: list[str], seeds: list[int]) -> dict[str, int]:
    """Arm name -> its seed: `trained` at the first seed, `trained-seedN` at each other, the control
    once at the first seed; `trained:N` is the trained arm at seed N alone (an experiment run in
    parts, with `--keep`).

    >>> arm_runs(["trained", "control"], [0, 1])
    {'trained': 0, 'trained-seed1': 1, 'control': 0}
    >>> arm_runs(["trained:1"], [0, 1])
    {'trained-seed1': 1}
    """
    def name(seed: int) -> str:
        return "trained" if seed == seeds[0] else f"trained-seed{seed}"

    out: dict[str, int] = {}
    for arm in arms:
        if arm == "trained":
            out.update({name(seed): seed for seed in seeds})
        elif arm.startswith("trained:"):
            seed = int(arm.partition(":")[2])
            if seed not in seeds:
                raise SystemExit(f"--arms {arm}: seed {seed} is not one of the criterion's seeds {seeds}")
            out[name(seed)] = seed
        elif arm == "control":
            out[arm] = seeds[0]
        else:
            raise SystemExit(f"--arms {arm}: use trained, control or trained:SEED")
    return out


def probe_only(cfg: Config, args) -> None:
    """The untrained agent on the probe set: answer score, the mechanism shares, per relation."""
    with tempfile.TemporaryDirectory(prefix="learning-probe-") as home:
        result = run_arm(cfg, "untrained", Path(home), args.probe_dataset, args.probe_limit, train=False)
    rows = result["probe_before"]
    summary = {"agent": cfg.agent.model, "probe_dataset": args.probe_dataset, "wall_s": result["wall_s"],
               **mechanism(rows), "by_relation": by_relation(rows)}
    path = args.out / "probe-only.json"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"config": args.config, "overrides": args.overrides, "summary": summary,
                                        "probe": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
