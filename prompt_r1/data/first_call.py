"""The two-hop task's first call: its scaffold, its turn-1 reward and the indicators that watch it.

On a two-hop question ("On which continent is the country whose capital is Helsinki?") the agent's
first environment call decides most of the score: the environment names the bridge country
(Finland) for about half the questions asked whole, and for about 0.87 asked only the first hop
(`benchmarks/results/compose-screen.json`). A warm-started agent passes the whole question on every
time, so this module gives the task what guided exploration needs (`prompt_r1.rollout.scaffold`,
`prompt_r1.core.turn_credit`):

- `first_hop_scaffold`: a first agent turn that asks the question's own first hop, for
  `rollout.scaffold.fn`; `two_hop_privileged` (`rollout.scaffold.privileged`) names the bridge, which
  a scaffold must never say before a reply did (refused here and in `rollout.scaffold`, with the
  gold answers).
- `second_hop_scaffold` (`rollout.scaffold.follow_up`): after the first reply, ask the question's
  second hop about the country that reply named first (whichever it is: right or wrong, the
  environment's word is what the episode goes on from); nothing when it named none.
- `two_hop_turn_rewards`: turn 1 earns 1 when the first reply names the bridge, else 0; turn 2 is
  `follow_up_turn_rewards`' (1 names the bridge, 0.5 reuses a name of the first reply, else 0).
  `two_hop_grounded_turn_rewards` adds the answer after two calls: 1 when a reply named the gold it
  names, else 0 (recipe 5: a right answer from the agent's memory earns the outcome, not this).
- `two_hop_indicators` (`reward.turn.indicators`): `first_hop` (the first call names the source
  entity and not the second hop's relation word: it decomposes), and two leaks that must not rise
  with training: `bridge_before_reply` (the first call names the bridge before any reply said it)
  and `answer_unseen` (the answer names a gold that no reply named in any form: "the European
  continent" names Europe, `mentions_in_some_form`).

Every function takes a `QuestionRow` of a generated two-hop question (found by its text, seed 0
as `data/compositional`) and raises for any other, as a turn scorer must.
"""

from __future__ import annotations

from prompt_r1.core.metrics import mentions, mentions_in_some_form, normalize_answer
from prompt_r1.core.protocol import FIRST_PART_TURN, FOLLOW_UP_TURN, parse_turn
from prompt_r1.data.compositional import (COUNTRIES, SECOND_HOPS, Country, TwoHopQuestion, follow_up_turn_rewards,
                                          known_questions)

# The word that says which second hop a question asks (in neither first-hop template of that chain).
RELATION_WORDS = {"continent": "continent", "currency": "currency", "language": "language", "capital": "capital"}


def _known(question) -> TwoHopQuestion:
    known = known_questions().get(question.question)
    if known is None:
        raise ValueError("not a generated two-hop question (prompt_r1.data.first_call is defined only for "
                         "those): train on data/compositional, or unset the setting that names this function")
    return known


def first_hop_scaffold(question) -> str:
    """The scaffold turn of `question`: ask its first hop ("Which country has Helsinki as its capital?").

    >>> from prompt_r1.core.questions import QuestionRow
    >>> q = next(iter(known_questions().values()))
    >>> first_hop_scaffold(QuestionRow("q", "d", "train", q.question, list(q.answers), "qa", "f1")) \\
    ...     == FIRST_PART_TURN.format(prompt=q.hops[0].question)
    True
    """
    known = _known(question)
    prompt = known.hops[0].question
    if mentions(prompt, known.hops[0].answers) or mentions(prompt, known.answers):
        raise ValueError(f"the first hop of {question.question!r} names its bridge or answer; the generator drops "
                         "such questions, so this one is not from data/compositional")
    return FIRST_PART_TURN.format(prompt=prompt)


def first_country_named(reply: str) -> Country | None:
    """The country of the task's table that `reply` names first (any spelling, whole words), or None.

    >>> first_country_named("Helsinki is the capital of Finland, not Sweden.").name
    'Finland'
    >>> first_country_named("I do not know.") is None
    True
    """
    padded = f" {normalize_answer(reply)} "
    found = []
    for country in COUNTRIES:
        places = [padded.find(f" {norm} ") for norm in map(normalize_answer, country.names) if norm]
        places = [p for p in places if p >= 0]
        if places:
            found.append((min(places), country.name, country))
    return min(found, key=lambda f: f[:2])[2] if found else None


