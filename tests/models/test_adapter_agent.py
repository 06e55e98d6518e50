"""A LoRA adapter folder is an agent: kept alone from a real LoRA checkpoint (non-zero B matrices,
so the merge moves weights), moved elsewhere, and resolved to its base merged, checked against
PEFT's own `merge_and_unload` and the trained policy's logits; the merge is cached and reused, a
half-written cache is rebuilt, and a base found nowhere is named in the error.

Each test points the models home at a fresh folder (the merged agents land there) whose bundled
models link to the session's, so nothing is built twice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from grpo_helpers import make_config, prompt_ids
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from prompt_r1.models import export
from prompt_r1.learner.checkpoint import save_checkpoint
from prompt_r1.models.export import EXPORT_MARKER, is_export
from prompt_r1.learner.grpo_learner import GRPOLearner
from prompt_r1.models.adapter import MERGED_DIR, export_adapter, merged_folder, portable_base
from prompt_r1.models.bundled import bundled_folder, resolve_model
from prompt_r1.models.agent_files import ADAPTER_CONFIG, TRAINING_CONFIG, training_config_file
from prompt_r1.models.resolver import AgentSpecError, check_agent_spec, resolve_agent

ROOT = Path(__file__).resolve().parents[2]


def _lora_checkpoint(cfg, base: Path, ckpt_dir: Path, std: float) -> tuple[Path, GRPOLearner]:
    """A LoRA learner on `base` whose B matrices are random (a trained adapter's are non-zero),
    saved as a run saves its checkpoints."""
    torch.manual_seed(0)
    learner = GRPOLearner(cfg, base)
    with torch.no_grad():
        lora_b = [p for name, p in learner.model.named_parameters() if "lora_B" in name]
        assert lora_b
        for p in lora_b:
            p.normal_(std=std)
    return save_checkpoint(learner, ckpt_dir, 1, {"position": 1}, cfg), learner


@pytest.fixture(scope="module")
def kept(_model_cache, tmp_path_factory):
    """(the adapter as `prompt-r1 export --adapter-only` keeps it, moved away from its run; the learner)."""
    root = tmp_path_factory.mktemp("adapter")
    ckpt, learner = _lora_checkpoint(make_config(lora=True), resolve_model("tiny"), root / "run" / "checkpoints", 0.2)
    result = CliRunner().invoke(_app(), ["export", str(ckpt), str(root / "kept"), "--adapter-only"])
    assert result.exit_code == 0, result.output
    moved = Path(shutil.move(root / "kept", root / "elsewhere" / "trained"))
    shutil.rmtree(root / "run")  # nothing of the run is left to lean on
    learner.model.eval()
    return moved, learner


def _app():
    from prompt_r1.cli import app

    return app


def _ids(learner) -> torch.Tensor:
    return torch.tensor([prompt_ids(learner.tokenizer, "Who wrote Hamlet? <think>")])


def test_a_kept_adapter_is_small_and_names_its_base_portably(kept):
    folder, _ = kept
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [ADAPTER_CONFIG, "adapter_model.safetensors", TRAINING_CONFIG, EXPORT_MARKER])
    assert json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == "tiny"
    assert training_config_file(folder) == folder / TRAINING_CONFIG


def test_an_adapter_folder_resolves_to_its_base_merged(kept, models_home):
    folder, learner = kept
    merged = resolve_agent(str(folder))
    assert merged.parent == models_home / MERGED_DIR and is_export(merged)
    assert (merged / "tokenizer_config.json").is_file() and training_config_file(merged) == merged / TRAINING_CONFIG

    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32)
    base_weights = {k: v.clone() for k, v in base.state_dict().items()}
    reference = PeftModel.from_pretrained(base, folder).eval()
    ids = _ids(learner)
    with torch.no_grad():
        peft_logits = reference(input_ids=ids).logits
        expected = reference.merge_and_unload().state_dict()
        loaded = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
        got = loaded.state_dict()
        assert got.keys() == expected.keys()
        for name, weight in got.items():
            assert torch.allclose(weight, expected[name], atol=1e-6), name
        moved = [name for name in got if not torch.allclose(got[name], base_weights[name], atol=1e-4)]
        assert any("q_proj" in name for name in moved), moved  # the merge changed the adapted layers
        logits = loaded(input_ids=ids).logits
        assert torch.allclose(logits, peft_logits, atol=1e-5)
        assert torch.allclose(logits, learner.model(input_ids=ids).logits, atol=1e-5)  # the trained policy


def test_the_merged_agent_is_reused_and_a_half_written_one_is_not(kept, models_home, monkeypatch):
    folder, learner = kept
    merged = resolve_agent(str(folder))
    assert merged == merged_folder(folder, resolve_model("tiny"))
    stamp = (merged / "model.safetensors").stat().st_mtime_ns

    def no_merge(*args, **kwargs):
        raise AssertionError("merged again")

    with monkeypatch.context() as patched:
        patched.setattr(export, "export_checkpoint", no_merge)
        assert resolve_agent(str(folder)) == merged
    assert (merged / "model.safetensors").stat().st_mtime_ns == stamp

    # a folder under the cache's name without the export marker (written last) is never used
    shutil.rmtree(merged)
    merged.mkdir()
    (merged / "config.json").write_text("{")
    leftover = merged.with_name(f".{merged.name}.tmp-1-0badf00d")  # a dead builder's temp folder
    shutil.copytree(merged, leftover)
    assert resolve_agent(str(folder)) == merged and is_export(merged)
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
        assert torch.allclose(loaded(input_ids=_ids(learner)).logits,
                              learner.model(input_ids=_ids(learner)).logits, atol=1e-5)

    # another adapter file is another merged agent
    changed = shutil.copytree(folder, models_home.parent / "changed")
    config = json.loads((changed / ADAPTER_CONFIG).read_text())
    (changed / ADAPTER_CONFIG).write_text(json.dumps({**config, "lora_alpha": 2 * config["lora_alpha"]}))
    assert merged_folder(changed, resolve_model("tiny")) != merged


def test_an_adapter_whose_base_is_nowhere_names_the_folder_and_the_base(kept, models_home):
    folder, _ = kept
    lost = shutil.copytree(folder, models_home.parent / "lost")
    config = json.loads((lost / ADAPTER_CONFIG).read_text())
    gone = "/gpu-box/tmp/prompt_r1_models/tiny-bytes"
    (lost / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": gone}))
    for resolve in (resolve_agent, check_agent_spec):  # the quick check says it too, before any work
        with pytest.raises(AgentSpecError) as err:
            resolve(str(lost))
        text = str(err.value)
        assert str(lost) in text and repr(gone) in text and "not on this machine" in text, text
        assert "looks like bundled model 'tiny'" in text, text
    assert not (models_home / MERGED_DIR).exists()
    # pointed at a folder that exists here, it resolves
    (lost / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(resolve_model("tiny"))}))
    assert is_export(resolve_agent(str(lost)))


def test_the_base_is_recorded_by_its_bundled_name_else_as_trained(tmp_path):
    def trained(model: str) -> Path:
        path = tmp_path / f"config-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(f"agent:\n  model: {model}\n")
        return path

    tiny = str(bundled_folder("tiny"))
    own = str(tmp_path / "own-model")
    assert portable_base(tiny, trained("tiny")) == "tiny"          # agent.model named it
    assert portable_base(tiny, trained(tiny)) == "tiny"            # agent.model was its folder
    assert portable_base(tiny, None) == "tiny"
    assert portable_base("Qwen/Qwen3-4B", trained("Qwen/Qwen3-4B")) == "Qwen/Qwen3-4B"
    assert portable_base(own, trained(own)) == own


def test_export_adapter_only_refuses_a_full_model_checkpoint(tmp_path, _model_cache):
    ckpt = save_checkpoint(GRPOLearner(make_config(), resolve_model("tiny")), tmp_path / "ckpts", 1, {}, make_config())
    result = CliRunner().invoke(_app(), ["export", str(ckpt), str(tmp_path / "out"), "--adapter-only"])
    assert result.exit_code == 2 and "holds no LoRA adapter" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()


def test_evaluate_takes_an_adapter_folder_as_the_trained_agent(home, models_home, tmp_path):
    """`prompt-r1 evaluate --agent trained=<adapter folder>` on the smoke config: the adapter (on the
    smoke agent's base, tiny-protocol) is merged and evaluated as agent:trained."""
    from prompt_r1.config.experiment import load_config

    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"agent.lora.enabled": True})
    ckpt, _ = _lora_checkpoint(cfg, resolve_model("tiny-protocol"), tmp_path / "ckpts", 0.01)
    folder = export_adapter(ckpt, tmp_path / "trained")
    assert json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == "tiny-protocol"
    out = tmp_path / "report"
    result = CliRunner().invoke(_app(), [
        "evaluate", "-c", "configs/smoke.yaml", "--agent", f"trained={folder}", "--out", str(out),
        "--set", 'eval.methods=["agent"]', "--set", "eval.limit_per_dataset=1", "--sequential"])
    assert result.exit_code == 0, result.output
    table = (out / "results.md").read_text()
    assert "agent:trained" in table and "agent:base" in table, table
    assert len([p for p in (models_home / MERGED_DIR).iterdir() if p.is_dir()]) == 1  # merged once


def test_the_learning_experiment_keeps_a_lora_runs_adapter_alone(home, models_home, tmp_path):
    """`benchmarks.experiments.learning.run_arm` under LoRA keeps the final checkpoint's adapter (not
    the merged export), and it resolves to the same weights as the run's own export."""
    learning = pytest.importorskip("benchmarks.experiments.learning")
    from prompt_r1.config.experiment import load_config

    cfg = load_config(ROOT / "configs" / "smoke.yaml", {"agent.lora.enabled": True, "train.steps": 1})
    result = learning.run_arm(cfg, "trained", tmp_path / "arm", "sample_multihop", probe_limit=1,
                              keep_agent=tmp_path / "agents" / "trained")
    folder = Path(result["agent"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [ADAPTER_CONFIG, "adapter_model.safetensors", TRAINING_CONFIG, EXPORT_MARKER])
    assert json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == "tiny-protocol"
    merged = resolve_agent(str(folder))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "arm" / "trained" / "agent").state_dict()
    for name, weight in AutoModelForCausalLM.from_pretrained(merged).state_dict().items():
        assert torch.allclose(weight, exported[name], atol=1e-6), name
