"""Two-hop (compositional) questions generated from a fact table written for this project.

Prompt-R1's claim is that the agent learns to interact over several turns: read the
environment's reply and ask the next thing. Single-hop questions cannot show that (one call
suffices), so this module generates questions that chain two well-known facts through a country,
e.g. "On which continent is the country whose capital is Tokyo?" = ("Which country has Tokyo as
its capital?" -> Japan, "On which continent is Japan?" -> Asia). Each question carries its two
hops (sub-question and answers), its chain and its country, so a screen can keep the questions the
environment fails when asked at once but answers hop by hop (`benchmarks/screens/compose_screen.py`), and
a probe/training split can keep every country on one side (`split_by_entity`).

`follow_up` is the mechanical definition of "the agent's second environment call uses what the
first reply said", the mechanism the compositional benchmark reports; `follow_up_turn_rewards`
turns it into the task's turn-level reward (`reward.turn.scorer`, see `prompt_r1.core.turn_credit`).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from prompt_r1.core.metrics import mentions
from prompt_r1.core.protocol import parse_turn
from prompt_r1.core.seeding import derive_seed


@dataclass(frozen=True)
class Country:
    """Facts about one country; `names` are the accepted spellings (the first is used in questions)."""

    names: tuple[str, ...]
    capital: tuple[str, ...]
    continent: tuple[str, ...]
    currency: tuple[str, ...] = ()
    language: tuple[str, ...] = ()
    cities: tuple[str, ...] = ()              # well-known cities other than the capital
    landmarks: tuple[str, ...] = ()           # as said in a sentence ("the Eiffel Tower")
    people: tuple[str, ...] = ()              # famous people born there
    article: bool = False                     # "the United States"

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def mention(self) -> str:
        """How the country is named inside a question."""
        return f"the {self.name}" if self.article else self.name


def _c(names, capital, continent, currency=(), language=(), cities=(), landmarks=(), people=(), article=False):
    tup = (lambda v: (v,) if isinstance(v, str) else tuple(v))
    return Country(tup(names), tup(capital), tup(continent), tup(currency), tup(language), tup(cities),
                   tup(landmarks), tup(people), article)


EUROPE, ASIA, AFRICA = ("Europe",), ("Asia",), ("Africa",)
S_AMERICA, N_AMERICA, OCEANIA = ("South America",), ("North America",), ("Oceania", "Australia")

# Well-known facts only; where a fact has several accepted answers all are listed.
COUNTRIES: tuple[Country, ...] = (
    _c("Japan", "Tokyo", ASIA, "yen", "Japanese", ("Osaka", "Kyoto"), ("Mount Fuji",)),
    _c("France", "Paris", EUROPE, "euro", "French", ("Marseille", "Lyon"), ("the Eiffel Tower",), ("Napoleon",)),
    _c("Germany", "Berlin", EUROPE, "euro", "German", ("Munich", "Hamburg"), ("the Brandenburg Gate",),
       ("Albert Einstein", "Beethoven")),
    _c("Italy", "Rome", EUROPE, "euro", "Italian", ("Milan", "Venice", "Naples"), ("the Colosseum",),
       ("Leonardo da Vinci",)),
    _c("Spain", "Madrid", EUROPE, "euro", "Spanish", ("Barcelona", "Seville"), ("the Sagrada Familia",),
       ("Pablo Picasso",)),
    _c("Portugal", "Lisbon", EUROPE, "euro", "Portuguese", ("Porto",)),
    _c(("United Kingdom", "UK", "Britain", "England"), "London", EUROPE, ("pound", "sterling"), "English",
       ("Manchester", "Liverpool"), ("Big Ben", "Stonehenge"), ("William Shakespeare",), article=True),
    _c("Russia", "Moscow", ("Europe", "Asia"), "ruble", "Russian", ("Saint Petersburg",), ("the Kremlin",),
       ("Leo Tolstoy",)),
    _c("China", "Beijing", ASIA, ("yuan", "renminbi"), ("Chinese", "Mandarin"), ("Shanghai",), (), ("Confucius",)),
    _c("India", "New Delhi", ASIA, "rupee", ("Hindi", "English"), ("Mumbai", "Kolkata", "Bangalore"),
       ("the Taj Mahal",), ("Mahatma Gandhi",)),
    _c("Egypt", "Cairo", AFRICA, "pound", "Arabic", ("Alexandria", "Luxor"), ("the Pyramids of Giza",)),
    _c("Kenya", "Nairobi", AFRICA, "shilling", ("Swahili", "English"), ("Mombasa",)),
    _c("Nigeria", "Abuja", AFRICA, "naira", "English", ("Lagos",)),
    _c("South Africa", ("Pretoria", "Cape Town", "Bloemfontein"), AFRICA, "rand", (), ("Johannesburg", "Durban"),
       (), ("Nelson Mandela",)),
    _c("Morocco", "Rabat", AFRICA, "dirham", "Arabic", ("Casablanca", "Marrakesh")),
    _c("Ethiopia", "Addis Ababa", AFRICA, "birr", "Amharic"),
    _c("Ghana", "Accra", AFRICA, "cedi", "English", ("Kumasi",)),
    _c("Brazil", ("Brasilia", "Brasília"), S_AMERICA, "real", "Portuguese", ("Rio de Janeiro", "Sao Paulo"),
       ("the Christ the Redeemer statue",), ("Pele",)),
    _c("Argentina", "Buenos Aires", S_AMERICA, "peso", "Spanish", ("Cordoba", "Rosario")),
    _c("Peru", "Lima", S_AMERICA, "sol", "Spanish", ("Cusco",), ("Machu Picchu",)),
    _c("Chile", "Santiago", S_AMERICA, "peso", "Spanish", ("Valparaiso",)),
    _c("Colombia", ("Bogota", "Bogotá"), S_AMERICA, "peso", "Spanish", ("Medellin", "Cali")),
    _c("Mexico", "Mexico City", N_AMERICA, "peso", "Spanish", ("Cancun", "Guadalajara"), (), ("Frida Kahlo",)),
    _c("Canada", "Ottawa", N_AMERICA, "dollar", ("English", "French"), ("Toronto", "Vancouver", "Montreal")),
    _c(("United States", "USA", "US", "America"), ("Washington", "Washington, D.C."), N_AMERICA, "dollar",
       "English", ("New York", "Chicago", "Los Angeles"), ("the Statue of Liberty",), ("Abraham Lincoln",),
       article=True),
    _c("Cuba", "Havana", N_AMERICA, "peso", "Spanish"),
    _c("Australia", "Canberra", OCEANIA, "dollar", "English", ("Sydney", "Melbourne")),
    _c("New Zealand", "Wellington", OCEANIA, "dollar", ("English", "Maori"), ("Auckland",)),
    _c("Turkey", "Ankara", ("Asia", "Europe"), "lira", "Turkish", ("Istanbul",)),
    _c("Greece", "Athens", EUROPE, "euro", "Greek", ("Thessaloniki",), ("the Parthenon",)),
    _c(("Netherlands", "Holland"), "Amsterdam", EUROPE, "euro", "Dutch", ("Rotterdam",), (), ("Vincent van Gogh",),
       article=True),
    _c("Belgium", "Brussels", EUROPE, "euro", ("Dutch", "French", "German"), ("Antwerp",)),
    _c("Switzerland", "Bern", EUROPE, "franc", ("German", "French", "Italian"), ("Zurich", "Geneva")),
    _c("Austria", "Vienna", EUROPE, "euro", "German", ("Salzburg",), (), ("Mozart",)),
    _c("Sweden", "Stockholm", EUROPE, "krona", "Swedish", ("Gothenburg",)),
    _c("Norway", "Oslo", EUROPE, "krone", "Norwegian", ("Bergen",)),
    _c("Denmark", "Copenhagen", EUROPE, "krone", "Danish", ("Aarhus",)),
    _c("Finland", "Helsinki", EUROPE, "euro", ("Finnish", "Swedish")),
    _c("Poland", "Warsaw", EUROPE, "zloty", "Polish", ("Krakow",), (), ("Frederic Chopin",)),
    _c("Ireland", "Dublin", EUROPE, "euro", ("English", "Irish"), ("Cork",)),
    _c("Hungary", "Budapest", EUROPE, "forint", "Hungarian"),
    _c(("Czech Republic", "Czechia"), "Prague", EUROPE, "koruna", "Czech", ("Brno",), article=True),
    _c("South Korea", "Seoul", ASIA, "won", "Korean", ("Busan",)),
    _c("Thailand", "Bangkok", ASIA, "baht", "Thai", ("Chiang Mai",)),
    _c("Vietnam", "Hanoi", ASIA, "dong", "Vietnamese", ("Ho Chi Minh City",)),
    _c("Indonesia", "Jakarta", ASIA, "rupiah", "Indonesian", ("Surabaya",)),
    _c("Pakistan", "Islamabad", ASIA, "rupee", ("Urdu", "English"), ("Karachi", "Lahore")),
    _c("Iran", "Tehran", ASIA, "rial", ("Persian", "Farsi"), ("Isfahan",)),
    _c("Iraq", "Baghdad", ASIA, "dinar", "Arabic", ("Basra",)),
    _c("Saudi Arabia", "Riyadh", ASIA, "riyal", "Arabic", ("Jeddah", "Mecca")),
    _c("Israel", "Jerusalem", ASIA, "shekel", "Hebrew", ("Tel Aviv",)),
    _c("Philippines", "Manila", ASIA, "peso", ("Filipino", "English"), ("Cebu",), article=True),
    _c("Ukraine", ("Kyiv", "Kiev"), EUROPE, "hryvnia", "Ukrainian", ("Odesa", "Odessa")),
)

# First hop: source entity -> country. (kind, question template, Country field of the sources)
FIRST_HOPS = {
    "capital": ("Which country has {x} as its capital?", "capital"),
    "city": ("In which country is the city of {x}?", "cities"),
    "landmark": ("In which country is {x}?", "landmarks"),
    "person": ("In which country was {x} born?", "people"),
}
# How the first hop is said inside a composed question ("the country {clause}").
CLAUSES = {"capital": "whose capital is {x}", "city": "where the city of {x} is",
           "landmark": "where {x} is", "person": "where {x} was born"}
# Second hop: country -> value. (question template on the country, composed template on "the country ...")
SECOND_HOPS = {
    "continent": ("On which continent is {c}?", "On which continent is the country {clause}?"),
    "currency": ("What is the currency of {c}?", "What is the currency of the country {clause}?"),
    "language": ("What is the official language of {c}?", "What is the official language of the country {clause}?"),
    "capital": ("What is the capital of {c}?", "What is the capital of the country {clause}?"),
}
# Which second hops follow which first hop (asking a capital's country for its capital is no question).
CHAINS: tuple[tuple[str, str], ...] = (
    ("capital", "continent"), ("capital", "currency"), ("capital", "language"),
    ("city", "capital"), ("city", "continent"), ("city", "currency"),
    ("landmark", "capital"), ("landmark", "currency"),
    ("person", "capital"), ("person", "continent"),
)


@dataclass(frozen=True)
class Hop:
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class TwoHopQuestion:
    question: str
    answers: tuple[str, ...]
    hops: tuple[Hop, Hop]
    chain: str          # "capital>continent": the first hop's kind, then the second hop's relation
    country: str        # the bridge entity: the split key
    source: str         # the first hop's entity (Tokyo)

    def row(self, dataset: str) -> dict:
        """The question as an ingestible JSONL row (the `data/screened` shape)."""
        return {"dataset": dataset, "question": self.question, "answers": list(self.answers),
                "task_family": "multihop_qa"}


def _values(country: Country, relation: str) -> tuple[str, ...]:
    return country.capital if relation == "capital" else getattr(country, relation)


def _leaks(question: str, answers: Sequence[str]) -> bool:
    """A gold answer said in the question itself (`Mexico City` names Mexico): a reply that
    echoes the question would pass, so such questions are left out."""
    return mentions(question, answers)


def generate(seed: int = 0, countries: Sequence[Country] = COUNTRIES) -> list[TwoHopQuestion]:
    """Every two-hop question the table gives along `CHAINS`, in a seeded order; questions whose
    composed question or either hop states its own answer are left out (`_leaks`)."""
    out: list[TwoHopQuestion] = []
    for country in countries:
        for first, second in CHAINS:
            values = _values(country, second)
            if not values:
                continue
            hop1_template, sources_field = FIRST_HOPS[first]
            sources = getattr(country, sources_field)
            for source in sources[:1] if first == "capital" else sources:
                hop1 = Hop(hop1_template.format(x=source), country.names)
                hop2_template, composed_template = SECOND_HOPS[second]
                hop2 = Hop(hop2_template.format(c=country.mention), values)
                question = composed_template.format(clause=CLAUSES[first].format(x=source))
                if _leaks(question, values) or _leaks(hop1.question, hop1.answers) or _leaks(hop2.question, values):
                    continue
                out.append(TwoHopQuestion(question, values, (hop1, hop2), f"{first}>{second}", country.name, source))
    random.Random(derive_seed("compositional", seed)).shuffle(out)
    return out


def split_by_entity(questions: Sequence[TwoHopQuestion], probe_min: int,
                    seed: int = 0) -> tuple[list[TwoHopQuestion], list[TwoHopQuestion]]:
    """(probe, train): whole countries, in a seeded order, go to the probe set until it holds at
    least `probe_min` questions; every other country's questions form the training pool, so no
    country is in both."""
    by_country: dict[str, list[TwoHopQuestion]] = defaultdict(list)
    for q in questions:
        by_country[q.country].append(q)
    order = sorted(by_country)
    random.Random(derive_seed("compositional_split", seed)).shuffle(order)
    probe: list[TwoHopQuestion] = []
    train: list[TwoHopQuestion] = []
    for country in order:
        (probe if len(probe) < probe_min else train).extend(by_country[country])
    if len(probe) < probe_min or not train:
        raise ValueError(f"{len(questions)} questions over {len(order)} countries cannot give a probe set of "
                         f"{probe_min} and a training pool of whole countries; screen more candidates")
    return probe, train


def by_question(seed: int = 0) -> dict[str, TwoHopQuestion]:
    """The generated questions keyed by their text (to find a probe row's hops)."""
    return {q.question: q for q in generate(seed)}


# Words of a reply that name nothing (sentence starts, pronouns): never evidence of use.
_FILLER = frozenset("the a an it its this that these those there yes no i in on of is was and or but so "
                    "as at by for from to with which what who whose where when how answer question".split())
_WORD = re.compile(r"[A-Za-zÀ-ÿ][A-Za-zÀ-ÿ'-]+")


@dataclass
class FollowUp:
    """What a trajectory did with the environment, for one two-hop question."""

    calls: int                       # environment calls made
    second_call: bool                # it made at least two
    uses_reply: bool                 # the second call names something the first reply said, beyond the question
    names_bridge: bool               # the second call names the bridge country, which the first reply named
    new_words: list[str] = field(default_factory=list)   # the first reply's words the second call reused


def reply_names(reply: str, question: str) -> set[str]:
    """The capitalised words of `reply` that the question does not contain (case-insensitive),
    filler words aside: what the reply added that names something.

    >>> sorted(reply_names("The capital of Japan is Tokyo.", "Which continent has the country whose capital is Tokyo?"))
    ['japan']
    """
    asked = {w.lower() for w in _WORD.findall(question)}
    return {w.lower() for w in _WORD.findall(reply)
            if w[0].isupper() and w.lower() not in asked and w.lower() not in _FILLER}


def follow_up(question: TwoHopQuestion, prompts: Sequence[str], replies: Sequence[str]) -> FollowUp:
    """Did the second environment call use the first reply? `prompts` are the agent's interaction
    prompts in order, `replies` the environment's replies.

    Uses = the second prompt contains (as a word, case-insensitive) a capitalised word of the first
    reply that is not in the question (`reply_names`). Names the bridge = some spelling of the
    country occurs in both the first reply and the second prompt (stricter: the right entity).
    """
    calls = len(prompts)
    if calls < 2 or not replies:
        return FollowUp(calls, calls >= 2, False, False)
    second_words = {w.lower() for w in _WORD.findall(prompts[1])}
    reused = sorted(reply_names(replies[0], question.question) & second_words)
    bridge = any(mentions(replies[0], [n]) and mentions(prompts[1], [n]) for n in question.hops[0].answers)
    return FollowUp(calls, True, bool(reused), bridge, reused)


# The turn reward of the follow-up call: names the bridge, reuses a name of the first reply, neither.
NAMES_BRIDGE, USES_REPLY = 1.0, 0.5


def follow_up_turn_rewards(question, trajectory) -> list[float | None]:
    """The two-hop task's turn rewards (`reward.turn.scorer:
    prompt_r1.data.compositional:follow_up_turn_rewards`): the second agent turn, the one that
    should make the follow-up call, gets 1.0 when that call names the bridge entity the first reply
    named, 0.5 when it reuses another capitalised word of the first reply (`follow_up`), else 0.0
    (also when the turn answers or its call was never sent); every other turn is None (not judged).

    `question` is a `QuestionRow` of a generated two-hop question (found by its text; seed 0, the
    seed of `data/compositional`); any other question raises, since this task defines no turn
    reward for it. `trajectory` is the `Trajectory` (its agent turns and environment replies).
    """
    known = known_questions().get(question.question)
    if known is None:
        raise ValueError("not a generated two-hop question (prompt_r1.data.compositional defines turn rewards "
                         "only for those): train on data/compositional, or unset reward.turn.scorer")
    turns = trajectory.agent_turns
    rewards: list[float | None] = [None] * len(turns)
    if len(turns) < 2:
        return rewards
    prompts = [p for p in (parse_turn(turn).interaction_prompt for turn in turns) if p is not None]
    sent = prompts[: len(trajectory.env_replies)]   # a prompt whose reply never came was not a call that counted
    used = follow_up(known, sent, trajectory.env_replies)
    rewards[1] = NAMES_BRIDGE if used.names_bridge else USES_REPLY if used.uses_reply else 0.0
    return rewards


_KNOWN: dict[str, TwoHopQuestion] = {}


def known_questions() -> dict[str, TwoHopQuestion]:
    """`by_question(0)`, built once per process (the generator walks the whole fact table)."""
    if not _KNOWN:
        _KNOWN.update(by_question(0))
    return _KNOWN
