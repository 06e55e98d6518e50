"""What every config model shares: strict pydantic models, the config error, and safe names.

Kept apart from the section models (`prompt_r1.config.experiment`, `prompt_r1.config.env`) so that each of
them can import these without importing the others.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from prompt_r1.core.failures import UserError


class StrictModel(BaseModel):
    """Base of every config section: an unknown key or a bad assigned value is an error, never ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(UserError, ValueError):
    """A config file that cannot be used; the message names the file and the key."""


SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _safe_name(value: str) -> str:
    """Names become folder and file names (`runs/NAME/...`, report files), so they must be one
    plain path segment: no `/`, no `..`, no leading dot or dash."""
    if not SAFE_NAME.match(value):
        raise ValueError("must be 1-64 characters of letters, digits, `.`, `_` or `-`, starting with a "
                         "letter or digit (it becomes a folder name), e.g. `my-run.v2`")
    return value


SafeName = Annotated[str, AfterValidator(_safe_name)]
