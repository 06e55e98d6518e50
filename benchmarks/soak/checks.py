"""What the soak must show (issue #48, item 2), counted from what the runs left: the warehouse, the
run folders, MLflow and the Prefect runs the soak collected before it stopped the server.

Each check returns a `Check`: its counts, pass or fail and one line saying why; `run.py` prints
them, writes them to `result.json` and exits non-zero when one fails. The checks only read: they
never repair what they count.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TEMP_NAME = re.compile(r"^\..+\.\w+-\d+-[0-9a-f]{8}$")  # core.fsutil._temp_beside's names
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@dataclass
class Check:
    name: str
    passed: bool
    summary: str
    counts: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"[{'PASS' if self.passed else 'FAIL'}] {self.name}: {self.summary}"


def match_runs(windows: dict[str, tuple[float, float]], metric_times: dict[str, list[float]]
               ) -> tuple[dict[str, str], set[str]]:
    """Which training run each flow run trained (the one whose metrics it logged: the metric's
    time falls in the flow run's [start, end]), and the training runs more than one flow run
    logged to (continued after a crash: resumed). The flows' own "continuing unfinished training
    run" lines are INFO, which Prefect's run logs leave out.

    >>> match_runs({"f1": (0, 10), "f2": (20, 30), "f3": (40, 50)}, {"a": [5, 25], "b": [45]})
    ({'f1': 'a', 'f2': 'a', 'f3': 'b'}, {'a'})
    """
    run_of_flow: dict[str, str] = {}
    flows_of_run: dict[str, set[str]] = {}
    for flow, (start, end) in windows.items():
        for run, times in metric_times.items():
            if any(start <= t <= end for t in times):
                run_of_flow[flow] = run
                flows_of_run.setdefault(run, set()).add(flow)
    return run_of_flow, {run for run, flows in flows_of_run.items() if len(flows) > 1}


def runs_accounted(runs: list[dict[str, Any]]) -> Check:
    """Every started flow run finished, or failed with a reason: a state message and an error in
    its logs (a crash's message names the exit status or the missed heartbeats)."""
    started = [r for r in runs if r["start_time"]]
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    bad = []
    for r in started:
        state = r["state"]
        if state == "COMPLETED":
            counts["completed"] += 1
        elif state in TERMINAL:
            reason = (r["message"] or "").strip()
            said = r["error_logs"] > 0 or re.search(r"exit|status code|heartbeat|signal", reason, re.I)
            counts["failed_with_reason" if reason and said else "failed_without_reason"] += 1
            reasons[f"{state}: {(reason.splitlines() or [''])[0][:140]}"] += 1
            if not (reason and said):
                bad.append(r["name"])
        else:
            counts["not_finished"] += 1
            bad.append(r["name"])
    due = [r for r in runs if not r["start_time"] and r.get("due")]
    counts["due_never_started"] = len(due)
    counts["started"] = len(started)
    return Check("runs finished or failed with a reason", not bad and bool(started),
                 f"{len(started)} started: {dict(counts)}" + (f"; without a reason or unfinished: {bad}" if bad else ""),
                 {**counts, "reasons": dict(reasons)})


def _trajectory_counts(wh: Any) -> list[tuple]:
    return wh.query("SELECT run_id, step, count(*), count(DISTINCT (question_id, group_index)) "
                    "FROM trajectories GROUP BY run_id, step ORDER BY run_id, step")


def steps_and_trajectories(wh: Any, mlflow_steps: dict[str, Counter], finished: set[str], steps: int,
                           per_step: int) -> list[Check]:
    """Every GRPO step recorded once (warehouse rows and the MLflow metric), every step's
    trajectories all there and none twice; finished runs hold steps 0..steps-1 exactly."""
    rows = _trajectory_counts(wh)
    by_run: dict[str, list[int]] = {}
    lost = dup = 0
    for run_id, step, n, distinct in rows:
        by_run.setdefault(run_id, []).append(step)
        dup += n - distinct
        lost += max(per_step - distinct, 0)
    gaps = [r for r, s in by_run.items() if sorted(s) != list(range(len(s)))]
    incomplete = [r for r in finished if sorted(by_run.get(r, [])) != list(range(steps))]
    twice = {r: [s for s, c in counts.items() if c > 1] for r, counts in mlflow_steps.items()}
    twice = {r: s for r, s in twice.items() if s}
    mlflow_missing = [r for r in finished if sorted(mlflow_steps.get(r, Counter())) != list(range(steps))]
    step_check = Check(
        "every GRPO step recorded exactly once", not (gaps or incomplete or twice or mlflow_missing),
        f"{len(rows)} steps in {len(by_run)} runs ({len(finished)} finished); gaps {len(gaps)}, finished runs "
        f"without all {steps} steps {len(incomplete)}, steps logged twice to MLflow {sum(map(len, twice.values()))}, "
        f"finished runs whose MLflow steps differ {len(mlflow_missing)}",
        {"steps": len(rows), "runs": len(by_run), "gaps": gaps, "incomplete": incomplete, "mlflow_twice": twice,
         "mlflow_missing": mlflow_missing})
    traj_check = Check(
        "no trajectory lost or duplicated", lost == 0 and dup == 0,
        f"{sum(r[2] for r in rows)} trajectories in {len(rows)} steps ({per_step} a step): lost {lost}, duplicated {dup}",
        {"trajectories": sum(r[2] for r in rows), "lost": lost, "duplicated": dup})
    return [step_check, traj_check]


def no_error_scored(wh: Any, marker: str) -> Check:
    """No trajectory or evaluation row that an environment failure ended carries a score, and no
    fault body (the proxy's `marker`) reached an agent's context, a reply or a prediction."""
    scored = wh.query("SELECT count(*) FROM trajectories WHERE error IS NOT NULL AND reward_total IS NOT NULL")[0][0]
    hidden = wh.query(
        "SELECT count(*) FROM trajectories t WHERE t.error IS NULL AND EXISTS (SELECT 1 FROM env_calls c WHERE "
        "c.run_id = t.run_id AND c.step = t.step AND c.question_id = t.question_id AND "
        "c.group_index = t.group_index AND c.error IS NOT NULL)")[0][0]
    eval_scored = wh.query("SELECT count(*) FROM eval_predictions WHERE error IS NOT NULL AND score IS NOT NULL")[0][0]
    leaked = wh.query(
        "SELECT (SELECT count(*) FROM trajectories WHERE contains(array_to_string(env_replies, chr(10)), ?) OR "
        "contains(array_to_string(agent_turns, chr(10)), ?)) + "
        "(SELECT count(*) FROM eval_predictions WHERE contains(prediction, ?))", [marker, marker, marker])[0][0]
    errors = wh.query("SELECT (SELECT count(*) FROM trajectories WHERE error IS NOT NULL), "
                      "(SELECT count(*) FROM env_calls WHERE error IS NOT NULL), (SELECT count(*) FROM env_calls), "
                      "(SELECT count(*) FROM eval_predictions WHERE error IS NOT NULL)")[0]
    bad = scored + hidden + eval_scored + leaked
    return Check("no environment error scored", bad == 0,
                 f"{errors[1]} of {errors[2]} environment calls failed, ending {errors[0]} trajectories and "
                 f"{errors[3]} evaluation rows; scored anyway {scored + eval_scored}, failed call inside an "
                 f"unfailed trajectory {hidden}, fault text in context or answers {leaked}",
                 {"failed_calls": errors[1], "calls": errors[2], "error_trajectories": errors[0],
                  "error_eval_rows": errors[3], "scored": scored, "eval_scored": eval_scored, "hidden": hidden,
                  "leaked": leaked})


def env_exercised(wh: Any, proxy_faults: dict[str, int], min_calls: int) -> Check:
    """The environment's faults had calls to hit: at least `min_calls` environment calls, every
    training question of every recorded step asked the environment at least once (the soak's
    scaffold, `calls`), and the proxy injected at least one fault into an environment call."""
    calls, failed = wh.query("SELECT count(*), count(error) FROM env_calls")[0]
    questions, silent = wh.query(
        "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM env_calls c WHERE c.run_id = t.run_id "
        "AND c.step = t.step AND c.question_id = t.question_id)) FROM (SELECT DISTINCT run_id, step, question_id "
        "FROM trajectories) t")[0]
    injected = sum(proxy_faults.values())
    ok = calls >= min_calls and silent == 0 and questions > 0 and injected >= 1
    return Check("environment faults exercised", ok,
                 f"{calls} environment calls (at least {min_calls} wanted), {failed} failed after retries; "
                 f"{questions - silent} of {questions} training questions asked the environment; the proxy injected "
                 f"{injected} faults into calls {dict(proxy_faults)}",
                 {"calls": calls, "failed_calls": failed, "questions": questions, "questions_without_call": silent,
                  "injected": injected, "injected_by_kind": dict(proxy_faults)})


def crash_recovery(runs: list[dict[str, Any]], resumes: dict[str, list[tuple[int, int]]], max_attempts: int) -> Check:
    """Every deployment run that crashed was retried (`tasks.recovery`): none ends `Crashed` with
    attempts left, and each retried run that completed continued its own training run (its
    `resumes` tag holds a retry's attempt and the step it resumed at). `resumes`: flow run id ->
    the (attempt, step) pairs of the training run it owns."""
    retried = [r for r in runs if r.get("attempts", 0) > 1]
    left = [r["name"] for r in runs if r["state"] == "CRASHED" and r.get("attempts", 0) < max_attempts]
    completed = [r for r in retried if r["state"] == "COMPLETED"]
    not_resumed = [r["name"] for r in completed if not any(a > 1 for a, _ in resumes.get(r["id"], []))]
    steps = {r["name"]: [s for a, s in resumes.get(r["id"], []) if a > 1] for r in retried}
    states = Counter(r["state"] for r in retried)
    return Check("crashed runs retried and resumed", not left and not not_resumed,
                 f"{len(retried)} runs retried ({dict(states)}), resumed at steps {steps}; crashed and not retried "
                 f"{len(left)}; completed without resuming their training run {len(not_resumed)}",
                 {"retried": len(retried), "retried_states": dict(states), "resumed_at": steps,
                  "crashed_not_retried": left, "completed_not_resumed": not_resumed})


def load_tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def same_agent(a: Path, b: Path) -> bool:
    import torch

    ta, tb = load_tensors(a), load_tensors(b)
    return bool(ta) and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def first_divergence(wh: Any, base: Any, run_id: str, base_run: str) -> str:
    """Where a run's trajectories first differ from the fault-free run's, and whether the
    environment's replies differed there (then the environment, not training, made the difference)."""
    sql = ("SELECT step, question_id, group_index, token_ids, env_replies, error FROM trajectories WHERE run_id = ? "
           "ORDER BY step, question_id, group_index")
    ours = {(r[0], r[1], r[2]): r[3:] for r in wh.query(sql, [run_id])}
    theirs = {(r[0], r[1], r[2]): r[3:] for r in base.query(sql, [base_run])}
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            o, t = ours.get(key), theirs.get(key)
            if o is None or t is None:
                return f"step {key[0]}: trajectory {key[1:]} only in one run"
            if o[2]:
                return f"step {key[0]}: an environment failure ended trajectory {key[1:]} ({o[2][:80]})"
            if o[1] != t[1]:
                return f"step {key[0]}: the environment replied otherwise to trajectory {key[1:]}"
            return f"step {key[0]}: trajectory {key[1:]} differs with the same environment replies"
    return "no trajectory differs"


def agents_match_baseline(wh: Any, base: Any, runs: dict[str, Path], resumed: set[str], baseline: Path,
                          base_run: str) -> Check:
    """Each finished run's exported agent against the fault-free run's (same config and seed);
    a difference is explained by where the run's trajectories first left the fault-free ones. It
    fails only for a resumed run whose agent differs with no difference in what it was trained on."""
    equal, differ, unexplained = [], {}, []
    for run_id, agent in sorted(runs.items()):
        if same_agent(agent, baseline):
            equal.append(run_id)
            continue
        why = first_divergence(wh, base, run_id, base_run)
        differ[run_id] = why
        if run_id in resumed and ("differs with the same" in why or why == "no trajectory differs"):
            unexplained.append(run_id)
    resumed_equal = [r for r in equal if r in resumed]
    return Check("resumed runs' agents equal to the fault-free run's", not unexplained,
                 f"{len(runs)} finished runs: {len(equal)} equal ({len(resumed_equal)} of "
                 f"{len([r for r in runs if r in resumed])} resumed), {len(differ)} differ"
                 + (f", unexplained: {unexplained}" if unexplained else ""),
                 {"equal": equal, "differ": differ, "resumed": sorted(resumed), "unexplained": unexplained})


def actor_restarts(kills: list[dict[str, Any]], restarts_by_run: dict[str, float], run_of_flow: dict[str, str],
                   completed_flows: set[str], retried_flows: set[str] = frozenset()) -> Check:
    """Every rollout actor killed during a flow run that then completed shows up in that training
    run's `rollout_actor_restarts` in MLflow; a flow run that crashed and was retried is left out
    (the kill may have come in the attempt that crashed, before its metrics reached a checkpoint)."""
    landed = [k for k in kills if k.get("flow_run")]
    missing = [k for k in landed if k["flow_run"] in completed_flows and k["flow_run"] not in retried_flows
               and restarts_by_run.get(run_of_flow.get(k["flow_run"], ""), 0) < 1]
    total = sum(restarts_by_run.values())
    return Check("dead rollout actors restarted and counted", not missing,
                 f"{len(landed)} actor kills landed ({sum(k['flow_run'] in completed_flows for k in landed)} in runs "
                 f"that completed); rollout_actor_restarts in MLflow {total:g}; completed runs missing the count "
                 f"{len(missing)}", {"kills": len(landed), "restarts_logged": total, "missing": missing})


def leftovers(processes: list[str], home: Path, mounted: bool) -> Check:
    """No process of the soak (flow runs, Ray, actors, servers, workers) alive after it stopped,
    no half-written temporary folder in the runs home, the soak's filesystem unmounted."""
    temps = [str(p.relative_to(home)) for p in home.rglob(".*") if TEMP_NAME.match(p.name)] if home.exists() else []
    return Check("nothing left behind", not processes and not temps and not mounted,
                 f"processes {len(processes)}, temporary folders {len(temps)}, mount left {mounted}",
                 {"processes": processes, "temporary": temps})


def no_secret(secret: str, roots: list[Path], since: float, skip: set[Path]) -> Check:
    """The environment's API key appears in no file under `roots` (logs, databases, run folders)
    modified since the soak began."""
    needle, hits, scanned = secret.encode(), [], 0
    for root in roots:
        for path in root.rglob("*") if root.exists() else []:
            try:
                if not path.is_file() or path in skip or path.stat().st_mtime < since - 5 \
                        or path.stat().st_size > 512 * 1024 * 1024:
                    continue
                scanned += 1
                if needle in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                continue
    return Check("no secret in any log", not hits, f"{scanned} files scanned, {len(hits)} hold the API key",
                 {"scanned": scanned, "hits": hits})


def time_lost(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds lost to faults: every failed run's whole time, and each completed run's time over
    the fastest completed run of its deployment."""
    lost = 0.0
    fastest: dict[str, float] = {}
    for r in runs:
        if r["state"] == "COMPLETED" and r["seconds"]:
            fastest[r["deployment"]] = min(fastest.get(r["deployment"], r["seconds"]), r["seconds"])
    for r in runs:
        if not r["seconds"]:
            continue
        lost += r["seconds"] - fastest.get(r["deployment"], 0.0) if r["state"] == "COMPLETED" else r["seconds"]
    return {"seconds_lost": round(lost, 1), "fastest_completed_s": fastest}


def report(checks: list[Check]) -> dict[str, Any]:
    return {"passed": all(c.passed for c in checks), "checks": [asdict(c) for c in checks], "time": time.time()}
