"""The soak's fault plan: which fault, when and for how long, drawn from one seed.

Pure data, so a plan can be printed, recorded beside the results and checked without running
anything: the same (seed, minutes) always gives the same plan. Faults are placed at uniform
random moments and may overlap; the first kill of a Ray actor is moved into the first window in
which the environment is slow, since "a Ray worker dies while the environment is slow" is the
case the issue names and chance alone may not produce it in a short run.

Kinds (what `faults` does for each):
- `env_fail`, `env_slow`, `env_malformed`: a window of 5xx/429 replies, added latency with some
  replies that hang past the client's timeout, or truncated JSON bodies, from the fault proxy;
- `rollout_actor`: kill -9 of a rollout actor's process (Ray restarts it);
- `learner`: kill -9 of the learner (a Ray learner rank, or the flow-run process that holds the
  learner when `train.world_size` is 1);
- `server_restart`: the Prefect server stopped, and started again after the window;
- `worker_kill`: kill -9 of the Prefect worker, started again after the window;
- `disk_full`: the run folders' filesystem full (or a file-size limit) for the window;
- `mlflow_lock`: another process holds an exclusive write transaction on `mlflow.db`.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

KINDS = ("env_fail", "env_slow", "env_malformed", "rollout_actor", "learner", "server_restart", "worker_kill",
         "disk_full", "mlflow_lock")
ENV_KINDS = ("env_fail", "env_slow", "env_malformed")
# window length (seconds) of each kind, low and high; kills are instantaneous, a restart's window is
# how long the service stays down
WINDOW_S = {"env_fail": (20, 60), "env_slow": (30, 90), "env_malformed": (20, 60), "rollout_actor": (0, 0),
            "learner": (0, 0), "server_restart": (5, 20), "worker_kill": (3, 15), "disk_full": (30, 60),
            "mlflow_lock": (10, 30)}
MINUTES_PER_FAULT = 20  # each kind comes once per this many minutes of soak, at least once


@dataclass(frozen=True)
class Fault:
    at_s: float        # seconds after the schedule starts
    kind: str
    duration_s: float  # 0 for a kill

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s


def make_plan(seed: int, minutes: float, warmup_s: float = 60.0, tail_s: float = 60.0) -> list[Fault]:
    """Faults for a soak of `minutes`, none in the first `warmup_s` (the first run starts) or the
    last `tail_s` (so the last faults' effects land while runs are still counted); sorted by time.

    >>> plan = make_plan(0, 10)
    >>> plan == make_plan(0, 10), sorted({f.kind for f in plan}) == sorted(KINDS)
    (True, True)
    >>> all(60 <= f.at_s <= 540 for f in plan), plan == sorted(plan, key=lambda f: f.at_s)
    (True, True)
    >>> len(make_plan(0, 60)) == 3 * len(KINDS)
    True
    """
    rng = random.Random(f"soak-plan:{seed}")
    span = max(minutes * 60 - warmup_s - tail_s, 1.0)
    count = max(1, round(minutes / MINUTES_PER_FAULT))
    faults = []
    for kind in KINDS:
        for _ in range(count):
            low, high = WINDOW_S[kind]
            faults.append(Fault(round(warmup_s + rng.uniform(0, span), 1), kind, round(rng.uniform(low, high), 1)))
    slow = next((f for f in sorted(faults, key=lambda f: f.at_s) if f.kind == "env_slow"), None)
    kill = next((f for f in sorted(faults, key=lambda f: f.at_s) if f.kind == "rollout_actor"), None)
    if slow is not None and kill is not None:  # one actor dies while the environment is slow
        faults[faults.index(kill)] = Fault(round(slow.at_s + slow.duration_s / 2, 1), kill.kind, 0.0)
    return sorted(faults, key=lambda f: (f.at_s, f.kind))


def overlapping(plan: list[Fault]) -> list[tuple[Fault, Fault]]:
    """Pairs of faults whose windows overlap (a kill overlaps the window it falls in).

    >>> overlapping([Fault(0, "env_slow", 10), Fault(5, "rollout_actor", 0), Fault(20, "learner", 0)])
    [(Fault(at_s=0, kind='env_slow', duration_s=10), Fault(at_s=5, kind='rollout_actor', duration_s=0))]
    """
    ordered = sorted(plan, key=lambda f: f.at_s)
    return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:] if b.at_s <= a.end_s]


def to_json(plan: list[Fault]) -> str:
    return json.dumps([asdict(f) for f in plan], indent=1)
