"""The soak's Prefect server and process worker: started, stopped, killed and started again.

The same pattern as `scripts/check_deployments.sh` (a real `prefect server start` on loopback with
its own PREFECT_HOME, a process worker with this clone's .venv on PATH, bounded waits, SIGTERM
then SIGKILL), in Python because the fault plan stops and starts them in the middle of the runs.
Every process started here carries the soak's tag in its environment (`TAG_VAR`), and so do its
children (flow runs, their Ray, the actors): `faults.tagged` finds them by it, and the final check
counts any left.

The deployments come from the repository's prefect.yaml (the one definition of them): the soak
writes a copy with only `pipeline` and `train`, each on an interval schedule, pointed at the soak's
config, and `prefect deploy` registers it. A zombie-run automation (Prefect's documented recipe:
a flow run whose heartbeats stop for 90 s is marked Crashed), with `--zombie-automation`, releases
the queue's one slot when a run dies with no worker left to report it. The retry automation of
`tasks.recovery` is always created: a crashed deployment run runs again and resumes its training run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

TAG_VAR = "PROMPT_R1_SOAK_TAG"
HEARTBEAT_S = 30           # PREFECT_FLOWS_HEARTBEAT_FREQUENCY: Prefect accepts 30 or more
ZOMBIE_AFTER_S = 90        # no heartbeat for this long: the run is marked Crashed
STOP_PATIENCE_S = 20.0     # SIGTERM, then SIGKILL


def stop_process(proc: subprocess.Popen | None, group: bool = True, patience_s: float = STOP_PATIENCE_S) -> None:
    """SIGTERM (its process group with `group`), then SIGKILL if it is still alive after `patience_s`."""
    if proc is None or proc.poll() is not None:
        return
    send = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    try:
        send(signal.SIGTERM)
        proc.wait(patience_s)
    except subprocess.TimeoutExpired:
        try:
            send(signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
    except ProcessLookupError:
        pass


class Services:
    """A Prefect server on `port` and one process worker, with `env` (tag, homes, secrets)."""

    def __init__(self, root: Path, out: Path, port: int, env: dict[str, str]):
        self.root, self.out, self.port = root, out, port
        self.bin = Path(sys.executable).parent  # this interpreter's environment: its prefect, on the worker's PATH
        self.api_url = f"http://127.0.0.1:{port}/api"
        self.env = {**env, "PREFECT_API_URL": self.api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_UI_ENABLED": "false", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
                    # the project's own log lines (resumes, restarts, failures) in each run's Prefect logs
                    "PREFECT_LOGGING_EXTRA_LOGGERS": "flows,tasks,prompt_r1",
                    "PATH": f"{self.bin}:{env.get('PATH', os.environ.get('PATH', ''))}"}
        self.server: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.starts = {"server": 0, "worker": 0}

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        self.starts[name] += 1
        log = open(self.out / f"{name}-{self.starts[name]}.log", "wb")
        try:
            return subprocess.Popen([str(self.bin / "prefect"), *args], cwd=self.root, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=5) as reply:
                return reply.status == 200
        except OSError:
            return False

    def start_server(self, timeout_s: float = 180.0) -> None:
        self.server = self._spawn("server", "server", "start", "--host", "127.0.0.1", "--port", str(self.port))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if self.server.poll() is not None:
                break
            time.sleep(1)
        raise RuntimeError(f"prefect server did not answer on port {self.port} within {timeout_s:g}s; see "
                           f"{self.out}/server-{self.starts['server']}.log")

    def stop_server(self) -> None:
        stop_process(self.server)

    def start_worker(self) -> None:
        self.worker = self._spawn("worker", "worker", "start", "--pool", "prompt-r1")

    def kill_worker(self) -> int | None:
        """kill -9 the worker process alone (its flow runs go on, orphaned, as after an OOM kill)."""
        if self.worker is None or self.worker.poll() is not None:
            return None
        pid = self.worker.pid
        os.kill(pid, signal.SIGKILL)
        self.worker.wait(10)
        return pid

    def stop_worker(self) -> None:
        # the worker turns SIGTERM into SIGINT but did not always exit (check_deployments.sh): bounded
        stop_process(self.worker, group=False)

    def prefect(self, *args: str, timeout_s: float = 300.0) -> str:
        done = subprocess.run([str(self.bin / "prefect"), "--no-prompt", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout

    def deploy(self, config: Path, intervals: dict[str, int], zombie_automation: bool = False) -> None:
        """Work pool, the `warehouse` queue (limit 1, as prefect.yaml asks), the root variable, the
        deployments of `intervals` (name -> seconds) on the soak config, and with `zombie_automation`
        Prefect's zombie-run automation (its creation hung the Prefect 3.7.7 server under SQLAlchemy
        2.0: docs/deployments.md)."""
        self.prefect("work-pool", "create", "prompt-r1", "--type", "process")
        self.prefect("work-queue", "create", "warehouse", "--pool", "prompt-r1", "--limit", "1")
        self.prefect("variable", "set", "prompt_r1_root", str(self.root), "--overwrite")
        spec = yaml.safe_load((self.root / "prefect.yaml").read_text())
        deployments = []
        for entry in spec["deployments"]:
            if entry["name"] in intervals:
                entry = {**entry, "parameters": {**entry.get("parameters", {}), "config": str(config)},
                         "schedules": [{"interval": intervals[entry["name"]]}]}
                entry["parameters"].pop("use_champion", None)
                deployments.append(entry)
        spec["deployments"] = deployments
        path = self.out / "prefect.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        self.prefect("deploy", "--all", "--prefect-file", str(path))
        if zombie_automation:
            asyncio.run(asyncio.wait_for(self._zombie_automation(), 60))
        self.retry_automation()

    def retry_automation(self) -> str:
        """Create `tasks.recovery`'s automation (a crashed deployment run runs again and resumes), then
        make sure the server still answers (creating an automation hung it once: docs/deployments.md);
        a server that stopped answering is restarted (the automation is stored by then)."""
        from tasks.recovery import retry_crashed_automation

        os.environ["PREFECT_API_URL"] = self.api_url
        asyncio.run(asyncio.wait_for(retry_crashed_automation().acreate(), 60))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.healthy():
                return "created"
            time.sleep(1)
        self.stop_server()
        self.start_server()
        return "created; the server stopped answering and was restarted"

    async def _zombie_automation(self) -> None:
        from datetime import timedelta

        os.environ["PREFECT_API_URL"] = self.api_url
        from prefect.automations import Automation
        from prefect.client.schemas.objects import StateType
        from prefect.events.actions import ChangeFlowRunState
        from prefect.events.schemas.automations import EventTrigger, Posture
        from prefect.events.schemas.events import ResourceSpecification

        await Automation(
            name="Crash zombie flows",
            trigger=EventTrigger(
                after={"prefect.flow-run.heartbeat"},
                expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                        "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
                match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
                for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
                within=timedelta(seconds=ZOMBIE_AFTER_S)),
            actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                        message="Flow run marked as crashed due to missing heartbeats.")],
        ).acreate()

    def api(self, coro_fn: Any, *args: Any) -> Any:
        """Run `coro_fn(client, *args)` against this server (a fresh client: the server may have restarted)."""
        os.environ["PREFECT_API_URL"] = self.api_url

        async def main():
            from prefect.client.orchestration import get_client

            async with get_client() as client:
                return await coro_fn(client, *args)

        return asyncio.run(main())
