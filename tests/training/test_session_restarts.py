"""Rollout-actor restarts reach MLflow once each: a step's metrics and a validation's report the
restarts since the previous report (`TrainingSession.restarts_since_report`), so one that happens
in the last validation, after the last step, is counted too."""

from __future__ import annotations

import random
from types import SimpleNamespace

from prompt_r1.training.session import TrainingSession


def test_every_restart_is_reported_once_whatever_the_order_of_restarts_and_reports():
    for seed in range(200):
        rng = random.Random(seed)
        session = SimpleNamespace(pool=SimpleNamespace(restarts=0), _restarts_reported=0)
        reported, since_last = [], 0
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.4:
                died = rng.randint(1, 3)
                session.pool.restarts += died
                since_last += died
            else:
                reported.append(TrainingSession.restarts_since_report(session))
                assert reported[-1] == since_last  # what died since the previous report, no more
                since_last = 0
        reported.append(TrainingSession.restarts_since_report(session))
        assert sum(reported) == session.pool.restarts and all(isinstance(r, float) for r in reported)
