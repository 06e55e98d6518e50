"""Config loading: the shipped recipes validate; bad keys and values name the key and the file."""

from pathlib import Path

import pytest

from prompt_r1.config.experiment import load_config
from prompt_r1.config.base import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
def test_shipped_configs_validate(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.name == name
    assert len(cfg.hash()) == 12


def test_paper_settings():
    cfg = load_config(ROOT / "configs" / "paper.yaml")
    assert (cfg.rollout.group_size, cfg.rollout.batch_questions, cfg.train.lr, cfg.rollout.max_turns) == (5, 128, 1e-6, 5)
    assert cfg.environment.model == "gpt-4o-mini" and cfg.environment.api_key_env == "OPENAI_API_KEY"


def test_unknown_key_names_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain:\n  stepz: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "train.stepz" in str(err.value) and str(bad) in str(err.value)


def test_bad_value_names_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  group_size: 0\nenvironment:\n  kind: nope\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "rollout.group_size" in str(err.value) and "environment.kind" in str(err.value)


def test_overrides_and_missing_file(tmp_path):
    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"train.steps": 7})
    assert cfg.train.steps == 7
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")


# -- names become folder names: only safe slugs --------------------------------------------
SLUG_CHARS = "abcXYZ019._-"
HOSTILE = ["/", "\\", "..", " ", "\x00", "é", ":", "*", "\n", "~", "$"]


