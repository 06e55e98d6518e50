"""The default training hooks say, after every step, how long a step takes and how long is left."""

from __future__ import annotations

import pytest

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