def second_hop_scaffold(question, replies: tuple[str, ...]) -> str | None:
    """The follow-up scaffold (`rollout.scaffold.follow_up`): after the first reply only, the
    question's second hop asked about the country that reply named first, in the follow-up warm
    start's words (`FOLLOW_UP_TURN`); None (the policy writes the turn) when it named no country of
    the task's table, and after any later reply."""
    known = _known(question)
    country = first_country_named(replies[0]) if len(replies) == 1 else None
    if country is None:
        return None
    relation = known.chain.split(">")[1]
    return FOLLOW_UP_TURN.format(bridge=country.name, hop2=SECOND_HOPS[relation][0].format(c=country.mention))


def two_hop_privileged(question) -> tuple[str, ...]:
    """What a scaffold must never say for `question` (`rollout.scaffold.privileged`): the bridge
    country's spellings, which only the environment's first reply may tell."""
    return _known(question).hops[0].answers


def two_hop_turn_rewards(question, trajectory) -> list[float | None]:
    """Turn rewards of both calls (`reward.turn.scorer: prompt_r1.data.first_call:two_hop_turn_rewards`):
    turn 1 is 1.0 when the first reply names the bridge and 0.0 when it does not or no call was made;
    turn 2 as `follow_up_turn_rewards`; later turns None (not judged)."""
    known = _known(question)
    rewards = follow_up_turn_rewards(question, trajectory)
    if rewards:
        replies = trajectory.env_replies
        rewards[0] = 1.0 if replies and mentions(replies[0], known.hops[0].answers) else 0.0
    return rewards


def two_hop_grounded_turn_rewards(question, trajectory) -> list[float | None]:
    """`two_hop_turn_rewards` plus the answer after two calls (the third turn): 1.0 when it names a
    gold that some reply named in any form (`mentions_in_some_form`), else 0.0, a wrong answer and
    an answer from the agent's own memory alike. It is `answer_unseen`'s opposite as a reward: the
    outcome pays a right answer wherever it came from, this turn reward only one the environment
    gave, so that what training adds comes through the calls."""
    rewards = two_hop_turn_rewards(question, trajectory)
    turns = trajectory.agent_turns
    if len(turns) == 3 and parse_turn(turns[2]).kind == "answer":
        seen = golds_seen(_known(question), trajectory.answer, trajectory.env_replies)
        rewards[2] = 1.0 if any(seen.values()) else 0.0
    return rewards


def golds_seen(known: TwoHopQuestion, answer: str, replies) -> dict[str, bool]:
    """Each gold the answer names -> did some reply name it in any form (`mentions_in_some_form`)."""
    return {g: any(mentions_in_some_form(r, [g]) for r in replies) for g in known.answers if mentions(answer, [g])}


def asks_first_hop(known: TwoHopQuestion, prompt: str) -> bool:
    """Does this call decompose: it names the source entity and not the second hop's relation?

    >>> q = next(q for q in known_questions().values() if q.chain == "capital>continent")
    >>> asks_first_hop(q, q.hops[0].question), asks_first_hop(q, "Please answer this question briefly: " + q.question)
    (True, False)
    """
    relation = RELATION_WORDS[known.chain.split(">")[1]]
    return mentions(prompt, [known.source]) and not mentions(prompt, [relation])


def two_hop_indicators(question, trajectory) -> dict[str, bool | None]:
    """What the first call did (`reward.turn.indicators: prompt_r1.data.first_call:two_hop_indicators`):
    `first_hop` (None without an interaction turn), `bridge_before_reply` (None likewise) and
    `answer_unseen` (None without an answer)."""
    known = _known(question)
    turns = trajectory.agent_turns
    first = parse_turn(turns[0]).interaction_prompt if turns else None
    replies = trajectory.env_replies
    answer = trajectory.answer if turns and parse_turn(turns[-1]).kind == "answer" else None
    return {
        "first_hop": None if first is None else asks_first_hop(known, first),
        "bridge_before_reply": None if first is None else mentions(first, known.hops[0].answers),
        "answer_unseen": None if answer is None else not all(golds_seen(known, answer, replies).values()),
    }