def _slug_by_rule(name: str) -> bool:
    """The rule, stated again: 1-64 ASCII letters/digits/`._-`, the first a letter or digit."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    return 1 <= len(name) <= 64 and set(name) <= allowed and name[0] not in "._-"


def _names(n: int = 600) -> list[str]:
    import random

    rng = random.Random(11)
    names = ["../../x", "..", ".", "a/b", "/abs", "ok", "a..", "-x", "_x", ".hidden", "", "x" * 64, "x" * 65,
             "gpt-4o-mini", "smollm2-135m", "tiny-env"]
    for _ in range(n):
        parts = [rng.choice(SLUG_CHARS) if rng.random() < 0.9 else rng.choice(HOSTILE)
                 for _ in range(rng.choice([1, 2, 5, 20, 63, 64, 65, 70]))]
        names.append("".join(parts))
    return names


def test_config_and_environment_names_are_safe_slugs(tmp_path):
    from prompt_r1.config.experiment import parse_config

    accepted = 0
    for name in _names():
        for where, data in [("name", {"name": name}),
                            ("environment.name", {"environment": {"name": name}}),
                            ("eval.environments.0.name", {"eval": {"environments": [{"name": name}]}})]:
            try:
                parse_config(data, "x.yaml")
                ok = True
            except ConfigError as err:
                ok = False
                assert f"`{where}`" in str(err) and "x.yaml" in str(err), str(err)
            assert ok == _slug_by_rule(name), (where, name)
        if _slug_by_rule(name):
            accepted += 1
            # every accepted name stays one folder inside the run home
            assert (tmp_path / name).resolve().parent == tmp_path.resolve(), name
    assert 50 < accepted < len(_names())  # both outcomes were exercised


def test_traversing_name_in_a_file_names_the_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: ../../x\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "`name`" in str(err.value) and str(bad) in str(err.value) and "folder name" in str(err.value)


def test_run_dir_refuses_a_traversing_run_id(tmp_path, monkeypatch):
    from prompt_r1.config.run_home import run_dir

    monkeypatch.setenv("PROMPT_R1_HOME", str(tmp_path))
    assert run_dir("smoke", "20250101-000000-abcdef") == tmp_path.resolve() / "smoke" / "20250101-000000-abcdef"
    for bad in ["../x", "a/b", "..", ""]:
        with pytest.raises(ValueError, match="cannot name a run folder"):
            run_dir("smoke", bad)


# -- a key given twice is refused, never "the last one wins" ---------------------------------------
@pytest.mark.parametrize("text, key, lines", [
    pytest.param("name: x\ntrain:\n  steps: 3\n  lr: 0.1\nrollout:\n  group_size: 2\ntrain:\n  steps: 4\n",
                 "`train`", (2, 7), id="top-level-section"),
    pytest.param("name: x\ntrain:\n  steps: 3\n  lr: 0.1\n  steps: 5\n", "`train.steps`", (3, 5), id="nested"),
    pytest.param("eval:\n  environments:\n    - name: a\n    - name: b\n      model: m\n      name: c\n",
                 "`eval.environments[1].name`", (4, 6), id="in-a-list"),
    pytest.param("train: {steps: 3, steps: 4}\n", "`train.steps`", (1, 1), id="flow-mapping-one-line"),
])
def test_duplicate_key_names_file_key_and_both_lines(tmp_path, text, key, lines):
    bad = tmp_path / "dup.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    message = str(err.value)
    assert str(bad) in message and key in message and f"line {lines[0]} and line {lines[1]}" in message, message


def test_yaml_merge_keys_and_aliases_are_not_duplicates(tmp_path):
    ok = tmp_path / "merge.yaml"
    ok.write_text("name: x\nrollout: &r\n  group_size: 2\n  batch_questions: 2\n"
                  "train:\n  steps: 3\n  lr: 0.1\n")
    assert load_config(ok).train.steps == 3
    from prompt_r1.config.experiment import _UniqueKeyLoader
    import yaml

    data = yaml.load("a: &x {p: 1, q: 2}\nb:\n  <<: *x\n  p: 3\nc: *x\n", Loader=_UniqueKeyLoader)
    assert data == {"a": {"p": 1, "q": 2}, "b": {"p": 3, "q": 2}, "c": {"p": 1, "q": 2}}


# -- a boolean is not a number ----------------------------------------------------------------------
def _number_keys() -> list[tuple[str, object, type]]:
    """(dotted key, default, type) of every numeric setting, found by the rule stated again: a field
    whose annotation names int or float and not bool; nested sections are walked."""
    import typing

    from pydantic import BaseModel

    from prompt_r1.config.experiment import Config

    found = []

    def models_in(annotation) -> list[type]:
        args = typing.get_args(annotation) or (annotation,)
        return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]

    def walk(model: type, prefix: str) -> None:
        for name, field in model.model_fields.items():
            text = str(field.annotation).replace("<class '", "").replace("'>", "")
            words = set(text.replace("|", " ").replace("[", " ").replace("]", " ").replace(",", " ").split())
            nested = models_in(field.annotation)
            if nested and "list" not in text:
                walk(nested[0], f"{prefix}{name}.")
            elif (words & {"int", "float", "typing.Optional[int]", "typing.Optional[float]"} and "bool" not in words
                  and not text.startswith("dict")):  # a mapping to numbers (eval.dataset_limits) is not a number
                found.append((f"{prefix}{name}", field.default, float if "float" in words else int))

    walk(Config, "")
    return found


def _nested(dotted: str, value) -> dict:
    *parents, leaf = dotted.split(".")
    data = {leaf: value}
    for part in reversed(parents):
        data = {part: data}
    return data


def test_every_number_key_refuses_a_bool_and_still_takes_numbers():
    from prompt_r1.config.experiment import parse_config

    keys = _number_keys()
    assert len(keys) > 60 and {"train.lr", "train.steps", "environment.timeout_s"} <= {k for k, _, _ in keys}
    for key, default, kind in keys:
        for flag in (True, False):
            with pytest.raises(ConfigError) as err:
                parse_config(_nested(key, flag), "x.yaml")
            assert f"`{key}`" in str(err.value) and "boolean" in str(err.value), (key, str(err.value))
        numbers = [default] if isinstance(default, (int, float)) and not isinstance(default, bool) else [3]
        if kind is float and float(numbers[0]).is_integer():
            numbers.append(int(numbers[0]))  # an int where a float goes is still fine
        for number in numbers:
            cfg = parse_config(_nested(key, number), "x.yaml")
            section = cfg
            for part in key.split("."):
                section = getattr(section, part)
            assert section == number and not isinstance(section, bool), (key, number, section)


@pytest.mark.parametrize("text, key", [("train:\n  steps: true\n", "train.steps"),
                                        ("train:\n  lr: yes\n", "train.lr")])
def test_a_bool_in_a_file_or_set_names_the_key(tmp_path, text, key):
    from prompt_r1.config.experiment import parse_overrides

    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=rf"`{key}`.*boolean"):
        load_config(bad)
    with pytest.raises(ConfigError, match=rf"`{key}`.*boolean"):
        load_config(ROOT / "configs" / "smoke.yaml", parse_overrides([f"{key}=true"]))
    assert load_config(ROOT / "configs" / "smoke.yaml", parse_overrides(["train.lr=1e-5"])).train.lr == 1e-5
    (tmp_path / "lr.yaml").write_text("train:\n  lr: 1e-5\n")  # PyYAML reads this as a string: still a float
    assert load_config(tmp_path / "lr.yaml").train.lr == 1e-5


# -- no number is infinite or NaN ---------------------------------------------------------------------
NON_FINITE = [float("inf"), float("-inf"), float("nan"), "inf", "-Infinity", "NaN", "1e999", "-1e999"]
NON_FINITE_YAML = [".inf", "-.Inf", ".NaN", "1.0e999", "+.INF"]


def test_every_number_key_refuses_every_spelling_of_a_non_finite_number(tmp_path):
    """One rule in the base model covers every number the config takes, pool members included."""
    from prompt_r1.config.experiment import parse_config

    keys = [key for key, _, _ in _number_keys()]
    pool_keys = ["train.environments.0.weight", "train.environments.0.price_per_1k_prompt",
                 "train.environments.0.timeout_s"]
    assert {"reward.cost.penalty_scale", "reward.cost.penalty_keep", "environment.price_per_1k_prompt"} <= set(keys)
    for key in keys + pool_keys:
        for value in NON_FINITE:
            if key.startswith("train.environments."):
                data = {"train": {"environments": [{"name": "a", key.rsplit(".", 1)[1]: value}]}}
            else:
                data = _nested(key, value)
            with pytest.raises(ConfigError) as err:
                parse_config(data, "x.yaml")
            assert f"`{key}`" in str(err.value) and "x.yaml" in str(err.value), (key, value, str(err.value))
    for spelling in NON_FINITE_YAML:
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"reward:\n  cost:\n    mode: penalty\n    penalty_scale: {spelling}\n")
        with pytest.raises(ConfigError, match=r"`reward.cost.penalty_scale`: .*finite"):
            load_config(bad)
    for value in NON_FINITE:
        with pytest.raises(ConfigError, match=r"`environment.price_per_1k_completion`: "):
            load_config(ROOT / "configs" / "smoke.yaml", {"environment.price_per_1k_completion": value})


def test_pool_weights_whose_sum_overflows_are_refused_and_large_finite_ones_kept():
    from prompt_r1.config.experiment import parse_config

    def pool(weights):
        return {"train": {"environments": [{"name": f"e{i}", "weight": w} for i, w in enumerate(weights)]}}

    for weights in ([1e308, 1e308], [1.7e308, 1.0, 1.7e308], [6e307] * 3, [1.7e308, 1e307]):
        with pytest.raises(ConfigError, match=r"train.environments.*add up to more than a float holds"):
            parse_config(pool(weights), "x.yaml")
    for weights in ([1e307, 1e307], [1.0, 1e308], [1e-300, 1e-300], [0.5, 2.0, 3.0]):
        assert parse_config(pool(weights)).training_weights() == weights


def test_check_config_refuses_an_infinite_reward_setting_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    for key in ("reward.cost.penalty_scale", "reward.cost.penalty_keep", "environment.price_per_1k_prompt"):
        for value in (".inf", "nan", "-1e999"):
            result = CliRunner().invoke(app, ["check-config", "-c", str(ROOT / "configs" / "smoke.yaml"),
                                              "--set", f"{key}={value}"])
            assert result.exit_code == 2, (key, value, result.exception, result.output)
            assert f"`{key}`" in result.output and "Traceback" not in result.output, (key, value, result.output)


def test_logits_in_chunks_are_how_an_update_is_computed_not_which():
    """`train.logits_chunk_tokens` leaves the run's identity alone (a run resumes with another
    chunk) and is refused with FSDP, naming both keys and what to change."""
    from prompt_r1.config.experiment import parse_config

    assert parse_config({"train": {"logits_chunk_tokens": 256}}).hash() == parse_config({}).hash()
    with pytest.raises(ConfigError, match=r"train\.logits_chunk_tokens 256 does not work with train\.strategy fsdp"):
        parse_config({"train": {"logits_chunk_tokens": 256, "strategy": "fsdp", "world_size": 2}})
    with pytest.raises(ConfigError, match="logits_chunk_tokens"):
        parse_config({"train": {"logits_chunk_tokens": -1}})


def test_packing_is_how_an_update_is_computed_and_must_hold_a_response():
    """`train.pack_tokens` leaves the run's identity alone; a budget that cannot hold a full
    response, or packing under Dr.GRPO's per-sequence sum, is refused naming the keys and numbers."""
    from prompt_r1.config.experiment import parse_config

    assert parse_config({"train": {"pack_tokens": 4096}}).hash() == parse_config({}).hash()
    with pytest.raises(ConfigError, match=r"train\.pack_tokens 512 cannot hold one trajectory: "
                                          r"agent\.max_response_tokens is 512"):
        parse_config({"agent": {"max_response_tokens": 512}, "train": {"pack_tokens": 512}})
    with pytest.raises(ConfigError, match=r"train\.pack_tokens 4096 needs train\.loss_agg token-mean"):
        parse_config({"train": {"pack_tokens": 4096, "loss_agg": "seq-mean-token-sum-norm"}})
    with pytest.raises(ConfigError, match=r"train\.pack_tokens 4096 does not work with train\.strategy fsdp"):
        parse_config({"train": {"pack_tokens": 4096, "strategy": "fsdp", "world_size": 2}})


