"""Render the MLflow UI pages a user opens after an evaluation into PNGs, with headless Chromium.

    .venv/bin/python scripts/mlflow_ui_shots.py --db runs/mlflow.db --experiment smoke --out docs/images

It starts `mlflow ui` on the given mlflow.db (127.0.0.1 only, a free port, a deadline for it to
answer, stopped at the end), drives Chromium over the DevTools protocol (a free port, a
throw-away profile) and writes:

- `mlflow-experiment.png`: the experiment on MLflow's model-training side (`workflowType=
  machine_learning` in the address: MLflow 3.17 otherwise opens its GenAI overview);
- `mlflow-runs-chart.png`: the saved comparison view (`compare_url` in tasks/tracking/runs.py, the address
  the demo prints): the `eval-<environment>` runs grouped by `env_model`, headline charts only;
- `mlflow-trace.png`: one agent episode's trace (its spans, the environment call's tokens and cost,
  the score and gold answers);
- `mlflow-results-table.png`: the evaluation's results table in the run's artifact view;
- `mlflow-rollout-trace.png`: one training rollout's trace (`tracking.trace_rollouts`: tagged
  step, reward, advantage, environment), when the database holds a training run.

Chromium comes from Debian: `apt-get update && apt-get install -y chromium`. Why it exists: the
docs show pictures of what the UI really shows, made from a real run, not described from memory.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "install it with: apt-get update && apt-get install -y chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, deadline_s: float, what: str, proc: subprocess.Popen | None = None) -> str:
    """GET `url` until it answers 200; fails after `deadline_s` or when `proc` exits."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return resp.read().decode()
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not answer at {url} within {deadline_s:.0f} s")


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group we started, SIGKILL it after `grace_s`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace_s)


class Page:
    """One Chromium tab over the DevTools protocol (the little of it this script needs)."""

    def __init__(self, ws_url: str, width: int, height: int):
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=64 * 2**20, open_timeout=30)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, timeout_s: float = 60.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        end = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, end - time.monotonic())))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return out.get("result", {}).get("value")

    def goto(self, url: str, expect: list[str], deadline_s: float = 90.0, settle_s: float = 3.0) -> None:
        """Open `url` and wait until the page's text holds every string of `expect`."""
        self.call("Page.navigate", url=url)
        end = time.monotonic() + deadline_s
        text = ""
        while time.monotonic() < end:
            text = self.js("document.body ? document.body.innerText : ''") or ""
            if all(e in text for e in expect):
                time.sleep(settle_s)  # charts and fonts finish drawing
                return
            time.sleep(1.0)
        missing = [e for e in expect if e not in text]
        raise SystemExit(f"{url} never showed {missing} within {deadline_s:.0f} s; the page said: {text[:500]!r}")

    def click_text(self, text: str) -> bool:
        """Click the first button, tab or link whose visible text is `text`."""
        return bool(self.js(
            "(() => { const els = [...document.querySelectorAll('button, [role=tab], [role=radio], a, label')];"
            f" const el = els.find(e => e.innerText && e.innerText.trim() === {json.dumps(text)});"
            " if (el) { el.click(); return true; } return false; })()"))

    def shot(self, path: Path) -> None:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        shrink(path)
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")

    def close(self) -> None:
        self.ws.close()


