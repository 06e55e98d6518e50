"""The one agent resolver: every accepted spec form reaches the folder it names, every bad form
is refused with a message naming the spec and what to pass; one run-id scheme for CLI and flows.

The expected folder of each spec is written down while a random run home is built (an
independent statement of the rule), then compared with what the resolver finds.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prompt_r1.models import bundled as models, resolver as agent_resolver
from prompt_r1.models.resolver import (BUNDLED, AgentSpecError, parse_labelled_specs, resolve_agent,
                                      resolve_agents, spec_label)
from prompt_r1.config.experiment import load_config
from prompt_r1.config.run_home import new_run_id
from prompt_r1.training.run_folder import find_resumable, open_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE_CHAMPION = "models:/prompt-r1-smoke@champion"  # configs/smoke.yaml's registered model's champion


def _hf(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path.resolve()


@pytest.fixture
def registry(monkeypatch):
    """A fake `models:` scheme (the library never imports MLflow) and a fake bundled-model builder."""
    entries: dict[str, Path] = {}
    monkeypatch.setattr(agent_resolver, "_schemes", {})
    agent_resolver.register_scheme("models", entries.get)
    built: list[str] = []

    def fake_resolve_model(name: str) -> Path:
        built.append(name)
        return Path(f"/bundled/{name}")

    monkeypatch.setattr(models, "resolve_model", fake_resolve_model)
    return entries, built


def _random_home(rng: random.Random, home: Path, tmp: Path, registry: dict[str, Path]):
    """Build runs, folders and registry entries; return [(spec, config_name, expected folder)]."""
    cases: list[tuple[str, str | None, Path]] = []
    configs = [f"cfg{i}" for i in range(rng.randint(1, 3))]
    for n in range(rng.randint(2, 6)):
        config = rng.choice(configs)
        run_id = new_run_id() if rng.random() < 0.7 else f"run-{n}.v{rng.randint(0, 9)}"
        run = home / config / run_id
        agent = _hf(run / "agent")
        (run / "checkpoints" / "step-000001").mkdir(parents=True)
        (run / "run.json").write_text("{}")
        cases += [(run_id, None, agent), (run_id, config, agent), (run_id, "other-config", agent),
                  (str(run), None, agent), (str(run / "agent"), None, agent), (str(run) + "/", None, agent)]
    for n in range(rng.randint(1, 3)):
        plain = _hf(tmp / f"plain{n}" / "model")
        cases.append((str(plain), rng.choice([None, *configs]), plain))
    for version in range(1, rng.randint(2, 4)):
        folder = _hf(tmp / "registry" / f"v{version}" / "agent")
        registry[f"models:/prompt-r1-agent/{version}"] = folder
        cases.append((f"models:/prompt-r1-agent/{version}", None, folder))
    registry["models:/prompt-r1-cfg0@champion"] = registry[f"models:/prompt-r1-agent/{version}"]
    cases.append(("models:/prompt-r1-cfg0@champion", None, registry["models:/prompt-r1-cfg0@champion"]))
    _hf(home / "models" / "tiny-bytes")  # the model cache under the run home is no run
    return cases


@pytest.mark.parametrize("seed", range(6))
def test_every_accepted_form_resolves_to_the_folder_it_names(home, tmp_path, registry, seed):
    entries, built = registry
    rng = random.Random(seed)
    cases = _random_home(rng, home, tmp_path / "elsewhere", entries)
    assert len(cases) >= 8
    for spec, config_name, expected in cases:
        assert resolve_agent(spec, config_name=config_name) == expected, (spec, config_name)
    for name in BUNDLED:  # a bundled name always goes to the bundled builder
        assert resolve_agent(name) == Path(f"/bundled/{name}")
    assert built == list(BUNDLED)
    # No spec: the config's champion while the registry holds one, else the default model; another
    # config's champion is never taken, nor one without a config.
    assert resolve_agent(None, default_model="tiny", config_name="cfg0") == entries["models:/prompt-r1-cfg0@champion"]
    assert resolve_agent(None, default_model="tiny", config_name="cfg1") == Path("/bundled/tiny")
    assert resolve_agent(None, default_model="tiny") == Path("/bundled/tiny")
    del entries["models:/prompt-r1-cfg0@champion"]
    assert resolve_agent(None, default_model="tiny", config_name="cfg0") == Path("/bundled/tiny")


def _bad_cases(home: Path, tmp_path: Path) -> list[tuple[str, str]]:
    """(spec, what the message must say) for specs that name no usable agent."""
    unfinished = home / "smoke" / new_run_id()
    (unfinished / "checkpoints" / "step-000001").mkdir(parents=True)
    (unfinished / "run.json").write_text("{}")
    twice = new_run_id()
    for config in ("smoke", "demo"):
        _hf(home / config / twice / "agent")
    (tmp_path / "empty").mkdir()
    _hf(home / "models" / "tiny-bytes")
    return [
        ("no-such-agent", "is not a bundled model .*a registry URI"),
        ("tiny-bytes", "is not a bundled model"),            # a cached model folder is no run id
        (new_run_id(), "is not a bundled model"),
        ("../escape", "is not a bundled model"),
        (unfinished.name, r"no exported agent.*prompt-r1 export"),
        (str(unfinished), r"no exported agent.*prompt-r1 export"),
        (twice, "several configs.*pass the run folder"),
        (str(tmp_path / "empty"), "neither a HF model folder"),
        ("models:/prompt-r1-agent/99", "not in the registry.*`train` and `pipeline` flows"),
        ("models:/prompt-r1-agent@nobody", "not in the registry"),
    ]


def test_every_bad_form_names_the_spec_and_what_to_pass(home, tmp_path, registry):
    for spec, says in _bad_cases(home, tmp_path):
        with pytest.raises(AgentSpecError, match=says) as err:
            resolve_agent(spec)
        assert repr(spec) in str(err.value), spec
    agent_resolver._schemes.clear()  # library use, no registry installed
    with pytest.raises(AgentSpecError, match=r"'models:/prompt-r1-smoke@champion': no resolver for `models:/`"):
        resolve_agent(SMOKE_CHAMPION)
    with pytest.raises(AgentSpecError, match=r"no agent given and no champion registered \(no config\): pass --agent SPEC"):
        resolve_agent(None)
    with pytest.raises(AgentSpecError, match=r"no champion registered \(models:/prompt-r1-smoke@champion\)"):
        resolve_agent(None, config_name="smoke")
    with pytest.raises(AgentSpecError, match="--agent 'trained=': no spec.*bundled model"):
        parse_labelled_specs(["trained="])


def test_labelled_specs_round_trip(tmp_path):
    rng = random.Random(0)
    specs = ["tiny", "runs/smoke/abc", SMOKE_CHAMPION, "models:/prompt-r1-agent/4", "/a/b=c/agent",
             new_run_id()]
    for _ in range(200):
        chosen = {f"l{i}": rng.choice(specs) for i in range(rng.randint(1, 4))}
        labelled = rng.random() < 0.5
        items = [f"{label}={spec}" for label, spec in chosen.items()] if labelled else list(dict.fromkeys(chosen.values()))
        expected = chosen if labelled else {spec_label(s): s for s in items}
        assert parse_labelled_specs(items) == expected


def test_evaluation_agents_resolve_through_the_same_rule(home, tmp_path, registry):
    entries, _ = registry
    champion = _hf(tmp_path / "champion")
    entries[SMOKE_CHAMPION] = champion
    run_id = new_run_id()
    trained = _hf(home / "smoke" / run_id / "agent")
    plain = _hf(tmp_path / "plain")
    cfg = load_config(ROOT / "configs" / "smoke.yaml",
                      {"eval.agent_checkpoints": ["base", "trained", "champion", str(plain)]})
    assert resolve_agents(cfg) == {"base": f"/bundled/{cfg.agent.model}", "champion": str(champion),
                                   "plain": str(plain)}                      # trained: skipped
    assert resolve_agents(cfg, {"trained": run_id, "extra": SMOKE_CHAMPION}) == {
        "base": f"/bundled/{cfg.agent.model}", "trained": str(trained), "champion": str(champion),
        "plain": str(plain), "extra": str(champion)}
    assert resolve_agents(cfg, {"base": str(plain)}, labels=["base"]) == {"base": str(plain)}
    # `LABEL=SPEC` in eval.agent_checkpoints: a spec under a label of its own (a given spec still wins)
    named_spec = [f"shipped={plain}", f"again={run_id}", "base"]
    assert resolve_agents(cfg, labels=named_spec) == {"shipped": str(plain), "again": str(trained),
                                                      "base": f"/bundled/{cfg.agent.model}"}
    assert resolve_agents(cfg, {"shipped": str(champion)}, labels=named_spec[:1]) == {"shipped": str(champion)}
    # `tracking.registered_model` names the model whose champion the config takes
    entries["models:/team-qa@champion"] = other = _hf(tmp_path / "team-champion")
    named = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"registered_model": "team-qa"})})
    assert resolve_agents(named, labels=["champion"]) == {"champion": str(other)}
    del entries[SMOKE_CHAMPION]
    with pytest.raises(AgentSpecError, match="'models:/prompt-r1-smoke@champion': not in the registry"):
        resolve_agents(cfg, labels=["champion"])


def test_a_configs_tracking_uri_and_registered_model_reach_the_registry(registry):
    """The default agent of a config with `tracking.uri` is looked up on that server: the registry's
    resolver gets the URI as its second argument (and only then: a one-argument resolver still works)."""
    seen = []

    def lookup(uri: str, tracking: str | None = None) -> Path:
        seen.append((uri, tracking))
        return Path("/registry/champion")

    agent_resolver.register_scheme("models", lookup)
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"tracking.uri": "http://127.0.0.1:5999",
                                                        "tracking.registered_model": "team-qa"})
    assert resolve_agent(None, default_model="tiny", cfg=cfg) == Path("/registry/champion")
    assert resolve_agent("models:/team-qa/3", cfg=cfg) == Path("/registry/champion")
    assert seen == [("models:/team-qa@champion", "http://127.0.0.1:5999"), ("models:/team-qa/3", "http://127.0.0.1:5999")]


def test_run_ids_have_mlflow_shape_and_resume_picks_the_newest_run(home):
    ids = [new_run_id() for _ in range(50)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 50
    root = home / "smoke"
    started = sorted(ids[:5], reverse=True)  # ids sort against start order: the record decides
    for run_id in started:
        open_run(root / run_id, "smoke", "hash", "pool", resume=False)
    assert find_resumable(root, "hash", "pool") == (started[-1], [])


def test_cli_refuses_a_bad_agent_spec_before_running(home, registry):
    from prompt_r1.cli import app

    for args in (["evaluate", "-c", "configs/smoke.yaml", "--agent", "trained=no-such-run"],
                 ["ask", "hello", "-c", "configs/smoke.yaml", "--agent", "no-such-run"],
                 ["serve", "-c", "configs/smoke.yaml", "--agent", "no-such-run"]):
        result = CliRunner().invoke(app, args)
        text = " ".join(result.output.split())
        assert result.exit_code == 2, (args, result.output)
        assert "'no-such-run' is not a bundled model" in text and "models:/prompt-r1-<config>@champion" in text


def test_the_split_cli_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "prompt_r1.cli", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("ingest", "train", "evaluate", "rollout", "ask", "serve", "export"):
        assert re.search(rf"│ {command}\s", out.stdout), command
    for module in (ROOT / "prompt_r1" / "cli").glob("*.py"):
        assert len(module.read_text().splitlines()) < 400, module


def test_a_hub_id_passes_through_for_transformers_to_download(home):
    """paper.yaml's agent is a hub id: training and `base` evaluation hand it on unchanged, while
    a path-like spec that exists nowhere stays an error."""
    assert resolve_agent("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    for spec in ("./Qwen/Qwen3-4B", "a/b/c", "/abs/model"):
        with pytest.raises(AgentSpecError, match="hub id"):
            resolve_agent(spec)
