"""An hour of faults: the `pipeline` and `train` deployments on interval schedules, served by a
real local Prefect server and process worker, with the faults of a seeded plan injected at
random moments, then the counts of issue #48 (item 2) from the warehouse, run folders and MLflow.

    python -m benchmarks.soak.run --minutes 60 --seed 0 --out /tmp/soak

The config is configs/smoke.yaml (tiny agent, transformers backend: reruns are exact) with three
steps, a checkpoint each, a small evaluation, every training question's group asking the
environment (`calls`: a scaffolded first call), and the environment a real SmolLM2-135M on a
managed vLLM server reached through `tests/chaos_proxy.ChaosProxy` on loopback (the faults' way
in); it is written to OUT/soak.yaml. A deployment run that crashes (a kill, a lost worker) is run
again by `tasks.recovery`'s automation and continues its training run from the last checkpoint. First one fault-free `prompt-r1 train` of that config (OUT/baseline),
then the schedule for `--minutes`, then the schedules are paused, runs not yet started are
deleted, the running ones finish (at most `--drain-minutes`, then cancelled), the worker and
server stop, the checks run, and everything the soak started is stopped. OUT/result.json holds
the plan, what each fault hit and the checks; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from benchmarks.soak import calls, checks, faults
from benchmarks.soak.prefect_api import active_runs, cancel, collect_runs, stop_scheduling
from benchmarks.soak.plan import ENV_KINDS, make_plan, overlapping, to_json
from benchmarks.soak.services import TAG_VAR, Services

ROOT = Path(__file__).resolve().parents[2]
SECRET_VAR = "PROMPT_R1_SOAK_API_KEY"
TARGET_WAIT_S = 120.0   # a kill waits this long at most for its target (a run that trains) to exist
TARGET_POLL_S = 0.5     # and looks this often: a rollout of the smoke config lasts a few seconds
SWEEP_EVERY_S = 30.0    # how often the soak sweeps crashed runs (the recover-crashed deployment: 180 s)
log = logging.getLogger("soak")


def write_config(path: Path, base_url: str, model: str) -> dict[str, Any]:
    """configs/smoke.yaml with the environment behind the proxy, three steps and a small evaluation."""
    cfg = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    cfg["name"] = "soak"
    cfg["data"]["sources"] = [str(ROOT / "data" / "sample")]
    cfg["environment"] = {"name": "soak-env", "kind": "openai", "model": model, "base_url": base_url,
                          "api_key_env": SECRET_VAR, "max_tokens": 16, "temperature": 0.0, "timeout_s": 20.0,
                          "max_retries": 4, "backoff_s": 0.5, "call_deadline_s": 120.0, "concurrency": 8}
    cfg["train"].update({"steps": 3, "checkpoint_every": 1})
    # every training question's group asks the environment (`calls`): its faults have calls to hit
    cfg["rollout"]["scaffold"] = calls.scaffold_section(cfg["rollout"]["group_size"])
    cfg["eval"].update({"methods": ["direct", "agent"], "limit_per_dataset": 1, "agent_checkpoints": ["trained"]})
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out).resolve()
        self.tag, self.secret = uuid.uuid4().hex, "sk-soak-" + secrets.token_hex(16)
        self.home = self.out / "runs"
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.down = {"server": 0, "worker": 0}  # planned outages in progress (the supervisor leaves them be)
        self.unplanned = Counter()
        self.ray_sessions: set[Path] = set()  # where the runs' Ray really wrote (`faults.ray_sessions`)
        self.swept: list[dict[str, Any]] = []  # crashed runs the soak's sweep set to AwaitingRetry
        self._next_sweep = 0.0

    def env(self, home: Path) -> dict[str, str]:
        return {**os.environ, TAG_VAR: self.tag, SECRET_VAR: self.secret, "PROMPT_R1_HOME": str(home),
                "PREFECT_HOME": str(self.out / "prefect"),
                "PROMPT_R1_MODELS": self.args.models, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def record(self, **event: Any) -> None:
        with self._lock:
            self.events.append(event)
        log.info("fault %s", event)

    # -- faults --------------------------------------------------------------------------------
    def inject(self, fault, t0: float) -> None:
        time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
        started = round(time.monotonic() - t0, 1)
        try:
            result = self._inject(fault)
        except Exception as err:  # an injector's own failure is recorded, never the soak's end
            result = {"error": f"{type(err).__name__}: {err}"}
        self.record(kind=fault.kind, planned_s=fault.at_s, started_s=started, ended_s=round(time.monotonic() - t0, 1),
                    **result)

    def _until_target(self, kill) -> dict[str, Any]:
        deadline = time.monotonic() + TARGET_WAIT_S
        while time.monotonic() < deadline:
            hit = kill(self.tag)
            if hit:
                return hit
            time.sleep(TARGET_POLL_S)
        return {"skipped": f"nothing to kill within {TARGET_WAIT_S:g}s (no run was training)"}

    def _inject(self, fault) -> dict[str, Any]:
        if fault.kind in ENV_KINDS:
            self.env_faults.start(fault.kind)
            time.sleep(fault.duration_s)
            self.env_faults.stop(fault.kind)
            return {}
        if fault.kind == "rollout_actor":
            return self._until_target(faults.kill_rollout_actor)
        if fault.kind == "learner":
            return self._until_target(faults.kill_learner)
        if fault.kind == "server_restart":
            self.down["server"] += 1
            try:
                self.services.stop_server()
                time.sleep(fault.duration_s)
                self.services.start_server()
            finally:
                self.down["server"] -= 1
            return {}
        if fault.kind == "worker_kill":
            self.down["worker"] += 1
            try:
                pid = self.services.kill_worker()
                time.sleep(fault.duration_s)
                self.services.start_worker()
            finally:
                self.down["worker"] -= 1
            return {"pid": pid}
        if fault.kind == "disk_full":
            what = self.disk.start(self.tag)
            time.sleep(fault.duration_s)
            self.disk.stop()
            return what
        if fault.kind == "mlflow_lock":
            return faults.hold_mlflow_lock(self.home / "mlflow.db", fault.duration_s)
        raise ValueError(fault.kind)

    def supervise(self) -> None:
        """A server or worker that died outside a planned outage is started again (and counted); the
        Ray session folders the runs name are noted (the secret check scans them); every
        `SWEEP_EVERY_S` crashed runs with attempts left are set to AwaitingRetry (`sweep`)."""
        with contextlib.suppress(Exception):
            self.ray_sessions |= faults.ray_sessions(self.tag)
        if time.monotonic() >= self._next_sweep:
            self.sweep()
        if not self.down["server"] and not self.services.healthy() and self.services.server.poll() is not None:
            self.unplanned["server_died"] += 1
            self.services.start_server()
        if not self.down["worker"] and self.services.worker.poll() is not None:
            self.unplanned["worker_died"] += 1
            self.services.start_worker()

    def sweep(self) -> None:
        """`tasks.recovery.retry_crashed`, what the `recover-crashed` deployment runs for a user: the
        backstop of the retry automation, which missed crashes reported right after a server restart
        (BENCHMARKS.md). Runs it retried are recorded (`swept`); a server down now is tried again later."""
        from tasks.recovery import retry_crashed

        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        if self.down["server"] or not self.services.healthy():
            return
        try:
            for run_id in self.services.api(retry_crashed):
                self.swept.append({"flow_run": run_id, "at": round(time.time(), 1)})
                log.info("sweep: crashed flow run %s set to AwaitingRetry", run_id)
        except Exception as err:  # the server restarting under it: the next sweep tries again
            log.warning("sweep failed: %s: %s", type(err).__name__, err)

    # -- the soak ------------------------------------------------------------------------------
    def baseline(self, config: Path) -> tuple[Path, str, float]:
        """One fault-free `prompt-r1 train` of the soak config in its own home: (agent, run id, seconds)."""
        home = self.out / "baseline"
        env = self.env(home)
        t0 = time.monotonic()
        for cmd in (["ingest", str(ROOT / "data" / "sample")], ["train", "-c", str(config)]):
            with open(self.out / "baseline.log", "ab") as out:
                subprocess.run([sys.executable, "-m", "flows.cli", *cmd], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT, check=True, timeout=self.args.drain_minutes * 60)
        runs = sorted((home / "soak").glob("*/agent"))
        if len(runs) != 1:
            raise RuntimeError(f"the fault-free run left {len(runs)} agents in {home}")
        return runs[0], runs[0].parent.name, time.monotonic() - t0

    def run(self) -> int:
        from tests.chaos_proxy import MARKER, ChaosProxy

        from prompt_r1.config.env import EnvConfig
        from prompt_r1.env.vllm_server import free_port
        from prompt_r1.rollout.pool import actor_environment

        args, out = self.args, self.out
        out.mkdir(parents=True, exist_ok=True)
        os.environ[TAG_VAR] = self.tag  # the vLLM server and everything else started here carry it
        os.environ.update({"PROMPT_R1_MODELS": args.models, "PROMPT_R1_HOME": str(out / "driver"),
                           "PREFECT_HOME": str(out / "prefect"), "HF_HUB_OFFLINE": "1"})
        plan = make_plan(args.seed, args.minutes)
        (out / "plan.json").write_text(to_json(plan))
        log.info("plan: %d faults, %d overlapping pairs", len(plan), len(overlapping(plan)))
        self.disk = faults.DiskFull(self.home, out / "runs.img", args.disk_mib)
        result: dict[str, Any] = {"args": vars(args), "disk_full_method": self.disk.setup(), "plan": json.loads(
            to_json(plan))}
        log.info("disk_full faults: %s", result["disk_full_method"])
        since = time.time()
        try:
            with contextlib.ExitStack() as stack:
                server_cfg = EnvConfig(name="soak-env", kind="vllm", model="smollm2-135m-instruct", max_tokens=16,
                                       concurrency=8)
                direct = stack.enter_context(actor_environment(server_cfg, out / "logs"))
                proxy = stack.enter_context(ChaosProxy(direct.base_url, rate=0.0, seed=args.seed, hang_s=25.0))
                self.env_faults = faults.EnvFaults(proxy)
                config = out / "soak.yaml"
                cfg = write_config(config, proxy.base_url, direct.model)
                if not args.no_baseline:
                    agent, base_run, seconds = self.baseline(config)
                    result["baseline"] = {"agent": str(agent), "run_id": base_run, "seconds": round(seconds, 1)}
                    log.info("fault-free run %s in %.0f s", base_run, seconds)
                self.services = Services(ROOT, out, args.port or free_port(), self.env(self.home))
                stack.callback(self.services.stop_server)
                self.services.start_server()
                self.services.deploy(config, {"pipeline": args.pipeline_every, "train": args.train_every},
                                     args.zombie_automation)
                stack.callback(self.services.stop_worker)  # before the server (LIFO)
                self.services.start_worker()
                result.update(self.schedule(plan))
                result["prefect_runs"] = self.collect()
                self.services.stop_worker()
                self.services.stop_server()
                result["requests"] = {"proxied": len(proxy.log), "faults": dict(proxy.faults_injected())}
            result["checks"] = self.check(cfg, result, MARKER, since)
        finally:
            left = faults.tagged(self.tag)
            for proc in left:  # counted by the checks above; stopped here so nothing stays
                with contextlib.suppress(Exception):
                    proc.kill()
            # keep the runs' filesystem image when the checks did not finish, so they can be read again
            self.disk.teardown(keep_image="checks" not in result)
            if "checks" in result and os.path.ismount(self.home):  # the soak's own filesystem is a leftover too
                result["checks"]["passed"] = False
                result["checks"]["lines"].append(f"[FAIL] filesystem on {self.home} still mounted")
            (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
        for line in result["checks"]["lines"]:
            print(line)
        print(f"time lost to faults: {result['checks']['time_lost']['seconds_lost']:.0f} s; result: "
              f"{out / 'result.json'}")
        return 0 if result["checks"]["passed"] else 1

    def schedule(self, plan) -> dict[str, Any]:
        """Start the schedules, inject the plan for `--minutes`, then stop scheduling and drain."""
        args = self.args
        t0 = time.monotonic()
        wall0 = time.time()
        threads = [threading.Thread(target=self.inject, args=(f, t0), name=f"fault-{f.kind}", daemon=True)
                   for f in plan]
        for thread in threads:
            thread.start()
        end = t0 + args.minutes * 60
        while time.monotonic() < end:
            time.sleep(5)
            self.supervise()
        for thread in threads:  # every window is shorter than the tail the plan leaves
            thread.join(max(0.0, end + 180 - time.monotonic()))
        self.env_faults.active.clear()
        self.env_faults._apply()
        wall_end = time.time()
        due = self.services.api(stop_scheduling, wall_end)
        drained = self._drain(t0 + (args.minutes + args.drain_minutes) * 60)
        return {"events": self.events, "soak_start": wall0, "soak_end": wall_end, "due_never_started": due,
                "drain": drained, "unplanned": dict(self.unplanned), "swept": self.swept,
                "seconds": round(time.monotonic() - t0, 1)}

    def _drain(self, deadline: float) -> dict[str, Any]:
        """Wait (bounded) for the runs in progress; past the deadline they are cancelled."""
        while time.monotonic() < deadline:
            self.sweep()  # a crash just before the drain is retried in it
            if not self.services.api(active_runs):
                return {"cancelled": 0}
            self.supervise()
            time.sleep(10)
        ids = self.services.api(active_runs)
        self.services.api(cancel, ids)
        cancel_end = time.monotonic() + 180
        while time.monotonic() < cancel_end and self.services.api(active_runs):
            time.sleep(5)
        return {"cancelled": len(ids)}

    def collect(self) -> list[dict[str, Any]]:
        return self.services.api(collect_runs)

    def _training_runs(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """From MLflow: each training run's steps, metric times and rollout-actor restarts, and the
        (attempt, step) continuations of the training run each scheduled flow run owns."""
        from mlflow import MlflowClient

        from tasks.recovery import OWNER_TAG, RESUMES_TAG, parse_resumes

        client = MlflowClient(tracking_uri=f"sqlite:///{self.home / 'mlflow.db'}")
        experiments = [e.experiment_id for e in client.search_experiments()]
        found = client.search_runs(experiments, "tags.flow = 'train'", max_results=5000)
        training_runs = {r["training_run"] for r in runs if r.get("training_run")} | {r.info.run_id for r in found}
        resumes = {r.data.tags[OWNER_TAG]: parse_resumes(r.data.tags.get(RESUMES_TAG)) for r in found
                   if r.data.tags.get(OWNER_TAG)}
        steps: dict[str, Counter] = {}
        restarts: dict[str, float] = {}
        times: dict[str, list[float]] = {}
        for run_id in training_runs:
            with contextlib.suppress(Exception):
                history = client.get_metric_history(run_id, "reward_mean")
                steps[run_id] = Counter(m.step for m in history)
                times[run_id] = [m.timestamp / 1000 for m in history]
                restarts[run_id] = sum(m.value for m in client.get_metric_history(run_id, "rollout_actor_restarts"))
        retried = {r.info.run_id for r in found if any(a > 1 for a, _ in parse_resumes(r.data.tags.get(RESUMES_TAG)))}
        return {"steps": steps, "restarts": restarts, "times": times, "resumes": resumes, "retried": retried}

    def check(self, cfg: dict[str, Any], result: dict[str, Any], marker: str, since: float) -> dict[str, Any]:
        from tasks.recovery import MAX_ATTEMPTS
        from warehouse.store import Warehouse

        runs = result["prefect_runs"]
        mlflow_runs = self._training_runs(runs)
        windows = {r["id"]: (r["start_ts"], r["end_ts"]) for r in runs if r.get("start_ts") and r.get("end_ts")}
        run_of_flow, continued = checks.match_runs(windows, mlflow_runs["times"])
        resumed = {r["training_run"] for r in runs if r.get("resumed")} | continued | mlflow_runs["retried"]
        folders = {p.parent.name: p for p in (self.home / "soak").glob("*/agent")}
        finished = {run_id for run_id in folders
                    if json.loads((folders[run_id].parent / "run.json").read_text()).get("finished_at")}
        per_step = cfg["rollout"]["batch_questions"] * cfg["rollout"]["group_size"]
        found: list[checks.Check] = [checks.runs_accounted(runs),
                                     checks.crash_recovery(runs, mlflow_runs["resumes"], MAX_ATTEMPTS)]
        with Warehouse(self.home / "warehouse.duckdb", read_only=True) as wh:
            found += checks.steps_and_trajectories(wh, mlflow_runs["steps"], finished, cfg["train"]["steps"], per_step)
            found.append(checks.no_error_scored(wh, marker))
            found.append(checks.env_exercised(wh, result["requests"]["faults"],
                                              cfg["rollout"]["batch_questions"] * cfg["train"]["steps"]))
            if "baseline" in result:
                with Warehouse(self.out / "baseline" / "warehouse.duckdb", read_only=True) as base:
                    found.append(checks.agents_match_baseline(
                        wh, base, {r: folders[r] for r in finished}, resumed, Path(result["baseline"]["agent"]),
                        result["baseline"]["run_id"]))
        kills = [e for e in result["events"] if e["kind"] == "rollout_actor"]
        completed = {r["id"] for r in runs if r["state"] == "COMPLETED"}
        run_of_flow.update({r["id"]: r["training_run"] for r in runs if r.get("training_run")})
        retried = {r["id"] for r in runs if r.get("attempts", 0) > 1}
        found.append(checks.actor_restarts(kills, mlflow_runs["restarts"], run_of_flow, completed, retried))
        left = [faults.describe(p) for p in faults.tagged(self.tag)]
        # the soak's filesystem is removed after the checks (they read it): `run` checks that it went
        found.append(checks.leftovers(left, self.home, mounted=False))
        found.append(checks.no_secret(self.secret, [self.out, *self._ray_dirs(result)], since, {self.out / "runs.img"}))
        return {**checks.report(found), "lines": [c.line() for c in found], "time_lost": checks.time_lost(runs),
                "overlapping_faults": len(overlapping(make_plan(self.args.seed, self.args.minutes)))}

    def _ray_dirs(self, result: dict[str, Any]) -> list[Path]:
        """Ray's session folders of the runs: those in Ray's temp folder by Ray's rule with the flow
        runs' environment, and those the runs' Ray processes named (recorded in `result`)."""
        ray_root = faults.ray_temp_root(self.env(self.home))
        ray_dirs = sorted(set(ray_root.glob("session_*")) | self.ray_sessions)
        result["ray_temp"] = {"root": str(ray_root), "sessions_seen": sorted(map(str, self.ray_sessions)),
                              "scanned": len(ray_dirs)}
        return ray_dirs


def soak_minutes(text: str) -> float:
    """`--minutes`: a finite number of at least 2 (the plan keeps the first and the last minute free of
    faults), as argparse's type, so NaN, infinity or a negative length are an argument error, exit 2.

    >>> soak_minutes("10")
    10.0
    >>> soak_minutes("inf")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: --minutes must be a finite number of at least 2 (a minute of warm-up and one of tail), got 'inf'
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 2:
        raise argparse.ArgumentTypeError(f"--minutes must be a finite number of at least 2 (a minute of warm-up and "
                                         f"one of tail), got {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=soak_minutes, default=60.0,
                        help="How long the schedule runs with faults (at least 2: a minute of warm-up and one of tail).")
    parser.add_argument("--seed", type=int, default=0, help="The fault plan's seed.")
    parser.add_argument("--out", required=True, help="A new folder for everything the soak writes.")
    parser.add_argument("--pipeline-every", type=int, default=300, help="The pipeline deployment's interval (s).")
    parser.add_argument("--train-every", type=int, default=420, help="The train deployment's interval (s).")
    parser.add_argument("--drain-minutes", type=float, default=20.0,
                        help="How long runs in progress may take to finish after the schedule stops.")
    parser.add_argument("--disk-mib", type=int, default=1024, help="Size of the runs home's own filesystem.")
    parser.add_argument("--models", default=os.environ.get("PROMPT_R1_MODELS", str(ROOT / "runs" / "models")),
                        help="The bundled models' cache (PROMPT_R1_MODELS).")
    parser.add_argument("--port", type=int, default=0, help="The Prefect server's port (default: a free one).")
    parser.add_argument("--no-baseline", action="store_true", help="Skip the fault-free run (and its check).")
    parser.add_argument("--zombie-automation", action="store_true",
                        help="Create Prefect's zombie-run automation (see docs/deployments.md before using it).")
    parser.add_argument("--plan-only", action="store_true", help="Print the fault plan and exit.")
    args = parser.parse_args()
    if args.plan_only:
        print(to_json(make_plan(args.seed, args.minutes)))
        return
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        sys.exit(f"error: --out {out} is not empty; give a new folder")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per API call
    sys.exit(Soak(args).run())


if __name__ == "__main__":
    main()
