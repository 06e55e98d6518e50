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

The mixed variant (`first_hop=True`, bundled as `smollm2-135m-protocol-followup-mix`) teaches a
second first call on four of those examples: ask only the first hop ("Which country has Amman as
its capital?"), then follow up as the first variant does. A cold start that samples one first call only leaves
GRPO nothing to choose between; this one samples both, and the reward chooses.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from pathlib import Path

from prompt_r1.core.fsutil import atomic_dir
from prompt_r1.core.protocol import FOLLOW_UP_TURN  # the two-hop follow-up: ask the second hop about the bridge

log = logging.getLogger(__name__)

# Short on purpose: the fewer tokens between the tags, the more reliably a tiny model closes them.
FIRST_TURN = "<think>ask</think><interaction_prompt>Answer it.</interaction_prompt>"
FINAL_TURN = "<think>ok</think><answer>{answer}</answer>"
# For real language models: pass the question on, then answer from the reply.
ASK_TURN = ("<think>I should explain the question to the large language model.</think>"
            "<interaction_prompt>Please answer this question briefly: {question}</interaction_prompt>")
ANSWER_TURN = "<think>The response answers the question.</think><answer>{answer}</answer>"
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
# The mixed cold start (`first_hop=True`): these two-hop examples are taught a second time with a
# first call that asks only the first hop (`core.protocol.FIRST_PART_TURN`), one per first-hop kind,
# so that GRPO samples both first calls and chooses by reward. question -> (first hop, its reply).
FIRST_HOP_EXAMPLES = {
    "On which continent is the country whose capital is Amman?":
        ("Which country has Amman as its capital?", "Amman is the capital of Jordan."),
    "What is the capital of the country where the city of Siem Reap is?":
        ("In which country is the city of Siem Reap?", "Siem Reap is a city in Cambodia."),
    "What is the capital of the country where Petra is?": ("In which country is Petra?", "Petra is in Jordan."),
    "What is the capital of the country where Bob Marley was born?":
        ("In which country was Bob Marley born?", "Bob Marley was born in Jamaica."),
}
_QUESTIONS = [
    ("What is the capital of France?", "Paris"), ("What is 7 times 8?", "56"),
    ("Who wrote Hamlet?", "Shakespeare"), ("Which planet is red?", "Mars"),
    ("What is 9 plus 16?", "25"), ("What colour is the sky?", "blue"),
    ("Name a large ocean.", "Pacific"), ("How many legs has a spider?", "8"),
]


# A trajectory as the model sees it: (token ids, written by the agent?) segments, in order.
Segments = list[tuple[list[int], bool]]


def _follow_up_trajectories(tokenizer, first_hop: bool = False) -> list[Segments]:
    """The two-hop shape: ask, follow up about the bridge the reply named, answer; with `first_hop`
    also `FIRST_HOP_EXAMPLES` again with a first call that asks the first hop only."""
    from prompt_r1.core.protocol import FIRST_PART_TURN, wrap_env_reply
    from prompt_r1.core.tokens import agent_prompt_ids

    encode = (lambda text: tokenizer.encode(text, add_special_tokens=False))
    firsts = [(ASK_TURN.format(question=question), reply1, example) for example in TWO_HOP_EXAMPLES
              for question, reply1 in [example[:2]]]
    if first_hop:
        firsts += [(FIRST_PART_TURN.format(prompt=FIRST_HOP_EXAMPLES[example[0]][0]),
                    FIRST_HOP_EXAMPLES[example[0]][1], example)
                   for example in TWO_HOP_EXAMPLES if example[0] in FIRST_HOP_EXAMPLES]
    trajectories = []
    for first, reply1, (question, _, bridge, hop2, reply2, answer) in firsts:
        segments = [(agent_prompt_ids(tokenizer, question), False)]
        for target, reply in ((first, reply1), (FOLLOW_UP_TURN.format(bridge=bridge, hop2=hop2), reply2)):
            segments += [(encode(target), True), (encode(wrap_env_reply(reply)), False)]
        trajectories.append(segments + [(encode(ANSWER_TURN.format(answer=answer)), True)])
    return trajectories


def _trajectories(tokenizer, rng: random.Random, copy_question: bool, follow_up: bool = False,
                  first_hop: bool = False) -> list[Segments]:
    """Every example trajectory: both turn shapes (and the two-hop one with `follow_up`, with a
    first call that asks the first hop too with `first_hop`)."""
    from prompt_r1.core.protocol import wrap_env_reply
    from prompt_r1.core.tokens import agent_prompt_ids

    encode = (lambda text: tokenizer.encode(text, add_special_tokens=False))
    trajectories = _follow_up_trajectories(tokenizer, first_hop) if follow_up else []
    ask, final = (ASK_TURN, ANSWER_TURN) if copy_question else (FIRST_TURN, FINAL_TURN)
    for question, answer in _QUESTIONS:
        reply = rng.choice(["I think it is " + answer + ".", answer, f"The answer is {answer}."])
        trajectories.append([(agent_prompt_ids(tokenizer, question), False),
                             (encode(ask.format(question=question)), True),
                             (encode(wrap_env_reply(reply)), False), (encode(final.format(answer=answer)), True)])
    return trajectories


def _examples(tokenizer, rng: random.Random, copy_question: bool, follow_up: bool = False,
              first_hop: bool = False) -> list[tuple[list[int], list[int]]]:
    """(context ids, target ids) pairs: each agent turn of each trajectory with all that came before it."""
    pairs = []
    for segments in _trajectories(tokenizer, rng, copy_question, follow_up, first_hop):
        context: list[int] = []
        for ids, agent in segments:
            if agent:
                pairs.append((context, ids))
            context = context + ids
    return pairs


def _sequences(tokenizer, rng: random.Random, copy_question: bool, follow_up: bool,
               whole_trajectories: bool, first_hop: bool = False) -> list[tuple[list[int], list[int]]]:
    """(token ids, labels) training sequences, -100 where the loss does not look: one per agent
    turn (its context unlabelled), or with `whole_trajectories` one per trajectory with every agent
    turn labelled. A causal model's logits at a position see only what comes before it, so a whole
    trajectory gives each turn the loss its own pair would, in one pass over the shared context."""
    if not whole_trajectories:
        return [(context + target, [-100] * len(context) + target)
                for context, target in _examples(tokenizer, rng, copy_question, follow_up, first_hop)]
    sequences = []
    for segments in _trajectories(tokenizer, rng, copy_question, follow_up, first_hop):
        ids = [t for part, _ in segments for t in part]
        labels = [t if agent else -100 for part, agent in segments for t in part]
        sequences.append((ids, labels))
    return sequences


def build_protocol_model(base: Path, out: Path, steps: int = 200, lr: float = 5e-3, seed: int = 0,
                         copy_question: bool = False, follow_up: bool = False,
                         whole_trajectories: bool = False, batch_size: int = 4, first_hop: bool = False) -> Path:
    """Save a copy of `base` fine-tuned on the protocol's turn shapes to `out` (cached by path).

    `copy_question=True` (for real language models) teaches turns that pass the question on to
    the environment and answer from its reply; the tiny model learns a fixed short text instead.
    `follow_up=True` adds the two-hop shape (a second call about the entity the first reply named);
    `first_hop=True` adds a second first call to it, one that asks only the first hop
    (`FIRST_HOP_EXAMPLES`), so the cold start samples more than one first-call strategy.
    Each step trains on `batch_size` sequences drawn at random: single agent turns with their
    context, or with `whole_trajectories` whole example trajectories (about 2.4x fewer tokens a
    pass over the examples for the two-hop shape, whose three turns share one context).
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
    sequences = _sequences(tokenizer, rng, copy_question, follow_up, whole_trajectories, first_hop)
    # a GGUF-converted tokenizer may carry no pad token (transformers 5.17 leaves it unset)
    pad_id = pad_token_id(tokenizer, stop_token_ids(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    log.info("format warm start of %s: %d supervised steps", base, steps)
    started = time.monotonic()
    for step in range(steps):
        batch = rng.sample(sequences, k=min(batch_size, len(sequences)))
        width = max(len(seq) for seq, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        attention = torch.zeros_like(ids)
        for i, (seq, seq_labels) in enumerate(batch):
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, : len(seq)] = torch.tensor(seq_labels)
            attention[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        elapsed = time.monotonic() - started
        # a step of a real model takes seconds: say each one, with the time left (a tiny model's 200
        # steps take a second or two, so it says every 50th)
        if elapsed > 1.0 * (step + 1) or step % 50 == 0 or step == steps - 1:
            log.info("warm start step %d/%d: loss %.3f, %.0f s so far, about %.0f s left", step + 1, steps,
                     loss.item(), elapsed, elapsed / (step + 1) * (steps - step - 1))
    model.eval()
    with atomic_dir(out) as tmp:  # concurrent builders: the first one wins
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for extra in ("generation_config.json",):
            if (base / extra).exists():
                shutil.copy(base / extra, tmp / extra)
    return out
