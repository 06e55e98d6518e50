"""Token-level conventions shared by every local causal LM here (agent policies, in-process env).

The agent policy and the in-process environment both load a tokenizer and a model and feed it
batches; each needs the same answers to: which ids end a turn, which id pads, how a batch is
left-padded, how chat messages become prompt ids, and which torch dtype a config name means.
One implementation each, so the two sides can never drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from prompt_r1.core.protocol import build_agent_prompt

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config's dtype name (`agent.dtype`).

    >>> torch_dtype("bfloat16")
    torch.bfloat16
    """
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {name!r}") from None


def stop_token_ids(tokenizer: Any, generation_eos: int | Sequence[int] | None = None) -> list[int]:
    """Ids that end a turn, without repeats: the generation config's EOS first, then the
    tokenizer's EOS, then `<|im_end|>` when the vocabulary has it. Raises when there is none,
    since nothing could then tell where a reply ends."""
    eos = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    ids: list[int] = []
    for value in [*eos, tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]:
        if isinstance(value, int) and value != tokenizer.unk_token_id and value not in ids:
            ids.append(int(value))
    if not ids:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no EOS token; cannot tell "
                         "where a turn ends (set eos_token in its tokenizer_config.json)")
    return ids


def pad_token_id(tokenizer: Any, stop_ids: Sequence[int]) -> int:
    """The tokenizer's pad id, else the first stop id (padded positions are masked out anyway)."""
    pad = tokenizer.pad_token_id
    return int(pad) if pad is not None else int(stop_ids[0])


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) with every row ending at the same column, so the next token of
    each row is sampled from the batch's last position.

    >>> ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        attention[row, width - len(prompt):] = 1
    return input_ids, attention


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]], template: str | None = None) -> list[int]:
    """Prompt ids of chat messages: the chat template (the tokenizer's, or `template`) with the
    generation prompt, rendered to text and encoded without adding special tokens again."""
    text = tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                         tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def agent_prompt_ids(tokenizer: Any, question: str, environment: str | None = None) -> list[int]:
    """The agent's prompt: the chat template (with generation prompt) over the Prompt-R1 user
    message (with the environment's description line when one is given)."""
    return chat_prompt_ids(tokenizer, [{"role": "user", "content": build_agent_prompt(question, environment)}])


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of untrusted text: special tokens in it are split into ordinary tokens, so an
    environment that writes `<|im_end|>` cannot end the agent's turn or fake a chat role. (The
    protocol tags are ordinary added tokens and keep their ids.)"""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
