"""Environment LLMs: one way to open any of them from an `EnvConfig`.

`open_environment(cfg)` is a synchronous context manager (a managed server's life cycle is
synchronous) that yields an `Environment` whose methods are async; with a `warehouse` (and
`cache: true`) its replies go through the reply cache, whatever its kind (`base.ReplyCache`):

- `kind=openai`: an `OpenAIEnvironment` on `cfg.base_url` (key from `$cfg.api_key_env`);
- `kind=vllm`: starts a managed vLLM server for `cfg.model`, yields an `OpenAIEnvironment`
  pointed at it (served model name = `cfg.model`, no key), and stops the server afterwards;
- `kind=inprocess`: an `InProcessEnvironment` (transformers in this process, batched).

Call `await env.aclose()` from the event loop that used the environment before leaving the block.

Modules: `base` (the contract every backend shares, the one reply cache of every kind, prices and
cost), `openai_env`, `inprocess`, `vllm_server` (the managed server), `server_guard`
(child servers that die with their parent) and `judge` (an LLM judge's calls, as an environment).

Imports: `prompt_r1.core`, `prompt_r1.config`, `prompt_r1.models` (bundled model folders, KV-cache sizing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from prompt_r1.env.base import EnvReply, Environment, cache_key, cost_usd, reply_cache_key
from prompt_r1.config.env import EnvConfig

if TYPE_CHECKING:
    from warehouse.store import Warehouse

__all__ = [
    "EnvReply", "Environment", "InProcessEnvironment", "OpenAIEnvironment", "cache_key", "cost_usd",
    "managed_vllm_server", "open_environment", "reply_cache_key",
]


def __getattr__(name: str):  # heavy imports (transformers, openai) only when used
    if name == "InProcessEnvironment":
        from prompt_r1.env.inprocess import InProcessEnvironment

        return InProcessEnvironment
    if name == "OpenAIEnvironment":
        from prompt_r1.env.openai_env import OpenAIEnvironment

        return OpenAIEnvironment
    if name == "managed_vllm_server":
        from prompt_r1.env.vllm_server import managed_vllm_server

        return managed_vllm_server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextmanager
def open_environment(cfg: EnvConfig, warehouse: "Warehouse | None" = None,
                     log_dir: Path | None = None) -> Iterator[Environment]:
    """The environment described by `cfg`, ready for `await env.reply(messages)`."""
    if cfg.kind == "inprocess":
        from prompt_r1.env.inprocess import InProcessEnvironment

        yield InProcessEnvironment(cfg, warehouse)
    elif cfg.kind == "openai":
        from prompt_r1.env.openai_env import OpenAIEnvironment

        yield OpenAIEnvironment(cfg, warehouse)
    elif cfg.kind == "vllm":
        from prompt_r1.env.openai_env import OpenAIEnvironment
        from prompt_r1.env.vllm_server import managed_vllm_server

        with managed_vllm_server(cfg, log_dir) as base_url:
            served = cfg.model_copy(update={"base_url": base_url, "api_key_env": None})
            yield OpenAIEnvironment(served, warehouse)
    else:  # pragma: no cover - the config validates kind
        raise ValueError(f"unknown environment kind {cfg.kind!r}")
