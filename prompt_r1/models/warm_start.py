"""A format warm start: teach a tiny random model the Prompt-R1 turn shapes by supervised steps.

A randomly initialised test model almost never writes `<interaction_prompt>...</interaction_prompt>`,
so smoke runs would never call the environment. `build_protocol_model` takes the tiny byte-level
model and trains it briefly (cross-entropy on the agent's tokens only) on two turn shapes:
the first turn asks the environment, the turn after an `<interaction_response>` answers. The
result (`tiny-protocol`) is still a tiny model that writes mostly nonsense inside the tags, which
is what smoke tests of the real rollout, reward and GRPO paths need: real sampling with real
environment calls and rewards that vary.

The follow-up variant (`follow_up=True`, bundled as `smollm2-135m-protocol-followup`) adds a third
turn shape for two-hop questions ("On which continent is the country whose capital is Amman?"):
pass the question on, read the bridge entity the reply names (Jordan) and ask the second hop about
it ("On which continent is Jordan?"), then answer from the second reply. Single-hop questions keep
the one-call shape. Its examples use countries that are not in the compositional fact table
(`prompt_r1/data/compositional.py`; tests/data/test_compositional.py checks), so no probe question's
entities are seen in the warm start: it teaches the shape of a follow-up, not the facts.
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
# Two-hop shape: after the first reply, ask the second hop about the entity it named.
FOLLOW_UP_TURN = ("<think>The response names {bridge}. Now I ask the second part about {bridge}.</think>"
                  "<interaction_prompt>{hop2}</interaction_prompt>")
# (question, first reply, bridge entity, second-hop question, second reply, answer); entities kept
# out of the compositional fact table on purpose (see the module docstring).
TWO_HOP_EXAMPLES = [
    ("On which continent is the country whose capital is Amman?", "The capital of Jordan is Amman.", "Jordan",
     "On which continent is Jordan?", "Jordan is in Asia.", "Asia"),
    ("What is the currency of the country whose capital is Bucharest?", "Bucharest is the capital of Romania.",
     "Romania", "What is the currency of Romania?", "The currency of Romania is the leu.", "leu"),
    ("What is the official language of the country whose capital is Reykjavik?",
     "Reykjavik is the capital city of Iceland.", "Iceland", "What is the official language of Iceland?",
     "The official language of Iceland is Icelandic.", "Icelandic"),
    ("What is the capital of the country where the city of Siem Reap is?", "Siem Reap is a city in Cambodia.",
     "Cambodia", "What is the capital of Cambodia?", "The capital of Cambodia is Phnom Penh.", "Phnom Penh"),
    ("On which continent is the country where the city of Maracaibo is?", "Maracaibo is in Venezuela.",
     "Venezuela", "On which continent is Venezuela?", "Venezuela is in South America.", "South America"),
    ("What is the currency of the country where the city of Kuching is?", "Kuching is a city in Malaysia.",
     "Malaysia", "What is the currency of Malaysia?", "Malaysia uses the ringgit.", "ringgit"),
    ("What is the capital of the country where Petra is?", "Petra is an ancient city in Jordan.", "Jordan",
     "What is the capital of Jordan?", "The capital of Jordan is Amman.", "Amman"),
    ("What is the capital of the country where Bob Marley was born?", "Bob Marley was born in Jamaica.",
     "Jamaica", "What is the capital of Jamaica?", "Kingston is the capital of Jamaica.", "Kingston"),
    ("On which continent is the country where the city of Punta del Este is?",
     "Punta del Este is a resort city in Uruguay.", "Uruguay", "On which continent is Uruguay?",
     "Uruguay is in South America.", "South America"),
    ("What is the currency of the country where the city of Plovdiv is?", "Plovdiv is a city in Bulgaria.",
     "Bulgaria", "What is the currency of Bulgaria?", "The currency of Bulgaria is the lev.", "lev"),
    ("On which continent is the country whose capital is Dakar?", "Dakar is the capital of Senegal.", "Senegal",
     "On which continent is Senegal?", "Senegal is a country in Africa.", "Africa"),
    ("What is the capital of the country where the city of Sfax is?", "Sfax is a port city in Tunisia.",
     "Tunisia", "What is the capital of Tunisia?", "The capital of Tunisia is Tunis.", "Tunis"),
]
_QUESTIONS = [
    ("What is the capital of France?", "Paris"), ("What is 7 times 8?", "56"),
    ("Who wrote Hamlet?", "Shakespeare"), ("Which planet is red?", "Mars"),
    ("What is 9 plus 16?", "25"), ("What colour is the sky?", "blue"),
    ("Name a large ocean.", "Pacific"), ("How many legs has a spider?", "8"),
]


def _follow_up_examples(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(context ids, target ids) pairs of the two-hop shape: ask, follow up, answer."""
    from prompt_r1.core.protocol import wrap_env_reply
    from prompt_r1.core.tokens import agent_prompt_ids

    encode = (lambda text: tokenizer.encode(text, add_special_tokens=False))
    pairs = []
    for question, reply1, bridge, hop2, reply2, answer in TWO_HOP_EXAMPLES:
        context = agent_prompt_ids(tokenizer, question)
        for target, reply in ((ASK_TURN.format(question=question), reply1),
                              (FOLLOW_UP_TURN.format(bridge=bridge, hop2=hop2), reply2)):
            pairs.append((context, encode(target)))
            context = context + encode(target) + encode(wrap_env_reply(reply))
        pairs.append((context, encode(ANSWER_TURN.format(answer=answer))))
    return pairs


def _examples(tokenizer, rng: random.Random, copy_question: bool,
              follow_up: bool = False) -> list[tuple[list[int], list[int]]]:
    """(context ids, target ids) pairs for both turn shapes (and the two-hop one with `follow_up`)."""
    from prompt_r1.core.protocol import wrap_env_reply
    from prompt_r1.core.tokens import agent_prompt_ids

    pairs = _follow_up_examples(tokenizer) if follow_up else []
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
                         copy_question: bool = False, follow_up: bool = False) -> Path:
    """Save a copy of `base` fine-tuned on the protocol's turn shapes to `out` (cached by path).

    `copy_question=True` (for real language models) teaches turns that pass the question on to
    the environment and answer from its reply; the tiny model learns a fixed short text instead.
    `follow_up=True` adds the two-hop shape (a second call about the entity the first reply named).
    """
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.core.tokens import pad_token_id, stop_token_ids

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    pairs = _examples(tokenizer, rng, copy_question, follow_up)
    # a GGUF-converted tokenizer may carry no pad token (transformers 5.17 leaves it unset)
    pad_id = pad_token_id(tokenizer, stop_token_ids(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    log.info("format warm start of %s: %d supervised steps", base, steps)
    for step in range(steps):
        batch = rng.sample(pairs, k=min(4, len(pairs)))
        width = max(len(c) + len(t) for c, t in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
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
