"""What every config model shares: strict pydantic models, the config error, and safe names.

"Strict" here means: an unknown key is an error, a boolean is never taken for a number
(pydantic's lax mode reads `true` as 1, so `train.lr: true` would train at lr 1.0), and no number
is infinite or NaN (YAML's `.inf`, `.nan`, `1.0e999`, the strings `inf`, `Infinity`, `nan`): an
infinite price or scale turns rewards into NaN, an infinite pool weight is never drawn. Everything
else stays lax on purpose: PyYAML reads `1e-5` (no dot) as a string, which a float field accepts.

Kept apart from the section models (`prompt_r1.config.experiment`, `prompt_r1.config.env`) so that each of
them can import these without importing the others.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator

from prompt_r1.core.failures import UserError


class StrictModel(BaseModel):
    """Base of every config section: an unknown key, a bad assigned value or a non-finite number is an
    error, never ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name and is_number_field(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, got a boolean (write the number itself, e.g. 3 or 0.5)")
        return value


def _types_of(annotation: Any) -> set[type]:
    """The plain types a field annotation admits (through Optional, unions and Annotated)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _types_of(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_types_of(a) for a in get_args(annotation)))
    if origin is Literal:
        return {type(a) for a in get_args(annotation)}
    return {annotation} if isinstance(annotation, type) else set()


def is_number_field(annotation: Any) -> bool:
    """A field that takes an int or a float and not a bool (bool is a subclass of int in Python).

    >>> is_number_field(int | None), is_number_field(float), is_number_field(bool), is_number_field(str)
    (True, True, False, False)
    """
    admitted = _types_of(annotation)
    return bool(admitted & {int, float}) and bool not in admitted


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
