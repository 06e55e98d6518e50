"""Guided exploration of the first call: a task's scaffold proposes a group member's first agent turn
(and, optionally, its follow-up turns).

GRPO can only reinforce what the policy samples. A warm start that taught one first call to loss
near 0 samples that call every time, so the group never compares another (the situation of
`../shared/research/learning-first-call.md` in this repository's shared notes: 60 of 60 first calls
pass the question on). Published fixes put off-policy members into the group (LUFFY, arXiv
2504.14945) or give an oracle prefix (POPE, arXiv 2601.18779); this is that, in general form:

- `rollout.scaffold.fn` names a function of the task, `fn(question) -> str`, that writes a whole
  first agent turn. For the last `members` group indices of every *training* group, the first turn
  is that text instead of a sample; everything after it is sampled on-policy against the real
  environment, and the reward is the real one.
- `rollout.scaffold.follow_up` optionally names `follow_up(question, replies) -> str | None`, called
  for those members after each environment reply: a later interaction turn written from what the
  replies said (the two-hop task's asks the second hop about the country the first reply named), or
  None to let the policy write it. A first call that decomposes is worth little when the policy's
  own follow-up does not know what to do with the first hop's reply; this lets the group see whole
  decomposed episodes while every later turn that is not written is sampled.
- Every member is trained on the plain prompt: the scaffold is a turn the policy is trained to
  write, never a hint in its context. The learner recomputes all log-probs itself (the scaffold's
  tokens carry no sampling log-prob, `Trajectory.scaffold_turns`), which is why a scaffold needs
  `rollout.max_staleness` 0 (refused otherwise, `RolloutConfig`).
- Validation, probes and evaluation never scaffold: only the training session asks for it
  (`scaffold=True` on the pool's rollout), and those paths assert that nothing came back
  scaffolded (`assert_unscaffolded`).
- Before training, `check_scaffold` calls the function on every training question and refuses a
  turn that names one of the question's gold answers (whole words after SQuAD normalisation), or
  one of the names the task's `rollout.scaffold.privileged` function gives for the question (the
  two-hop task's bridge country, `prompt_r1.data.first_call.two_hop_privileged`): a scaffold
  explores how to ask, never what only a reply may tell. The same check runs on every scaffolded
  turn during training; a follow-up turn may name what an earlier reply of its episode named, and
  nothing else of those (`unsaid`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prompt_r1.core.metrics import mentions
from prompt_r1.core.protocol import parse_turn
from prompt_r1.core.scorer import ScorerError, load_callable

if TYPE_CHECKING:
    from prompt_r1.core.questions import QuestionRow
    from prompt_r1.core.trajectory import Trajectory

Scaffold = Callable[["QuestionRow"], str]
FollowUpScaffold = Callable[["QuestionRow", tuple[str, ...]], "str | None"]
SETTING = "rollout.scaffold.fn"
FOLLOW_UP = "rollout.scaffold.follow_up"
PRIVILEGED = "rollout.scaffold.privileged"


class ScaffoldError(ScorerError):
    """A scaffold that cannot be loaded, fails, writes no interaction turn, or names a gold answer."""


def unsaid(names: Sequence[str], text: str | None, replies: Sequence[str] = ()) -> list[str]:
    """The names `text` says (whole words after SQuAD normalisation, `core.metrics.mentions`) that no
    reply of `replies` said: what a scaffold's turn would tell the policy that the environment did not.

    >>> unsaid(["Finland"], "On which continent is Finland?", ["Helsinki is the capital of Finland."])
    []
    >>> unsaid(["Finland"], "On which continent is Finland?")
    ['Finland']
    """
    said = [n for n in names if mentions(text or "", [n])]
    return [n for n in said if not any(mentions(reply, [n]) for reply in replies)]


def _parts(text: object) -> tuple[str, ...] | None:
    """The think and prompt text of an interaction turn, or None when `text` is not one."""
    turn = parse_turn(text) if isinstance(text, str) else None
    if turn is None or turn.kind != "interaction":
        return None
    return (turn.think or "", turn.interaction_prompt or "")


def _guard(fn: Callable, names: Callable, setting: str) -> Callable:
    """`fn` (a first-turn or follow-up scaffold) refusing a turn that says one of `names(question)` no
    reply of the episode said (a first turn has no replies)."""

    def guarded(question: QuestionRow, *replies_arg: tuple[str, ...]):
        text = fn(question, *replies_arg)
        replies = replies_arg[0] if replies_arg else ()
        parts = _parts(text)
        said = [] if parts is None else [n for part in parts for n in unsaid(names(question), part, replies)]
        if said:
            raise ScaffoldError(f"{setting} for question {question.question_id!r} names {said[0]!r}, which "
                                f"{PRIVILEGED} says it must never say before a reply does: a scaffold proposes how "
                                "to ask, never what only a reply may tell")
        return text

    guarded.__name__ = getattr(fn, "__name__", "scaffold")
    return guarded


def load_scaffold(spec: str, privileged: str | None = None, setting: str = SETTING) -> Callable:
    """The function `spec` names (`package.module:function` or `path/to/file.py:function`, resolved by
    `core.scorer.load_callable`, the one resolver of task code), or a `ScaffoldError` naming `setting`.
    With `privileged` (`rollout.scaffold.privileged`: a function of the question returning the names a
    scaffold must never say, such as the two-hop task's bridge country) the returned scaffold refuses
    a turn whose think or prompt text names one of them before a reply of its episode did. The same
    loader serves `rollout.scaffold.follow_up` (`setting=FOLLOW_UP`).

    >>> load_scaffold("prompt_r1.data.first_call:first_hop_scaffold").__name__
    'first_hop_scaffold'
    """
    fn = load_callable(spec, setting, ScaffoldError)
    if privileged is None:
        return fn
    return _guard(fn, load_callable(privileged, PRIVILEGED, ScaffoldError), setting)


def scaffold_turn(scaffold: Scaffold, question: QuestionRow, setting: str = SETTING) -> str:
    """The scaffold's first turn for `question`, checked: a string that parses as an interaction turn
    and names none of the question's golds in its think or prompt text (`core.metrics.mentions`); else
    a `ScaffoldError` naming the setting and question."""
    text = _checked(lambda: scaffold(question), question, (), setting)
    assert text is not None  # a first turn is always written (`_checked` refuses None without replies)
    return text


def follow_up_turn(follow_up: FollowUpScaffold, question: QuestionRow, replies: Sequence[str],
                   setting: str = FOLLOW_UP) -> str | None:
    """The follow-up scaffold's next turn after `replies` (the episode's environment replies so far),
    checked as a first turn is, except that it may name a gold a reply named; None: the policy
    writes that turn."""
    replies = tuple(replies)
    return _checked(lambda: follow_up(question, replies), question, replies, setting)


def _checked(write: Callable[[], object], question: QuestionRow, replies: tuple[str, ...],
             setting: str) -> str | None:
    """`write()`'s turn, or a `ScaffoldError`: the task's code failed, wrote no interaction turn, or
    named a gold answer that none of `replies` named."""
    where = f"{setting} for question {question.question_id!r} (dataset {question.dataset})"
    try:
        text = write()
    except ScaffoldError:
        raise
    except Exception as err:  # the task's own code: its failure stops the run, never a silent fallback
        raise ScaffoldError(f"{where} raised {type(err).__name__}: {err}") from err
    if text is None and replies:
        return None
    parts = _parts(text)
    if parts is None:
        raise ScaffoldError(f"{where} returned {text!r}; return a whole agent turn, "
                            "`<think>..</think><interaction_prompt>..</interaction_prompt>`"
                            + (" (or None to let the policy write it)" if replies else ""))
    if any(unsaid(question.golds, part, replies) for part in parts):
        raise ScaffoldError(f"{where} names a gold answer of the question in {text!r}"
                            + (" that no reply named" if replies else "")
                            + "; a scaffold may propose how to ask, never the answer")
    return text


def check_scaffold(scaffold: Scaffold, questions: Sequence[QuestionRow], setting: str = SETTING) -> int:
    """`scaffold_turn` on every question (before any model loads); returns how many it checked."""
    for question in questions:
        scaffold_turn(scaffold, question, setting)
    return len(questions)


def scaffolded_members(group_size: int, members: int) -> range:
    """The group indices whose first turn the scaffold writes: the last `members` of the group.

    >>> list(scaffolded_members(8, 3))
    [5, 6, 7]
    """
    return range(group_size - members, group_size)


def assert_unscaffolded(trajectories: Sequence[Trajectory], where: str) -> None:
    """Validation, probes and evaluation measure the policy alone: a scaffolded trajectory there is a bug."""
    scaffolded = [t.question_id for t in trajectories if t.scaffold_turns]
    if scaffolded:
        raise AssertionError(f"{where}: {len(scaffolded)} trajectory(ies) came back scaffolded (question "
                             f"{scaffolded[0]!r}); scaffolds run in training rollouts only")
