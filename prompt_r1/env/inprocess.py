"""Environment LLM as a transformers model inside this process: no server, for tests, laptops and a
rollout actor's own GPU share (`device: cuda`).

It has the same contract as the OpenAI client (`Environment.reply` never raises for call
failures, usage = real token counts), so the rollout loop and the evaluation cannot tell the
difference. The rollout loop fires many `reply()` calls at once (one per trajectory); running
them one by one would waste the CPU, so a small asyncio micro-batcher collects the calls that
arrive within a few milliseconds (and any that arrive while a batch is generating) and runs them
as one left-padded `model.generate` in a worker thread (`asyncio.to_thread`), keeping the event
loop free.

Decoding: greedy when `temperature == 0` (same input -> same output, whatever the batch), else
sampling with temperature/top-p under a per-batch seed derived from `cfg.seed` (the global torch
RNG is restored afterwards). The chat template is the tokenizer's, or `cfg.chat_template`
(template text, or a path to a file holding it); the configured system message comes first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_r1.env.base import EnvReply, Environment
from prompt_r1.config.base import ConfigError
from prompt_r1.config.env import EnvConfig
from prompt_r1.core.seeding import derive_seed
from prompt_r1.core.tokens import chat_prompt_ids, left_pad, pad_token_id, stop_token_ids

if TYPE_CHECKING:
    from warehouse.store import Warehouse

log = logging.getLogger(__name__)


def load_chat_template(value: str | None) -> str | None:
    """Template text from `cfg.chat_template`: an existing file's contents, else the text itself.

    >>> load_chat_template(None) is None, load_chat_template("{{ messages }}")
    (True, '{{ messages }}')
    """
    if value is None:
        return None
    if "{" not in value and "\n" not in value and len(value) < 4096:
        path = Path(value).expanduser()
        if path.is_file():
            return path.read_text()
        raise ConfigError(f"chat_template {value!r} is neither a Jinja template nor an existing file; "
                          "give the template text or the path of a file holding it")
    return value


@dataclass
class _Request:
    prompt_ids: list[int]
    future: asyncio.Future = field(repr=False)


class InProcessEnvironment(Environment):
    """A local causal LM answering chat messages, with concurrent calls batched into one `generate`."""

    def __init__(self, cfg: EnvConfig, warehouse: "Warehouse | None" = None, gather_s: float = 0.005,
                 max_batch: int | None = None):
        super().__init__(cfg, warehouse)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from prompt_r1.models.bundled import model_load_errors, resolve_model

        self.model_path = str(resolve_model(cfg.model))
        self.gather_s = gather_s
        self.max_batch = max_batch or max(1, cfg.concurrency)
        with model_load_errors(cfg.model, f"environment `{cfg.name}` (its `model`)"):
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.template = load_chat_template(cfg.chat_template)
        if self.template is None and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"environment `{cfg.name}`: model {self.model_path} has no chat template; "
                              "set `chat_template` in the environment config")
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"environment `{cfg.name}` has device 'cuda' but this process sees no CUDA GPU (torch "
                              f"{torch.__version__}): set its device to cpu, or under agent.device cuda check "
                              "rollout.gpus_per_worker")
        with model_load_errors(cfg.model, f"environment `{cfg.name}` (its `model`)"):
            self.lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.lm.to(self.device).eval()
        self.stop_ids = stop_token_ids(self.tokenizer, self.lm.generation_config.eos_token_id)
        self.pad_id = pad_token_id(self.tokenizer, self.stop_ids)
        self.context_limit = int(getattr(self.lm.config, "max_position_embeddings", 0) or 0) or None
        self.batch_sizes: list[int] = []  # size of every generate call, for tests and benchmarks
        self._generate_lock = threading.Lock()
        self._batches_run = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Request] = []
        self._flusher: asyncio.Task | None = None

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids: the chat template with the generation prompt, no extra special tokens."""
        return chat_prompt_ids(self.tokenizer, messages, self.template)

    # -- the call ---------------------------------------------------------------------------
    async def generate(self, messages: list[dict[str, str]], turn: int, started: float) -> EnvReply:
        try:
            prompt_ids = self.encode(messages)
        except Exception as err:
            return self.failed(turn, f"chat template failed for model {self.model_path}: "
                                     f"{type(err).__name__}: {err}", started, attempts=1)
        if self.context_limit and len(prompt_ids) + self.cfg.max_tokens > self.context_limit:
            return self.failed(turn, f"prompt of {len(prompt_ids)} tokens + max_tokens {self.cfg.max_tokens} "
                                     f"exceeds the context of {self.context_limit} of {self.model_path}",
                               started, attempts=1)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop: forget the old loop's state
            self._loop, self._pending, self._flusher = loop, [], None
        request = _Request(prompt_ids, loop.create_future())
        self._pending.append(request)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        try:
            new_ids = await request.future
        except Exception as err:
            log.warning("environment %s: generate failed: %r", self.name, err)
            return self.failed(turn, f"generate failed for model {self.model_path}: "
                                     f"{type(err).__name__}: {err}", started, attempts=1)
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        for stop in self.cfg.stop:  # same visible result as a server-side stop (token counts stay real)
            text = text.split(stop, 1)[0]
        return EnvReply(text, self.new_call(turn, prompt_tokens=len(prompt_ids), completion_tokens=len(new_ids),
                                            latency_s=time.perf_counter() - started, attempts=1))

    async def _flush(self) -> None:
        """Wait a moment for companions, then generate batches until nothing is pending."""
        await asyncio.sleep(self.gather_s)
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            batch = [r for r in batch if not r.future.done()]  # callers may have been cancelled
            if not batch:
                continue
            try:
                outputs = await asyncio.to_thread(self.generate_ids, [r.prompt_ids for r in batch])
            except Exception as err:
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(err)
                continue
            for r, ids in zip(batch, outputs):
                if not r.future.done():
                    r.future.set_result(ids)

    # -- generation (worker thread) ---------------------------------------------------------
    def generate_ids(self, prompts: list[list[int]]) -> list[list[int]]:
        """New token ids per prompt, cut after the first stop token (which is kept and counted)."""
        import torch

        input_ids, attention = (t.to(self.device) for t in left_pad(prompts, self.pad_id))
        width = input_ids.shape[1]
        greedy = self.cfg.temperature == 0.0
        options: dict[str, Any] = {"do_sample": False} if greedy else {
            "do_sample": True, "temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "top_k": 0}
        # the sampling seed is this batch's own: the global RNG (the GPU's too, where it samples) is put back
        devices = [torch.cuda.current_device()] if self.device.type == "cuda" else []
        with self._generate_lock, torch.inference_mode(), torch.random.fork_rng(devices=devices):
            self.batch_sizes.append(len(prompts))
            self._batches_run += 1
            torch.manual_seed(derive_seed("env_batch", self.cfg.seed or 0, self._batches_run))
            out = self.lm.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=self.cfg.max_tokens,
                eos_token_id=self.stop_ids, pad_token_id=self.pad_id, **options)
        results = []
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in self.stop_ids), len(row))
            results.append(row[:cut])
        return results

    async def aclose(self) -> None:
        self._pending = []