def shrink(path: Path) -> None:
    """A UI screenshot needs few colours: 256 of them keep it sharp at a fraction of the size."""
    from PIL import Image

    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def pick_objects(db: Path, experiment: str | None, method: str) -> dict[str, Any]:
    """The experiment, one evaluation run (with the results table) and one agent trace to show."""
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{db.resolve()}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exps = [e for e in client.search_experiments() if e.name != "Default"]
    exp = next((e for e in exps if e.name == experiment), None) if experiment else (exps[0] if exps else None)
    if exp is None:
        raise SystemExit(f"{db}: no experiment {experiment or ''} (found {[e.name for e in exps]})")
    evals = client.search_runs([exp.experiment_id], "tags.flow = 'evaluate'", order_by=["start_time DESC"])
    if not evals:
        raise SystemExit(f"{db}: experiment {exp.name} has no evaluation run (run the evaluate flow first)")
    traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list", max_results=200)
    traces = [t for t in traces if t.info.tags.get("method") == method] or traces
    if not traces:
        raise SystemExit(f"{db}: experiment {exp.name} holds no traces (eval.trace_episodes > 0?)")
    # the richest one: most environment calls, scored
    trace = max(traces, key=lambda t: (t.info.state.value == "OK", len(t.data.spans), t.info.request_time))
    rollouts = mlflow.search_traces(locations=[exp.experiment_id], filter_string="tags.method = 'train-rollout'",
                                    return_type="list", max_results=200)
    rollout = max(rollouts, key=lambda t: (len(t.data.spans), t.info.request_time)) if rollouts else None
    from tasks.tracking.runs import save_compare_view

    save_compare_view(client, exp.experiment_id, exp.tags)  # a database from before the view existed
    return {"experiment": exp, "eval_run": evals[0], "trace": trace, "rollout": rollout}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, required=True, help="The mlflow.db to show (e.g. runs/mlflow.db).")
    ap.add_argument("--experiment", help="Experiment name (default: the first one besides Default).")
    ap.add_argument("--method", default="agent:base", help="Method whose runs and trace are shown.")
    ap.add_argument("--out", type=Path, default=Path("docs/images"), help="Folder for the PNGs.")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=820)
    ap.add_argument("--deadline", type=float, default=300.0, help="Seconds each server and page may take.")
    args = ap.parse_args(argv)
    if not args.db.is_file():
        raise SystemExit(f"no MLflow database at {args.db}")
    browser = next((b for b in map(shutil.which, CHROMIUM) if b), None)
    if browser is None:
        raise SystemExit(f"headless Chromium not found ({', '.join(CHROMIUM)}); {INSTALL_HINT}")
    picked = pick_objects(args.db, args.experiment, args.method)
    exp_id, run, trace = picked["experiment"].experiment_id, picked["eval_run"], picked["trace"]
    args.out.mkdir(parents=True, exist_ok=True)

    ui_port, cdp_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="mlflow-ui-shots-") as tmp:
        ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri",
                               f"sqlite:///{args.db.resolve()}", "--host", "127.0.0.1", "--port", str(ui_port),
                               "--workers", "1"],
                              stdout=open(Path(tmp) / "mlflow-ui.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
        chrome = None
        try:
            base = f"http://127.0.0.1:{ui_port}"
            wait_for(f"{base}/health", args.deadline, "mlflow ui", ui)
            chrome = subprocess.Popen([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                                       "--no-first-run", "--hide-scrollbars", f"--remote-debugging-port={cdp_port}",
                                       "--remote-debugging-address=127.0.0.1", f"--user-data-dir={tmp}/profile",
                                       f"--window-size={args.width},{args.height}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            wait_for(f"http://127.0.0.1:{cdp_port}/json/version", args.deadline, "chromium", chrome)
            tabs = json.loads(wait_for(f"http://127.0.0.1:{cdp_port}/json/list", args.deadline, "chromium", chrome))
            page = Page(next(t for t in tabs if t["type"] == "page")["webSocketDebuggerUrl"], args.width, args.height)
            try:
                shoot(page, base, exp_id, run.info.run_id, trace, args, picked["rollout"])
            finally:
                page.close()
        finally:
            if chrome is not None:
                stop(chrome)
            stop(ui)
    return 0


def shoot(page: Page, base: str, exp_id: str, run_id: str, trace, args, rollout=None) -> None:
    """Each page, waited for until it shows what it should; one that never does is still shot
    (to see why) and named at the end, with a non-zero exit."""
    from tasks.tracking.runs import compare_url

    out, method, missed = args.out, args.method, []

    def take(url: str, expect: list[str], name: str, settle_s: float = 3.0) -> None:
        try:
            page.goto(url, expect, args.deadline, settle_s)
            page.js("document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]')?.click()")
        except SystemExit as err:
            missed.append(f"{name}: {err}")
        page.shot(out / name)

    take(f"{base}/#/experiments/{exp_id}?workflowType=machine_learning",
         ["smoke" if not args.experiment else args.experiment, "Run Name"], "mlflow-experiment.png")
    # the view every experiment holds (tasks/tracking/runs.py: COMPARE_VIEW), the address the demo prints
    try:
        page.goto(compare_url(exp_id, base), ["Group by: env_model", "eval-"], args.deadline, settle_s=5.0)
        for component in ("mlflow.assistant.chat_panel.close", "mlflow.experiment_page.shared_view.dismiss"):
            page.js(f"document.querySelector('[data-component-id=\"{component}\"]')?.click()")  # room for charts
        time.sleep(2.0)
    except SystemExit as err:
        missed.append(f"mlflow-runs-chart.png: {err}")
    page.shot(out / "mlflow-runs-chart.png")
    tid = trace.info.trace_id
    take(f"{base}/#/experiments/{exp_id}/traces?selectedEvaluationId={tid}&traceId={tid}", ["environment call"],
         "mlflow-trace.png")
    take(f"{base}/#/experiments/{exp_id}/runs/{run_id}/artifacts/eval/results_table.json", ["env_model"],
         "mlflow-results-table.png")
    if rollout is not None:
        rid = rollout.info.trace_id
        take(f"{base}/#/experiments/{exp_id}/traces?selectedEvaluationId={rid}&traceId={rid}", ["agent turn"],
             "mlflow-rollout-trace.png")
    if missed:
        raise SystemExit("pages that did not show what they should:\n" + "\n".join(missed))


if __name__ == "__main__":
    sys.exit(main())
