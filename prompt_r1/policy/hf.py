"""Agent policy on transformers: per-row seeded sampling on CPU or a GPU, with per-row stops.

`model.generate` cannot stop each row at a protocol tag that may span several tokens while also
returning the log-prob of every sampled id under the processed (temperature / top-p)
distribution, so this module owns a small sampling loop over the KV cache (`past_key_values`).
It is the reference backend: the learner recomputes exactly these log-probs, and tests check it.

Determinism: each row samples from its own `torch.Generator` seeded with the row's seed, so other
rows never shift its draws. Batching still changes a row's floats: a row's logits in a batch differ
from the same row alone by ~1e-7 (padding changes the attention reductions, and CPU matrix kernels
round differently for different batch sizes, even without padding), which can flip a sampled id
and changes log-probs in their last bits. With `batch_invariant` (the default, `deterministic`)
each row runs alone, so its ids and log-probs depend only on its prompt, seed and the weights,
whatever else is being generated; without it rows share left-padded batches (faster on CPU for
large groups, exact only up to that noise).

Stopping: a row stops when the decoded tail of its sampled ids contains a stop string (works
whether `</answer>` is one token, as in the tiny test tokenizer, or several, as in SmolLM2's), when
it samples EOS / `<|im_end|>` (kept in `token_ids`, see `policy/base.py`), or at its own limit.

Device (`agent.device`): on `cuda` the weights, the KV cache and each row's generator live on the
GPU Ray gave the actor, and a turn's rows run as one left-padded batch (`batch_invariant` false);
only the sampled ids and their log-probs come back to the host, once per token. Running out of GPU
memory while generating is a `UserError` naming the settings that size the batch.

LoRA: the first adapter sync (`apply_update`, kind `adapter`) wraps the model in PEFT with the
LoraConfig that came with it (the learner's), and every sync then loads only the adapter tensors;
generation runs base + adapter, unmerged, as the learner computes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from prompt_r1.policy.base import Policy, Sample, per_row_limits, per_row_seeds
from prompt_r1.core.protocol import STOP_STRINGS
from prompt_r1.core.tokens import left_pad, pad_token_id, stop_token_ids, torch_dtype
from prompt_r1.core.failures import UserError
from prompt_r1.core.weights import WeightUpdate, weights_checksum
from prompt_r1.models.bundled import model_load_errors

log = logging.getLogger(__name__)


class TransformersPolicy(Policy):
    """A causal LM from a local HF folder sampling agent turns token by token."""

    def __init__(
        self,
        model_path: str | Path,
        temperature: float = 1.0,
        top_p: float = 1.0,
        dtype: str = "float32",
        seed: int = 0,
        stop_strings: tuple[str, ...] = STOP_STRINGS,
        batch_invariant: bool = True,
        device: str = "cpu",
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._keep_settings(model_path, temperature, top_p, seed, stop_strings)
        self.device = rollout_device(device)
        with model_load_errors(self.model_path, "agent"):
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype(dtype))
        self.model.to(self.device).eval()
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config.eos_token_id)
        self.pad_id = pad_token_id(self.tokenizer, self.stop_ids)
        # A stop string of n characters is covered by the last n tokens (every token decodes to >= 1 char).
        self.tail_tokens = max(len(s) for s in self.stop_strings)
        self.batch_invariant = batch_invariant
        self.deterministic = batch_invariant
        self.adapter_config: dict[str, Any] | None = None  # set when the first LoRA adapter arrives

    # -- sampling ---------------------------------------------------------------------------
    def _sample_next(self, logits: torch.Tensor, generators: list[torch.Generator],
                     active: list[bool]) -> tuple[list[int], list[float]]:
        """Each active row's sampled id and its log-prob under the processed distribution; a row
        draws from its own generator only, so other rows never shift its draws."""
        logits = logits.float()
        if self.temperature == 0.0:
            logprobs = torch.log_softmax(logits, dim=-1)
            tokens = logprobs.argmax(dim=-1)
        else:
            scaled = logits / self.temperature
            if self.top_p < 1.0:
                scaled = top_p_filter(scaled, self.top_p)
            logprobs = torch.log_softmax(scaled, dim=-1)
            probs = logprobs.exp()
            tokens = torch.zeros(len(generators), dtype=torch.long, device=logits.device)
            for row, generator in enumerate(generators):
                if active[row]:
                    tokens[row] = torch.multinomial(probs[row], 1, generator=generator)[0]
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        return tokens.tolist(), chosen.tolist()

    def _hit_stop_string(self, ids: list[int]) -> bool:
        tail = self.tokenizer.decode(ids[-self.tail_tokens:], skip_special_tokens=False)
        return any(stop in tail for stop in self.stop_strings)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int | list[int], seeds: Sequence[int] | None = None
    ) -> list[Sample]:
        if not prompts:
            return []
        limits = per_row_limits(max_new_tokens, len(prompts))
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        with self._lock:
            row_seeds = per_row_seeds(seeds, len(prompts), self.seed, self._calls)
            self._calls += 1
            generators = [torch.Generator(self.device).manual_seed(s) for s in row_seeds]
            with out_of_memory_named(self.device, len(prompts), max(map(len, prompts)) + max(limits)):
                if not self.batch_invariant:
                    return self._generate(prompts, limits, generators)
                # one row at a time: a batch would change its floats (see the module docstring)
                return [self._generate([p], [n], [g])[0] for p, n, g in zip(prompts, limits, generators)]

    def _generate(self, prompts: list[list[int]], limits: list[int],
                  generators: list[torch.Generator]) -> list[Sample]:
        rows = len(prompts)
        input_ids, attention = (t.to(self.device) for t in left_pad(prompts, self.pad_id))
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        # On a GPU only the last position's logits are computed (all of them, rows x tokens x vocab,
        # would be the largest tensor of the pass); on CPU the full pass stays, since recorded reruns
        # sampled from it and the last row of a smaller matmul rounds differently (about 1e-5).
        last_only = {} if self.device.type == "cpu" else {"logits_to_keep": 1}
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                         **last_only)
        past, logits = out.past_key_values, out.logits[:, -1, :]
        next_position = positions[:, -1:] + 1

        sampled: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish: list[str | None] = [None] * rows
        for _ in range(max(limits)):
            tokens, token_logprobs = self._sample_next(logits, generators, [f is None for f in finish])
            for row in range(rows):
                if finish[row] is not None:
                    continue
                token = tokens[row]
                sampled[row].append(token)
                logprobs[row].append(token_logprobs[row])
                if token in self.stop_ids or self._hit_stop_string(sampled[row]):
                    finish[row] = "stop"
                elif len(sampled[row]) >= limits[row]:
                    finish[row] = "length"
            if all(f is not None for f in finish):
                break
            # Finished rows keep being fed (pad ids); their outputs are ignored.
            feed = torch.tensor(
                [[tokens[r] if finish[r] is None else self.pad_id] for r in range(rows)], dtype=torch.long,
                device=self.device)
            attention = torch.cat([attention, attention.new_ones((rows, 1))], dim=1)
            out = self.model(input_ids=feed, attention_mask=attention, position_ids=next_position,
                             past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
            next_position = next_position + 1
        return [
            Sample(token_ids=ids, logprobs=lps,
                   text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason=str(reason))
            for ids, lps, reason in zip(sampled, logprobs, finish)
        ]

    # -- weights ----------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy new weights in place (cast to this model's dtype); tied copies may be omitted."""
        if self.adapter_config is not None:
            raise ValueError("load_weights: this policy runs a LoRA adapter; sync adapters with apply_update")
        own = self.model.state_dict()
        unexpected = sorted(set(state_dict) - set(own))
        if unexpected:
            raise ValueError(f"load_weights: {len(unexpected)} unknown parameter names for "
                             f"{self.model_path}, e.g. {unexpected[:3]} (strip wrapper prefixes "
                             "such as `module.` or merge LoRA adapters before syncing)")
        pointers: dict[int, int] = {}
        for tensor in own.values():
            pointers[tensor.data_ptr()] = pointers.get(tensor.data_ptr(), 0) + 1
        missing = [k for k in own if k not in state_dict and pointers[own[k].data_ptr()] < 2]
        if missing:
            raise ValueError(f"load_weights: {len(missing)} parameters missing, e.g. {missing[:3]}")
        with self._lock:
            self.model.load_state_dict(state_dict, strict=False)

    def apply_update(self, update: WeightUpdate) -> str:
        """Take one weight sync; the checksum is read back from the model after loading: for full
        weights its own tensors under the sent names (held in `agent.dtype`, the dtype they are
        sent in), for an adapter the PEFT adapter tensors (`get_peft_model_state_dict`)."""
        if update.kind == "full":
            if self.adapter_config is not None:
                raise ValueError("this policy runs a LoRA adapter: full weights cannot replace it (a run syncs one "
                                 "kind: agent.lora.enabled decides)")
            self.load_weights(update.tensors)
            own = self.model.state_dict()
            return weights_checksum({name: own[name] for name in update.tensors})
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        assert update.adapter_config is not None  # WeightUpdate.make checks it
        with self._lock:
            self._wrap_in_adapter(update.adapter_config)
            expected = set(get_peft_model_state_dict(self.model))
            if set(update.tensors) != expected:
                raise ValueError(f"adapter tensors do not fit this policy's adapter: missing "
                                 f"{sorted(expected - set(update.tensors))[:3]}, unknown "
                                 f"{sorted(set(update.tensors) - expected)[:3]} (same agent.model and agent.lora?)")
            set_peft_model_state_dict(self.model, update.tensors)
            return weights_checksum(get_peft_model_state_dict(self.model))

    def _wrap_in_adapter(self, adapter_config: dict[str, Any]) -> None:
        """Wrap the model in PEFT with the learner's LoraConfig, once (later syncs only load tensors)."""
        if self.adapter_config is not None:
            if adapter_config != self.adapter_config:
                raise ValueError("the adapter's LoraConfig changed between syncs; a run keeps one agent.lora")
            return
        from peft import PeftConfig, get_peft_model

        config = PeftConfig.from_peft_type(**adapter_config)
        config.inference_mode = True
        self.model = get_peft_model(self.model, config).eval()
        self.adapter_config = dict(adapter_config)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def sleep(self) -> None:
        """Colocated beside a learner on the GPU: give back the cached blocks of the last batches (the
        weights stay: a policy this backend runs is small beside the learner's optimiser state)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def rollout_device(name: str) -> torch.device:
    """`agent.device` inside a rollout actor: `cuda` is the GPU share Ray gave the actor (it sets
    `CUDA_VISIBLE_DEVICES`), refused with the settings to change where none is visible."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"agent.device is {name!r} but this rollout actor sees no CUDA GPU (torch {torch.__version__}, "
                        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): set agent.device to cpu "
                        "and rollout.gpus_per_worker to 0, or install torch's CUDA build (`.[gpu]`) on this node")
    return device


@contextlib.contextmanager
def out_of_memory_named(device: torch.device, rows: int, tokens: int) -> Iterator[None]:
    """A GPU that runs out of memory while generating says which settings size the batch."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise UserError(
            f"the rollout actor ran out of memory on {device} generating {rows} row(s) of up to {tokens} tokens "
            f"({str(err).splitlines()[0]}): lower rollout.batch_questions or rollout.group_size, raise "
            "rollout.num_workers (rows are split over the actors), lower agent.max_response_tokens, or give each "
            "actor more of a GPU (rollout.gpus_per_worker); `prompt-r1 plan` sizes it") from err


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches `top_p` (others -> -inf).

    >>> top_p_filter(torch.log(torch.tensor([[0.5, 0.3, 0.2]])), 0.7).isinf().tolist()
    [[False, False, True]]
    """
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
