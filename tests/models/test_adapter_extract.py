"""A full-weight agent kept as a LoRA adapter (`prompt_r1.models.adapter_extract`): against a
restatement (numpy's SVD of each layer's change, cut to the rank) over generated changes, through
the real path an agent takes: `prompt-r1 export --adapter-only --rank`, then the resolver merging
the folder onto its base with PEFT."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from prompt_r1.models.adapter_extract import linear_changes
from prompt_r1.models.agent_files import TRAINING_CONFIG
from prompt_r1.models.bundled import resolve_model
from prompt_r1.models.resolver import resolve_agent


def _tuned(base: Path, folder: Path, seed: int, true_rank: int) -> dict[str, torch.Tensor]:
    """An exported-agent folder of `base` whose every decoder linear layer moved by a random matrix of
    rank `true_rank`, and its embeddings too (which no adapter carries); returns the tuned weights."""
    shutil.copytree(base, folder)
    weights = load_file(str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for key in list(weights):
        w = weights[key]
        if key.endswith(".weight") and w.dim() == 2 and ".layers." in key:
            u = torch.randn(w.shape[0], true_rank, generator=gen) * 0.05
            weights[key] = w + u @ torch.randn(true_rank, w.shape[1], generator=gen)
        elif "embed" in key:
            weights[key] = w + 0.01
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / TRAINING_CONFIG).write_text(yaml.safe_dump({"name": "t", "agent": {"model": "tiny"}}))
    return weights


def _export(folder: Path, out: Path, rank: int) -> str:
    from prompt_r1.cli import app

    result = CliRunner().invoke(app, ["export", str(folder), str(out), "--adapter-only", "--rank", str(rank)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("seed,true_rank,rank", [(0, 2, 2), (1, 3, 1), (2, 4, 2), (3, 1, 3)])
def test_the_merged_adapter_is_the_rank_cut_of_each_layers_change(models_home, tmp_path, seed, true_rank, rank):
    base = Path(resolve_model("tiny"))
    tuned = _tuned(base, tmp_path / "tuned", seed, true_rank)
    said = _export(tmp_path / "tuned", tmp_path / "adapter", rank)
    merged = load_file(str(Path(resolve_agent(str(tmp_path / "adapter"))) / "model.safetensors"))
    original = load_file(str(base / "model.safetensors"))
    changes = linear_changes(original, tuned)
    kept = total = 0.0
    for module, delta in changes.items():
        u, s, vh = np.linalg.svd(delta.numpy(), full_matrices=False)  # the restatement: Eckart-Young
        cut = (u[:, :rank] * s[:rank]) @ vh[:rank]
        got = merged[f"{module}.weight"].double().numpy() - original[f"{module}.weight"].double().numpy()
        # float16 factors: within their rounding of the cut, and exact when the change's rank fits
        assert np.abs(got - cut).max() <= 2e-3 * max(np.abs(cut).max(), 1e-6) + 1e-6
        kept, total = kept + (s[:rank] ** 2).sum(), total + (s ** 2).sum()
    assert f"keeps {kept / total:.1%} of the {len(changes)} linear layers' change" in said
    if rank >= true_rank:
        assert f"keeps 100.0%" in said
    for key, weight in merged.items():  # what an adapter cannot carry stays the base's
        if key not in {f"{m}.weight" for m in changes}:
            assert torch.equal(weight, original[key]), key


def test_an_agent_without_its_training_config_or_into_an_existing_folder_is_refused(models_home, tmp_path):
    base = Path(resolve_model("tiny"))
    _tuned(base, tmp_path / "tuned", 0, 1)
    (tmp_path / "taken").mkdir()
    from prompt_r1.cli import app

    result = CliRunner().invoke(app, ["export", str(tmp_path / "tuned"), str(tmp_path / "taken"), "--adapter-only",
                                      "--rank", "2"])
    assert result.exit_code != 0 and "exists; name a new folder" in " ".join(result.output.split())
    (tmp_path / "tuned" / TRAINING_CONFIG).unlink()
    result = CliRunner().invoke(app, ["export", str(tmp_path / "tuned"), str(tmp_path / "out"), "--adapter-only",
                                      "--rank", "2"])
    assert result.exit_code != 0 and "carries no training config naming agent.model" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(app, ["export", str(tmp_path / "tuned"), str(tmp_path / "out"), "--rank", "2"])
    assert result.exit_code != 0 and "pass it with --adapter-only" in " ".join(result.output.split())
