"""The training hooks say which minutes-long stage starts and, after every step, how long a step
takes and how long is left."""

from __future__ import annotations

import logging

import pytest

import tasks.stages as train_tasks  # imported first: Prefect's logging set-up replaces root handlers (caplog's)
from prompt_r1.training.hooks import StepResult, TrainingHooks


@pytest.mark.parametrize("first, total", [(0, 8), (3, 8), (0, 1), (5, 40)])
def test_time_left_is_the_mean_step_time_of_this_process_times_the_steps_to_go(monkeypatch, first, total):
    """A resumed run (first > 0) counts only the steps it ran; the first step's start is its rollout
    and update before the first report."""
    import prompt_r1.training.hooks as hooks_module

    clock = {"now": 1000.0}
    monkeypatch.setattr(hooks_module.time, "monotonic", lambda: clock["now"])
    hooks = TrainingHooks(total)
    durations = [100.0, 140.0, 90.0, 130.0]
    spent = 0.0
    for i, seconds in enumerate(durations):
        step = first + i
        if step >= total:
            break
        clock["now"] += seconds
        spent += seconds
        said = hooks.time_left(StepResult(step, {"rollout_time_s": seconds * 0.7, "step_time_s": seconds * 0.3}, []))
        per_step = spent / (i + 1)
        assert said == f" in {per_step:.0f} s a step, about {(total - step - 1) * per_step / 60:.0f} min left"
    assert TrainingHooks(None).time_left(StepResult(0, {}, [])) == ""


@pytest.mark.parametrize("flow", [False, True])
def test_the_minutes_long_stages_are_announced_as_they_start(monkeypatch, caplog, flow):
    """In a plain run and in the train flow (where each stage is a Prefect task, whose own log line
    says only that it finished) a rollout, update, validation or checkpoint says that it starts."""
    if flow:
        monkeypatch.setattr(train_tasks._stage, "with_options", lambda **_: (lambda fn, *args: fn(*args)))
        hooks = train_tasks.FlowTrainingHooks(4, buffer=None, ckpt_dir=None)
    else:
        hooks = TrainingHooks(4)
    with caplog.at_level(logging.INFO, logger="prompt_r1.training.hooks"):
        for name in ("next-batch", "rollout", "reward", "grpo-update", "broadcast-weights", "checkpoint"):
            assert hooks.stage(name, lambda n=name: n.upper()) == name.upper()
    said = [r.getMessage() for r in caplog.records if r.name == "prompt_r1.training.hooks"]
    assert said == ["rollout ...", "grpo-update ...", "checkpoint ..."]
