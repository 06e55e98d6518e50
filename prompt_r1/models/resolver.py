"""The one place that turns an agent spec (what a user types after `--agent`) into a model folder.

A spec is, in this order:
- a registry URI `models:/NAME@alias` or `models:/NAME/VERSION`: resolved by the function a
  higher layer installed with `register_scheme("models", fn)`. The library knows nothing of
  MLflow, so the tracking layer plugs it in (`tasks.tracking.registry.install_registry_resolver`, and the
  `prompt-r1` entry point in `flows.cli`); imports stay downward (flows -> tasks -> prompt_r1);
- a bundled model name from `prompt_r1.models.bundled` (`tiny-protocol`, `smollm2-135m-protocol`, ...);
- a folder: a HF model folder (config.json), a training run folder (its exported `agent/`), or a
  LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`, as `prompt-r1 export
  --adapter-only` keeps one, or a LoRA checkpoint): merged into its base, see below;
- a training run id: the run folder `runs_home()/<config>/<run_id>/`, then as above. The CLI
  and the flows name runs alike (32 hex digits, MLflow's run id shape), so one lookup finds both;
- a Hugging Face hub id `org/name` that is none of the above (e.g. paper.yaml's `Qwen/Qwen3-4B`):
  returned as the string, for transformers/vLLM to download (needs the hub).

An adapter is a few MiB, so an experiment keeps it (not the merged model) and any machine rebuilds
the agent from it (`prompt_r1.models.adapter`). Its base is the `base_model_name_or_path` of its
`adapter_config.json`, which a kept adapter writes portably: the bundled model's name when the run
trained from a bundled model (its `agent.model`, or the path of a bundled model's folder), else what
the run trained from as it was (a hub id stays a hub id; a folder path). Here the base resolves as
`agent.model` would: a bundled name through `resolve_model` (built if needed), a folder only if it
exists, a hub id as a hub id; a base found nowhere is an `AgentSpecError` naming the adapter folder,
the base and how to point it elsewhere. The merged agent (base + adapter, the tokenizer, the
training config the adapter carries) is cached under the models home, keyed by a hash of the
adapter's files and the base's identity, built atomically and reused.

`resolve_agent(None, default_model=..., cfg=...)` is the default agent: the config's champion
(`models:/<registered model>@champion`, the config's `Config.registered_model()`, by default
`prompt-r1-<config name>`; one registered model a config, so one task's agent never answers for
another) when a registry is installed and holds one, else `default_model` (usually the config's
`agent.model`). A config's `tracking.uri` is handed to the registry's resolver as its second
argument, so the champion is looked up where that config registers. `resolve_agents` applies it to evaluation's labelled
agents (`eval.agent_checkpoints`, `--agent LABEL=SPEC`). `training_config_file` finds the config a
resolved agent was trained with (evaluation reads its training pool to mark held-out environments).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prompt_r1.config.run_home import runs_home
from prompt_r1.config.base import SAFE_NAME
from prompt_r1.config.tracking import champion_uri, default_registered_model
from prompt_r1.models.agent_files import ADAPTER_CONFIG, HUB_ID, AgentSpecError
from prompt_r1.models.bundled import BUNDLED_NAMES

if TYPE_CHECKING:
    from prompt_r1.config.experiment import Config

log = logging.getLogger(__name__)

BUNDLED = BUNDLED_NAMES
# Files that mark a folder under the run home as a training run (not the model cache or registry).
RUN_MARKERS = ("run.json", "agent", "checkpoints")
# scheme -> function(uri[, tracking uri]) returning the local agent folder, or None when the
# registry lacks it; the second argument comes only from a config that sets `tracking.uri`.
SchemeResolver = Callable[..., "Path | None"]
_schemes: dict[str, SchemeResolver] = {}


def accepted_forms() -> str:
    """The spec forms, for error messages."""
    return (f"a bundled model ({', '.join(BUNDLED)}), a folder (HF model, LoRA adapter or training run), a training "
            f"run id (a folder {runs_home()}/<config>/<run id>), a registry URI (models:/prompt-r1-<config>@champion, "
            "models:/prompt-r1-<config>/VERSION), or a Hugging Face hub id (org/name)")


def register_scheme(scheme: str, resolver: SchemeResolver) -> None:
    """Let `scheme:/...` specs resolve through `resolver` (installed by a higher layer)."""
    _schemes[scheme] = resolver


def _lookup(scheme: str, spec: str, tracking: str | None) -> "Path | None":
    return _schemes[scheme](spec, tracking) if tracking else _schemes[scheme](spec)


def config_champion(cfg: "Config | None" = None, config_name: str | None = None) -> str | None:
    """The champion URI a config's default agent is: `cfg`'s registered model, else the default
    registered model of `config_name`; None without either.

    >>> config_champion(config_name="demo")
    'models:/prompt-r1-demo@champion'
    """
    if cfg is not None:
        return champion_uri(cfg.registered_model())
    return champion_uri(default_registered_model(config_name)) if config_name else None


def spec_scheme(spec: str) -> str | None:
    """The URI scheme of a spec, or None for names, folders and run ids.

    >>> spec_scheme("models:/prompt-r1-agent@champion"), spec_scheme("runs/smoke/x"), spec_scheme("tiny")
    ('models', None, None)
    """
    head, sep, _ = spec.partition(":/")
    return head if sep and head.isidentifier() and len(head) > 1 else None


def spec_label(spec: str) -> str:
    """The evaluation label of an unlabelled spec (it names the method `agent:<label>`).

    >>> [spec_label(s) for s in ["runs/smoke/abc/agent/", "tiny", "models:/prompt-r1-agent@champion",
    ...                          "models:/prompt-r1-agent/3"]]
    ['agent', 'tiny', 'champion', 'v3']
    """
    if spec_scheme(spec) is not None:
        name, _, alias = spec.partition(":/")[2].partition("@")
        return alias or f"v{name.rpartition('/')[2]}"
    return Path(spec).name or spec


def split_label(item: str) -> tuple[str | None, str]:
    """`LABEL=SPEC` -> (LABEL, SPEC); anything else -> (None, item): a text before the first `=`
    that is not a plain label is part of a bare spec (a folder name may hold `=`).

    >>> split_label("shipped=runs/x"), split_label("base"), split_label("x/a=b")
    (('shipped', 'runs/x'), (None, 'base'), (None, 'x/a=b'))
    """
    label, sep, spec = item.partition("=")
    return (label, spec) if sep and SAFE_NAME.match(label) else (None, item)


def parse_labelled_specs(items: Iterable[str]) -> dict[str, str]:
    """`--agent` values: `LABEL=SPEC`, or a bare SPEC labelled by `spec_label`.

    A value whose text before the first `=` is not a plain label is a bare spec (a folder name
    may hold `=`).

    >>> parse_labelled_specs(["trained=runs/smoke/abc", "tiny-protocol", "x/a=b"])
    {'trained': 'runs/smoke/abc', 'tiny-protocol': 'tiny-protocol', 'a=b': 'x/a=b'}
    >>> parse_labelled_specs(["trained="])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    AgentSpecError: --agent 'trained=': no spec after `trained=`; give LABEL=SPEC or SPEC, ...
    """
    out: dict[str, str] = {}
    for item in items:
        label, spec = split_label(item)
        if label is None:
            label, spec = spec_label(item), item
        if not spec:
            raise AgentSpecError(f"--agent {item!r}: no spec after `{label}=`; give LABEL=SPEC or SPEC, "
                                 f"where SPEC is {accepted_forms()}")
        out[label] = spec
    return out


def _model_folder(folder: Path, spec: str, merge_adapter: bool = True) -> Path:
    """The HF folder inside `folder`: itself, a run folder's exported agent, or an adapter folder
    merged into its base (`merge_adapter=False`: the adapter folder itself, once its base is found)."""
    if (folder / "config.json").is_file():
        return folder.resolve()
    if (folder / ADAPTER_CONFIG).is_file():
        from prompt_r1.models import adapter  # torch only where an adapter is merged

        return adapter.merged_agent(folder, spec) if merge_adapter else adapter.check_adapter(folder, spec)
    if (folder / "agent" / "config.json").is_file():
        return (folder / "agent").resolve()
    if (folder / "checkpoints").is_dir():
        raise AgentSpecError(
            f"agent {spec!r}: run folder {folder} has no exported agent (`agent/`); the run has not "
            f"finished. Export a checkpoint first: prompt-r1 export {folder}/checkpoints/step-N DIR")
    raise AgentSpecError(f"agent {spec!r}: folder {folder} is neither a HF model folder (no config.json), "
                         f"a LoRA adapter folder (no {ADAPTER_CONFIG}) nor a training run folder (no agent/ or "
                         "checkpoints/)")


def find_run(run_id: str, config_name: str | None = None, home: Path | None = None) -> Path | None:
    """The folder of training run `run_id` under the run home (any config, or `config_name`'s).

    Only folders that hold a run (`run.json`, `agent/` or `checkpoints/`) count, so a model
    cached under `runs/models/` is never taken for a run.
    """
    if not SAFE_NAME.match(run_id):
        return None
    home = home or runs_home()
    names = [config_name] if config_name else sorted(p.name for p in home.iterdir() if p.is_dir()) \
        if home.is_dir() else []
    found = [home / n / run_id for n in names
             if any((home / n / run_id / marker).exists() for marker in RUN_MARKERS)]
    if len(found) > 1:
        raise AgentSpecError(f"run id {run_id!r} exists under several configs ({', '.join(str(f) for f in found)}); "
                             "pass the run folder instead")
    return found[0] if found else None


def resolve_agent(spec: str | None, default_model: str | None = None, config_name: str | None = None,
                  merge_adapter: bool = True, cfg: "Config | None" = None) -> Path | str:
    """The local HF folder of the agent `spec` names, or a hub id as given (see the module
    docstring for the forms). `merge_adapter=False` returns an adapter folder as it is, once its base
    is found (a check: merging takes a while). `cfg` (or `config_name`) picks the champion taken when
    `spec` is empty and the registry `models:/` specs are looked up in."""
    config_name = config_name or (cfg.name if cfg is not None else None)
    tracking = cfg.tracking.uri if cfg is not None else None
    if spec is None or spec == "":
        champion_spec = config_champion(cfg, config_name)
        if "models" in _schemes and champion_spec is not None:
            champion = _lookup("models", champion_spec, tracking)
            if champion is not None:
                return Path(champion)
        if default_model is None:
            raise AgentSpecError(f"no agent given and no champion registered ({champion_spec or 'no config'}): "
                                 f"pass --agent SPEC, {accepted_forms()}")
        return resolve_agent(default_model, config_name=config_name, merge_adapter=merge_adapter)
    scheme = spec_scheme(spec)
    if scheme is not None:
        if scheme not in _schemes:
            raise AgentSpecError(f"agent {spec!r}: no resolver for `{scheme}:/` URIs here; use the `prompt-r1` "
                                 "command (it installs the MLflow registry) or pass a folder or run id")
        found = _lookup(scheme, spec, tracking)
        if found is None:
            raise AgentSpecError(f"agent {spec!r}: not in the registry (no such model, version or alias); "
                                 "agents are registered by the `train` and `pipeline` flows")
        return Path(found)
    if spec in BUNDLED:
        from prompt_r1.models.bundled import resolve_model

        return Path(resolve_model(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        return _model_folder(path, spec, merge_adapter)
    run = find_run(spec, config_name)
    if run is None and config_name is not None:
        run = find_run(spec)  # a run of another config is still a usable agent
    if run is not None:
        return _model_folder(run, spec, merge_adapter)
    if HUB_ID.match(spec):
        return spec
    raise AgentSpecError(f"agent {spec!r} is not {accepted_forms()}")


def check_agent_spec(spec: str, config_name: str | None = None, cfg: "Config | None" = None) -> None:
    """Raise `AgentSpecError` when `spec` names no agent, or `ModelLoadError` when it is a hub id the
    hub cannot serve now (offline), without building a bundled model or merging an adapter (a check
    that takes a moment, before a run starts anything: Ray, actors, learner ranks)."""
    if spec in BUNDLED:
        return
    found = resolve_agent(spec, config_name=config_name, merge_adapter=False, cfg=cfg)
    if isinstance(found, str):  # taken as a hub id
        from prompt_r1.models.bundled import check_model_source

        check_model_source(found, "the agent")


def resolve_agents(cfg: Config, given: Mapping[str, str] | None = None,
                   labels: Sequence[str] | None = None) -> dict[str, str]:
    """Label -> agent folder for evaluation: each of `labels` (default `eval.agent_checkpoints`),
    then each remaining label of `given` (label -> spec, e.g. from `--agent LABEL=SPEC`).

    A label resolves to its spec in `given` when there is one, else: `LABEL=SPEC` -> that SPEC under
    LABEL (e.g. `shipped=benchmarks/results/first-call/shipped-agent`); `base` -> the
    config's `agent.model`; `champion` -> the config's champion (`config_champion`); `trained` ->
    skipped with a warning (only a training run has one); anything else is itself a spec, labelled
    by `spec_label`.
    """
    given = dict(given or {})
    specs: dict[str, str] = {}
    for entry in labels if labels is not None else cfg.eval.agent_checkpoints:
        label, spec = split_label(entry)
        if label is None:  # a bare label or spec
            label, spec = entry, ""
        if label in given:
            specs[label] = given[label]
        elif spec:
            specs[label] = spec
        elif label == "base":
            specs[label] = cfg.agent.model
        elif label == "champion":
            specs[label] = config_champion(cfg)
        elif label == "trained":
            log.warning("no trained agent given; skipping agent `trained` (pass --agent trained=SPEC)")
        else:
            specs[spec_label(label)] = label
    for label, spec in given.items():
        specs.setdefault(label, spec)
    for spec in specs.values():  # every spec checked before any bundled model is built (minutes)
        check_agent_spec(spec, cfg.name, cfg=cfg)
    return {label: str(resolve_agent(spec, config_name=cfg.name, cfg=cfg)) for label, spec in specs.items()}
