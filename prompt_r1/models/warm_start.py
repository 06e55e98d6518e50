"""A format warm start: teach a tiny random model the Prompt-R1 turn shapes by supervised steps.

A randomly initialised test model almost never writes `<interaction_prompt>...</interaction_prompt>`,
so smoke runs would never call the environment. `build_protocol_model` takes the tiny byte-level
model and trains it briefly (cross-entropy on the agent's tokens only) on two turn shapes:
the first turn asks the environment, the turn after an `<interaction_response>` answers. The
result (`tiny-protocol`) is still a tiny model that writes mostly nonsense inside the tags, which
is what smoke tests of the real rollout, reward and GRPO paths need: real sampling with real
environment calls and rewards that vary.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

from prompt_r1.core.fsutil import atomic_dir

log = logging.getLogger(__name__)

# Short on purpose: the fewer tokens between the tags, the more reliably a tiny model closes them.
FIRST_TURN = "<think>ask</think><interaction_prompt>Answer it.</interaction_prompt>"
FINAL_TURN = "<think>ok</think><answer>{answer}</answer>"
# For real language models: pass the question on, then answer from the reply.
ASK_TURN = ("<think>I should explain the question to the large language model.</think>"
            "<interaction_prompt>Please answer this question briefly: {question}</interaction_prompt>")
ANSWER_TURN = "<think>The response answers the question.</think><answer>{answer}</answer>"
_QUESTIONS = [
    ("What is the capital of France?", "Paris"), ("What is 7 times 8?", "56"),
    ("Who wrote Hamlet?", "Shakespeare"), ("Which planet is red?", "Mars"),
    ("What is 9 plus 16?", "25"), ("What colour is the sky?", "blue"),
    ("Name a large ocean.", "Pacific"), ("How many legs has a spider?", "8"),
]


def _examples(tokenizer, rng: random.Random, copy_question: bool) -> list[tuple[list[int], list[int]]]:
    """(context ids, target ids) pairs for both turn shapes."""
    from prompt_r1.core.protocol import wrap_env_reply
    from prompt_r1.core.tokens import agent_prompt_ids

    pairs = []
    for question, answer in _QUESTIONS:
        prompt = agent_prompt_ids(tokenizer, question)
        ask, final = (ASK_TURN, ANSWER_TURN) if copy_question else (FIRST_TURN, FINAL_TURN)
        first = tokenizer.encode(ask.format(question=question), add_special_tokens=False)
        pairs.append((prompt, first))
        reply = rng.choice(["I think it is " + answer + ".", answer, f"The answer is {answer}."])
        context = prompt + first + tokenizer.encode(wrap_env_reply(reply), add_special_tokens=False)
        pairs.append((context, tokenizer.encode(final.format(answer=answer), add_special_tokens=False)))
    return pairs


def build_protocol_model(base: Path, out: Path, steps: int = 200, lr: float = 5e-3, seed: int = 0,
                         copy_question: bool = False) -> Path:
    """Save a copy of `base` fine-tuned on the protocol's turn shapes to `out` (cached by path).

    `copy_question=True` (for real language models) teaches turns that pass the question on to
    the environment and answer from its reply; the tiny model learns a fixed short text instead.
    """
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    pairs = _examples(tokenizer, rng, copy_question)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    log.info("format warm start of %s: %d supervised steps", base, steps)
    for step in range(steps):
        batch = rng.sample(pairs, k=min(4, len(pairs)))
        width = max(len(c) + len(t) for c, t in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        attention = torch.zeros_like(ids)
        for i, (context, target) in enumerate(batch):
            seq = context + target
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(context) : len(seq)] = torch.tensor(target)
            attention[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == steps - 1:
            log.info("warm start step %d: loss %.3f", step, loss.item())
    model.eval()
    with atomic_dir(out) as tmp:  # concurrent builders: the first one wins
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for extra in ("generation_config.json",):
            if (base / extra).exists():
                shutil.copy(base / extra, tmp / extra)
    return out
