"""Who else sees a finished `ask` / `serve` episode: functions registered with
`observe_episodes`, called by `report_episode` when the caller asked for it (`--trace`).

This is how the `prompt-r1` entry point (`flows.cli`) logs those episodes as MLflow traces while
the library knows nothing of MLflow. Light on purpose (no torch): the CLI registers at start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prompt_r1.config.env import EnvConfig
    from prompt_r1.config.experiment import Config
    from prompt_r1.core.trajectory import Trajectory

log = logging.getLogger(__name__)

# (source, cfg, env_cfg, question, trajectory) -> None; source is "ask" or "serve"
EpisodeObserver = Callable[[str, "Config", "EnvConfig", str, "Trajectory"], None]
_observers: list[EpisodeObserver] = []


def observe_episodes(observer: EpisodeObserver) -> None:
    """Have `observer` called by `report_episode` (once, however often it is registered)."""
    if observer not in _observers:
        _observers.append(observer)


def report_episode(source: str, cfg: "Config", env_cfg: "EnvConfig", question: str, traj: "Trajectory") -> int:
    """Hand one finished episode, failed or not, to every observer; returns how many took it.
    An observer that raises is logged and skipped: showing an episode never fails answering it.

    >>> seen = []
    >>> def boom(*args): raise OSError("disk full")
    >>> observe_episodes(lambda source, *rest: seen.append(source)); observe_episodes(boom)
    >>> report_episode("ask", None, None, "q?", None), seen
    (1, ['ask'])
    >>> _observers.clear()
    """
    taken = 0
    for observer in list(_observers):
        try:
            observer(source, cfg, env_cfg, question, traj)
            taken += 1
        except Exception as err:  # noqa: BLE001 - see the docstring
            log.warning("episode observer %s failed: %s: %s", getattr(observer, "__name__", observer),
                        type(err).__name__, err)
    return taken
