"""Guided exploration of the first call: a task's scaffold proposes a group member's first agent turn.

GRPO can only reinforce what the policy samples. A warm start that taught one first call to loss
near 0 samples that call every time, so the group never compares another (the situation of
`../shared/research/learning-first-call.md` in this repository's shared notes: 60 of 60 first calls
pass the question on). Published fixes put off-policy members into the group (LUFFY, arXiv
2504.14945) or give an oracle prefix (POPE, arXiv 2601.18779); this is that, in general form:

- `rollout.scaffold.fn` names a function of the task, `fn(question) -> str`, that writes a whole
  first agent turn. For the last `members` group indices of every *training* group, the first turn
  is that text instead of a sample; everything after it is sampled on-policy against the real
  environment, and the reward is the real one.
- Every member is trained on the plain prompt: the scaffold is a turn the policy is trained to
  write, never a hint in its context. The learner recomputes all log-probs itself (the scaffold's
  tokens carry no sampling log-prob, `Trajectory.scaffold_tokens`), which is why a scaffold needs
  `rollout.max_staleness` 0 (refused otherwise, `RolloutConfig`).
- Validation, probes and evaluation never scaffold: only the training session asks for it
  (`scaffold=True` on the pool's rollout), and those paths assert that nothing came back
  scaffolded (`assert_unscaffolded`).
- Before training, `check_scaffold` calls the function on every training question and refuses a
  turn that names one of the question's gold answers (whole words after SQuAD normalisation), or
  one of the names the task's `rollout.scaffold.privileged` function gives for the question (the
  two-hop task's bridge country, `prompt_r1.data.first_call.two_hop_privileged`): a scaffold
  explores how to ask, never what only a reply may tell. The same check runs on every scaffolded
  turn during training.
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
SETTING = "rollout.scaffold.fn"
PRIVILEGED = "rollout.scaffold.privileged"


class ScaffoldError(ScorerError):
    """A scaffold that cannot be loaded, fails, writes no interaction turn, or names a gold answer."""


def load_scaffold(spec: str, privileged: str | None = None, setting: str = SETTING) -> Scaffold:
    """The function `spec` names (`package.module:function` or `path/to/file.py:function`, resolved by
    `core.scorer.load_callable`, the one resolver of task code), or a `ScaffoldError` naming `setting`.
    With `privileged` (`rollout.scaffold.privileged`: a function of the question returning the names a
    scaffold must never say, such as the two-hop task's bridge country) the returned scaffold refuses
    a turn whose think or prompt text names one of them.

    >>> load_scaffold("prompt_r1.data.first_call:first_hop_scaffold").__name__
    'first_hop_scaffold'
    """
    fn = load_callable(spec, setting, ScaffoldError)
    if privileged is None:
        return fn
    names = load_callable(privileged, PRIVILEGED, ScaffoldError)

    def guarded(question: QuestionRow) -> str:
        text = fn(question)
        turn = parse_turn(text) if isinstance(text, str) else None
        said = [n for n in names(question) if turn is not None
                and any(mentions(part or "", [n]) for part in (turn.think, turn.interaction_prompt))]
        if said:
            raise ScaffoldError(f"{setting} for question {question.question_id!r} names {said[0]!r}, which "
                                f"{PRIVILEGED} says it must never say: a scaffold proposes how to ask, never what "
                                "only a reply may tell")
        return text

    guarded.__name__ = getattr(fn, "__name__", "scaffold")
    return guarded


def scaffold_turn(scaffold: Scaffold, question: QuestionRow, setting: str = SETTING) -> str:
    """The scaffold's first turn for `question`, checked: a string that parses as an interaction turn
    and names none of the question's golds in its think or prompt text (`core.metrics.mentions`); else a `ScaffoldError` naming the setting and question."""
    where = f"{setting} for question {question.question_id!r} (dataset {question.dataset})"
    try:
        text = scaffold(question)
    except ScaffoldError:
        raise
    except Exception as err:  # the task's own code: its failure stops the run, never a silent fallback
        raise ScaffoldError(f"{where} raised {type(err).__name__}: {err}") from err
    turn = parse_turn(text) if isinstance(text, str) else None
    if turn is None or turn.kind != "interaction":
        raise ScaffoldError(f"{where} returned {text!r}; return a whole first agent turn, "
                            "`<think>..</think><interaction_prompt>..</interaction_prompt>`")
    if any(mentions(part or "", question.golds) for part in (turn.think, turn.interaction_prompt)):
        raise ScaffoldError(f"{where} names a gold answer of the question in {text!r}; a scaffold may propose how "
                            "to ask, never the answer")
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
    scaffolded = [t.question_id for t in trajectories if t.scaffold_tokens]
    if scaffolded:
        raise AssertionError(f"{where}: {len(scaffolded)} trajectory(ies) came back scaffolded (question "
                             f"{scaffolded[0]!r}); scaffolds run in training rollouts only")
