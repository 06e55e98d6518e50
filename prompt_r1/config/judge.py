"""Settings of an LLM judge (`data.judges[]`): a rubric prompt and the judge's own environment.

A dataset whose `scorer` is `judge:<name>` (or `judge`, the judge named `judge`) is scored by
sending the rubric, filled with the question, the gold answer(s) and the agent's answer, to the
judge's environment and reading a score in [0, 1] from its verdict (`prompt_r1.data.judge`). The
judge is an environment like any other (`EnvConfig`: model, kind, sampling, retries, deadlines,
cache, prices), so it is called through the same client, and its settings are part of the run's
identity: a changed rubric or judge model is a different run, never a silent resume.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from prompt_r1.config.base import SafeName, StrictModel
from prompt_r1.config.env import EnvConfig

JUDGE_PREFIX = "judge:"
DEFAULT_JUDGE = "judge"
PLACEHOLDERS = ("question", "golds", "response")

DEFAULT_RUBRIC = """\
You are grading a response to a task against a reference answer.

Task: {question}

Reference answer: {golds}

Response: {response}

How well does the response do the task, compared with the reference? Give a score from 0 to 10.
Reply with one line and nothing else, in the form: Score: N/10"""


def default_judge_environment() -> EnvConfig:
    """The bundled SmolLM2 in this process, greedy, a short verdict, no system message."""
    return EnvConfig(name="judge", kind="inprocess", model="smollm2-135m-instruct", system_prompt=None,
                     max_tokens=16, temperature=0.0)


class JudgeConfig(StrictModel):
    """One LLM judge: its name (`scorer: judge:<name>`), rubric and environment."""

    name: SafeName = Field(DEFAULT_JUDGE, description="What a dataset's `scorer` names: `judge:<name>` (`judge` alone "
                           "= `judge:judge`).")
    rubric: str = Field(
        DEFAULT_RUBRIC, min_length=1,
        description="The prompt sent to the judge as one user message: `{question}`, `{golds}` (the gold answers, "
        "one per line; `(none)` without any) and `{response}` (the agent's answer; required) are filled in, other "
        "text is sent as written. The verdict must state `Score: N/M` (0 <= N <= M), `Score: x` with x in [0, 1], "
        "or be a bare number in [0, 1]; anything else is a failed judgement, never a 0.")
    environment: EnvConfig = Field(
        default_factory=default_judge_environment,
        description="The judge's own environment (every key of `environment`): model, kind, sampling (keep "
        "`temperature` 0), `max_tokens`, retries, deadlines, `cache` and prices. Its `max_error_rate` is the "
        "largest share of a batch's judgements that may fail (a call that fails, a verdict that cannot be read) "
        "before the run stops.")

    @model_validator(mode="after")
    def _rubric_takes_the_response(self) -> "JudgeConfig":
        if "{response}" not in self.rubric:
            raise ValueError(f"judge `{self.name}`: the rubric has no `{{response}}`, so the judge would never see the "
                             "answer it scores; put {response} where the answer goes")
        return self


def judge_name(spec: str) -> str | None:
    """The judge a scorer spec names, or None for a spec that is not a judge.

    >>> judge_name("judge"), judge_name("judge:strict"), judge_name("pkg.mod:fn")
    ('judge', 'strict', None)
    """
    if spec == DEFAULT_JUDGE:
        return DEFAULT_JUDGE
    if spec.startswith(JUDGE_PREFIX):
        return spec[len(JUDGE_PREFIX):]
    return None
