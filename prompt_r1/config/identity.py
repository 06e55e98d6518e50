"""Which settings identify a run: the rule of `Config.hash`, stated on each field.

A run's hash names what it computes, so that `--resume` continues a run only under the same
settings. Each field says its part in it with one keyword, `json_schema_extra`:

- nothing: part of the run's identity (most fields);
- `layout()`: never part of it. The field says how the same update is computed or where things
  run (learner ranks and their placement, deadlines, logits in chunks, packed micro-batches,
  where evaluation's engines run, a GPU share, actor restarts, the tracking server), so a run
  resumes with another layout as the same run;
- `when_set()`: part of it only while the field differs from its default. Fields added after runs
  were recorded carry it, so that those runs, whose configs hold the default, keep their hash;
- `when_set(by="key")`, on a section: the whole section is part of the identity only while its
  field `key` differs from its default (`reward.cost` while `mode` is not `off`, `reward.turn`
  while `scorer` is set, `rollout.scaffold` while `fn` is set). Such a section is off at that
  default, and its other fields then change nothing a run computes.

The keyed form is the one conditional rule the hash has needed, so it is a keyword here rather
than a list of exceptions kept elsewhere. A new field that must not change recorded runs' hashes
takes `json_schema_extra=when_set()`; nothing else needs editing.

`identity_data` applies the rule in one walk over the models: nested sections, lists of models
(`train.environments`, `data.sources` entries) and dicts of models. `docs/config.md` prints each
key's rule (`rule_text`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

KEY = "identity"  # the json_schema_extra entry that holds a field's rule
BY = "identity_by"  # a section's deciding field, with `when set`
IDENTITY, LAYOUT, WHEN_SET = "identity", "layout", "when set"


def layout() -> dict[str, str]:
    """`Field(..., json_schema_extra=layout())`: never part of the run's identity."""
    return {KEY: LAYOUT}


def when_set(by: str | None = None) -> dict[str, str]:
    """`Field(..., json_schema_extra=when_set())`: part of the run's identity only while the field
    differs from its default; `by="key"` on a section: while the section's field `key` does."""
    return {KEY: WHEN_SET, BY: by} if by else {KEY: WHEN_SET}


def rule_of(field: FieldInfo) -> tuple[str, str | None]:
    """(rule, deciding field) of a field: `identity`, `layout` or `when set`."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get(KEY, IDENTITY)), extra.get(BY)  # type: ignore[return-value]


def default_of(field: FieldInfo) -> Any:
    """The value a field holds when a config leaves it out."""
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return None if field.default is PydanticUndefined else field.default


def _at_default(model: BaseModel, name: str, by: str | None) -> bool:
    """Whether field `name` of `model` (or, with `by`, that section's field `by`) holds its default."""
    if by is None:
        return getattr(model, name) == default_of(type(model).model_fields[name])
    section = getattr(model, name)
    return getattr(section, by) == default_of(type(section).model_fields[by])


def identity_data(model: BaseModel) -> dict[str, Any]:
    """`model` dumped as JSON data, less what is not part of the run's identity (the rule above)."""
    data = model.model_dump(mode="json")
    _strip(model, data)
    return data


def _strip(model: BaseModel, data: dict[str, Any]) -> None:
    """Remove from `data` (the dump of `model`) each key its field's rule leaves out, then do the
    same inside every nested model. A key the dump lacks is skipped."""
    for name, field in type(model).model_fields.items():
        if name not in data:
            continue
        rule, by = rule_of(field)
        if rule == LAYOUT or (rule == WHEN_SET and _at_default(model, name, by)):
            del data[name]
            continue
        for value, dumped in _models_in(getattr(model, name), data[name]):
            _strip(value, dumped)


def _models_in(value: Any, dumped: Any) -> Iterator[tuple[BaseModel, dict[str, Any]]]:
    """The models in a field's value beside their dumps: the value itself, list entries, dict values."""
    if isinstance(value, BaseModel):
        yield value, dumped
    elif isinstance(value, (list, tuple)):
        for item, item_dump in zip(value, dumped):
            if isinstance(item, BaseModel):
                yield item, item_dump
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, BaseModel):
                yield item, dumped[key]


def layout_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted keys of the fields (and sections) that are layout, through nested sections:
    `train.world_size`, `tracking`, ...; a section's keys all start with its path and a dot."""
    for name, field in model.model_fields.items():
        if rule_of(field)[0] == LAYOUT:
            yield prefix + name
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from layout_paths(field.annotation, f"{prefix}{name}.")


def rule_text(field: FieldInfo, section_layout: bool = False) -> str:
    """A field's rule as `docs/config.md` prints it: `yes`, `layout` or `when set`."""
    rule, by = rule_of(field)
    if section_layout or rule == LAYOUT:
        return "layout"
    if rule == WHEN_SET:
        return f"when `{by}` is set" if by else "when set"
    return "yes"
