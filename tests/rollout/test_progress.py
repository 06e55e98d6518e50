"""A rollout says how far it has got (`prompt_r1.rollout.progress`): plain lines with done/total
and the elapsed time every ~10 s where stderr is no terminal, a tqdm bar where it is one; and the
rollout loop advances it exactly once per trajectory, however the trajectory ends (an answer, the
turn limit, a failed environment call)."""

from __future__ import annotations

import io
import re

import pytest

from prompt_r1.config.experiment import AgentConfig, RewardConfig, RolloutConfig
from prompt_r1.rollout.episode import run_rollout
from prompt_r1.rollout.progress import RolloutProgress
from tests.rollout.test_rollout import ANSWER, ASK, ScriptedEnv, ScriptedPolicy, question

LINE = re.compile(r"^(.+): (\d+)/(\d+) trajectories done, (\d+) s$")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("total, gaps", [
    (5, [1.0] * 5),                     # done within 10 s: nothing written
    (40, [3.0] * 40),                   # 2 minutes: a line about every 10 s, and the last
    (12, [0.0] * 11 + [60.0]),          # one straggler: a line at the end only
    (6, [25.0, 0.0, 0.0, 25.0, 0.0, 0.0]),
])
def test_plain_lines_every_ten_seconds_with_done_total_and_elapsed(total, gaps):
    clock, out = Clock(), io.StringIO()
    progress = RolloutProgress(total, "rollout step 7", stream=out, clock=clock)
    expected, last = [], 100.0
    for done, gap in enumerate(gaps, start=1):
        clock.now += gap
        progress.advance()
        if clock.now - last >= 10.0:  # restated: a line when 10 s passed since the last (or the start)
            expected.append((done, clock.now - 100.0))
            last = clock.now
    progress.close()
    if expected and expected[-1][0] != total:
        expected.append((total, clock.now - 100.0))
    lines = out.getvalue().splitlines()
    got = [LINE.match(line) for line in lines]
    assert all(got), lines
    assert [(int(m[2]), float(m[4])) for m in got] == [(d, round(s)) for d, s in expected]
    assert all(m[1] == "rollout step 7" and int(m[3]) == total for m in got)
    assert "\r" not in out.getvalue()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_tqdm_bar_on_the_stream_it_was_given():
    out = Terminal()
    with RolloutProgress(3, "rollout step 1", stream=out, bar_interval_s=0) as progress:
        for _ in range(3):
            progress.advance()
    text = out.getvalue()
    assert "\r" in text and "rollout step 1" in text and "3/3" in text
    assert "trajectories done" not in text  # the bar, not the lines


def test_the_rollout_loop_advances_once_per_trajectory_however_it_ends(tokenizer):
    def reply(messages, turn):
        if "Hamlet" in messages[-1]["content"]:
            raise ConnectionError("server down")
        return "fine"

    # q0 answers after one call, q1's call fails, q2 keeps asking until the turn limit
    script = lambda text, n: (ANSWER if n >= 1 and "France" in text else
                              ASK.format(n=n, q=text.split("Question: ")[1].split("\n")[0]))
    questions = [question(0), question(1, "Who wrote Hamlet?"), question(2, "Why is the sky blue?")]
    counted = []

    class Counting(RolloutProgress):
        def advance(self, n: int = 1) -> None:
            counted.append(n)
            super().advance(n)

    out = io.StringIO()
    progress = Counting(6, "rollout step 0", stream=out)
    trajs = run_rollout(ScriptedPolicy(tokenizer, script), ScriptedEnv(reply), questions,
                        AgentConfig(max_new_tokens=64, max_response_tokens=1024, max_env_reply_tokens=256),
                        RolloutConfig(group_size=2, max_turns=3), RewardConfig(), seed=0, progress=progress)
    assert sorted({t.stop_reason for t in trajs}) == ["answered", "env_error", "max_turns"]
    assert len(counted) == len(trajs) == 6 and progress.done == 6


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)
