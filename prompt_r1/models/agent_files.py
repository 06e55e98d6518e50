"""The files that mark an agent folder, and the error for a spec that names none: shared by the
resolver, the export and the adapter merge, below all three.

Why its own module: the resolver merges an adapter folder (`models.adapter`) through the export
(`models.export`), and both need these names; defined in the resolver they would import it back.
"""

from __future__ import annotations

import re
from pathlib import Path

from prompt_r1.core.failures import UserError

# The training config an exported agent carries (`export_checkpoint` copies its checkpoint's
# `config.yaml` here), so it travels with the agent: to the registry, to another machine.
TRAINING_CONFIG = "prompt-r1-training-config.yaml"
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's: marks a LoRA adapter folder (a checkpoint's, or a kept one)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


class AgentSpecError(UserError, ValueError):
    """A spec that names no usable agent; the message says what was tried and what to pass."""


# files only a checkpoint of ours holds beside its `config.yaml` (`learner.checkpoint`: the manifest,
# and the trainer state of checkpoints written before it); another tool's output folder may hold a
# `config.yaml` of its own
CHECKPOINT_MARKERS = ("manifest.json", "trainer_state.pt")


def training_config_file(agent: Path | str) -> Path | None:
    """The config the agent in folder `agent` was trained with: the `TRAINING_CONFIG` an export
    carries, or a checkpoint folder's own `config.yaml`; None for a model no training run of this
    project wrote (a bundled or hub model, an export made before exports carried their config, a
    folder whose `config.yaml` some other tool wrote, as axolotl's outputs do).

    >>> training_config_file("org/name") is None
    True
    """
    folder = Path(agent)
    if (folder / TRAINING_CONFIG).is_file():
        return folder / TRAINING_CONFIG
    if (folder / "config.yaml").is_file() and any((folder / marker).is_file() for marker in CHECKPOINT_MARKERS):
        return folder / "config.yaml"
    return None