def test_rollout_correction_off_keeps_every_runs_identity():
    """`train.rollout_correction` off (the default) is left out of `Config.hash`, whatever its bounds,
    so runs recorded before it existed resume as the same run; a mode that changes the loss or its
    metrics is another run. The literal is the default config's hash on the commit before the field."""
    from prompt_r1.config.experiment import parse_config

    default = parse_config({}).hash()
    assert default == "d04dedd3f970", "a new config field at its default must be left out of Config.hash"
    assert parse_config({"train": {"rollout_correction": {"mode": "off", "geo_low": 0.5}}}).hash() == default
    modes = ("metrics", "token-tis", "geo-mask", "both")
    hashes = {parse_config({"train": {"rollout_correction": {"mode": m}}}).hash() for m in modes}
    assert len(hashes) == 4 and default not in hashes
    both = {"mode": "both", "geo_low": 0.98}
    assert parse_config({"train": {"rollout_correction": both}}).hash() not in hashes
    for bad, key in (({"geo_low": 1.01}, "geo_low"), ({"geo_high": 0.99}, "geo_high"), ({"mode": "geo"}, "mode"),
                     ({"geo_low": 0.0}, "geo_low")):
        with pytest.raises(ConfigError, match=key):
            parse_config({"train": {"rollout_correction": bad}})
