"""The one interface every agent-policy backend implements (transformers on CPU, vLLM on GPU).

The rollout loop only needs three things from a policy: its tokenizer, batched sampling from
token ids that returns the sampled ids with their log-probs (token-in/token-out, no re-encoding),
and a way to take new weights after a GRPO step without a restart. Keeping that surface tiny lets
tests swap in a scripted policy and lets the trainer stay backend-agnostic.

Conventions shared by all backends:
- `Sample.token_ids` are exactly the ids the backend sampled, in order. A stop string is included
  (generation stops on the token that completes it; that whole token is kept). An EOS /
  `<|im_end|>` token that ended the turn IS included in `token_ids` (with its log-prob), so the
  learner also trains the decision to stop.
- `Sample.text` is `tokenizer.decode(token_ids, skip_special_tokens=True)`: the turn's text
  without the EOS token (the same rule vLLM applies to its `text`).
- `Sample.logprobs[i]` is the log-prob of `token_ids[i]` under the distribution it was sampled
  from (after temperature and top-p); at temperature 0 it is the model's plain log-softmax.
- `finish_reason` is "stop" (stop string or EOS) or "length" (hit that row's max_new_tokens).
- `seeds` gives one seed per row (see `prompt_r1.core.seeding.draw_seed`): a row's draws depend on its
  own seed only, never on which other rows share the batch or in what order. `deterministic`
  says whether the backend also makes a row's sampled ids and log-probs exactly independent of
  the batch (same seed and prompt -> same sample, bit for bit); see each backend.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prompt_r1.core.failures import UserError
from prompt_r1.core.protocol import STOP_STRINGS
from prompt_r1.core.weights import WeightUpdate, weights_checksum


class UnsupportedUpdate(UserError, ValueError):
    """A policy backend cannot take this kind of weight update (the message names the setting to change)."""


@dataclass
class Sample:
    """One generated agent turn."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"


class Policy(abc.ABC):
    """An agent LLM that samples turns from token ids and can take new weights in place."""

    tokenizer: Any
    stop_strings: tuple[str, ...] = STOP_STRINGS
    deterministic: bool = False  # exact per-row results whatever the batch (see the module docstring)

    def _keep_settings(self, model_path: str | Path, temperature: float, top_p: float, seed: int,
                       stop_strings: Sequence[str]) -> None:
        """The sampling settings and call state every backend keeps."""
        self.model_path = str(model_path)
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.seed, self.stop_strings = seed, tuple(stop_strings)
        self._calls = 0  # generate calls so far: `per_row_seeds` derives seeds from it when given none
        self._lock = threading.Lock()  # generate may be called from worker threads

    @abc.abstractmethod
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int | list[int], seeds: Sequence[int] | None = None
    ) -> list[Sample]:
        """Sample one continuation per prompt; `max_new_tokens` and `seeds` are per row
        (`seeds=None`: the policy picks reproducible ones itself, see `per_row_seeds`)."""

    @abc.abstractmethod
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Replace the model weights (HF parameter names) without rebuilding the policy."""

    def apply_update(self, update: WeightUpdate) -> str:
        """Take one weight sync (`core.weights`) and return the checksum of what the policy now
        uses. Default: full weights through `load_weights`, checksummed as received (a backend
        that can read its weights back overrides this); adapters need a backend that has them."""
        if update.kind != "full":
            raise UnsupportedUpdate(f"{type(self).__name__} cannot take a LoRA adapter (agent.lora.enabled); "
                                    "use agent.backend transformers or vllm")
        self.load_weights(update.tensors)
        return weights_checksum(update.tensors)

    def sleep(self) -> None:
        """Free the accelerator memory this policy holds while a colocated learner updates
        (`rollout.colocate`); `wake_up` before the next `generate` or weight load. A no-op for a
        policy that holds none (the default)."""

    def wake_up(self) -> None:
        """Take back what `sleep` freed (a no-op by default)."""

    def close(self) -> None:
        """Release the backend's resources (engines, memory); default: nothing to do."""


def per_row_limits(max_new_tokens: int | Sequence[int], rows: int) -> list[int]:
    """Expand a scalar limit to one per row and check it.

    >>> per_row_limits(4, 2)
    [4, 4]
    >>> per_row_limits([1, 3], 2)
    [1, 3]
    """
    if isinstance(max_new_tokens, int):
        limits = [max_new_tokens] * rows
    else:
        limits = [int(n) for n in max_new_tokens]
    if len(limits) != rows:
        raise ValueError(f"max_new_tokens has {len(limits)} entries for {rows} prompts")
    if any(n < 1 for n in limits):
        raise ValueError(f"max_new_tokens must be >= 1 for every row, got {limits}")
    return limits


def per_row_seeds(seeds: Sequence[int] | None, rows: int, policy_seed: int, call: int) -> list[int]:
    """The rows' seeds: `seeds` checked, or (None) ones derived from the policy's seed and its
    call counter, reproducible for one policy object but dependent on how calls are batched.

    >>> per_row_seeds([5, 6], 2, 0, 0)
    [5, 6]
    >>> a = per_row_seeds(None, 2, 0, 0); a == per_row_seeds(None, 2, 0, 0) and a[0] != a[1]
    True
    """
    from prompt_r1.core.seeding import derive_seed

    if seeds is None:
        return [derive_seed("policy_call", policy_seed, call, row) for row in range(rows)]
    out = [int(s) for s in seeds]
    if len(out) != rows:
        raise ValueError(f"seeds has {len(out)} entries for {rows} prompts (one seed per row)")
    if any(s < 0 for s in out):
        raise ValueError(f"seeds must be non-negative, got {out}")
    return out
