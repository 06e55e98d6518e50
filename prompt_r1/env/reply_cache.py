"""The environment reply cache: the one place an environment's replies are read from and written to
the warehouse (`Warehouse.cache_get/put`, table `env_cache`), for every kind of environment.

`Environment.reply` (`env.base`) asks it before a call and stores a successful reply after one,
when the environment was opened with a warehouse and its config has `cache: true`. Who opens an
environment with a warehouse decides what is cached: evaluation and the prompt-optimisation
baselines do (reruns exact and free), as do the LLM judges (`env.judge`); training rollouts,
validation and serving do not (a sampled rollout must be a fresh draw). A judge also reads it
before opening its environment (`ReplyCache.get`), so a rerun answered from the cache never loads
the judge model.

The key is `reply_cache_key` of the messages as sent (the configured system message first): the
endpoint, model, chat template, messages and sampling settings. A failed call is never stored. A
cache that cannot be read or written is logged and skipped: it never fails a call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prompt_r1.config.env import EnvConfig
from prompt_r1.env.base import reply_cache_key, short_reason, with_system

if TYPE_CHECKING:
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)


def sent_key(cfg: EnvConfig, messages: list[dict[str, str]]) -> str:
    """The cache key of sending `messages` under `cfg` (the system message is added as the environment
    sends it, so a list that already has it gets the same key)."""
    return reply_cache_key(cfg, with_system(cfg, messages))


class ReplyCache:
    """One environment's replies in the warehouse, keyed on what can change them."""

    def __init__(self, cfg: EnvConfig, warehouse: "Warehouse"):
        self.cfg, self.warehouse = cfg, warehouse

    @classmethod
    def of(cls, cfg: EnvConfig, warehouse: "Warehouse | None") -> "ReplyCache | None":
        """The cache of `cfg`'s replies in `warehouse`; None without a warehouse or with `cache: false`."""
        return cls(cfg, warehouse) if warehouse is not None and cfg.cache else None

    def key(self, messages: list[dict[str, str]]) -> str:
        return sent_key(self.cfg, messages)

    def get(self, messages: list[dict[str, str]]) -> tuple[str, int, int] | None:
        """(reply text, prompt tokens, completion tokens) stored for `messages`, or None."""
        try:
            return self.warehouse.cache_get(self.key(messages))
        except Exception as err:  # a cache problem must not fail the call
            log.warning("environment %s: reply cache read failed: %s", self.cfg.name, short_reason(str(err)))
            return None

    def put(self, messages: list[dict[str, str]], text: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Store a successful reply to `messages`."""
        try:
            self.warehouse.cache_put(self.key(messages), self.cfg.model, text, prompt_tokens, completion_tokens)
        except Exception as err:
            log.warning("environment %s: reply cache write failed: %s", self.cfg.name, short_reason(str(err)))

