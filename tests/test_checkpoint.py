"""Checkpoints: an interrupted + resumed run equals an uninterrupted one; exports load anywhere."""

from __future__ import annotations

import doctest

import pytest
import torch
from grpo_helpers import make_config, prompt_ids, rollout
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from prompt_r1 import data_order
from prompt_r1.checkpoint import (export_checkpoint, latest_checkpoint, list_checkpoints, load_checkpoint,
                                  save_checkpoint)
from prompt_r1.cli import app
from prompt_r1.data_order import batches
from prompt_r1.trainer import GRPOLearner

QUESTIONS = [f"q{i}" for i in range(5)]
TOTAL_STEPS = 6


def test_data_order_doctests() -> None:
    assert doctest.testmod(data_order).failed == 0


def _train(cfg, model_path, ckpt_dir, stop_after: int | None = None, resume: bool = False):
    """The training loop in miniature: data order -> sampled rollout -> update -> checkpoint."""
    torch.manual_seed(123)
    learner = GRPOLearner(cfg, model_path)
    step, position = 0, 0
    if resume:
        step, data_position = load_checkpoint(learner, latest_checkpoint(ckpt_dir))
        position = data_position["position"]
    seen: list[tuple[int, list[str]]] = []
    stream = batches(QUESTIONS, 2, cfg.seed, position)
    while step < TOTAL_STEPS:
        position, batch = next(stream)
        seen.append((position, batch))
        learner.step(rollout(learner, batch, group_size=3, new_tokens=5))
        step += 1
        if step % cfg.train.checkpoint_every == 0 or step == TOTAL_STEPS:
            save_checkpoint(learner, ckpt_dir, step, {"position": position + 1}, cfg)
        if stop_after is not None and step == stop_after:
            break  # the "crash": step 5 was trained but its checkpoint was never written
    return learner, step, seen


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resume_matches_uninterrupted_run(tiny_model_path, tmp_path, lora) -> None:
    cfg = make_config(lora=lora, lr=5e-3, checkpoint_every=2, keep_checkpoints=2)
    full, full_steps, full_seen = _train(cfg, tiny_model_path, tmp_path / "a")
    _, _, first_seen = _train(cfg, tiny_model_path, tmp_path / "b", stop_after=5)
    assert latest_checkpoint(tmp_path / "b").name == "step-000004"
    assert [s for s, _ in list_checkpoints(tmp_path / "b")] == [2, 4]  # older ones pruned
    resumed, resumed_steps, resumed_seen = _train(cfg, tiny_model_path, tmp_path / "b", resume=True)
    assert resumed_steps == full_steps == TOTAL_STEPS
    assert first_seen[:4] + resumed_seen == full_seen  # no batch repeated or skipped
    assert [p for p, _ in full_seen] == list(range(TOTAL_STEPS))
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    saved = torch.load(latest_checkpoint(tmp_path / "b") / "trainer_state.pt", weights_only=False)
    assert saved["step"] == TOTAL_STEPS and saved["data_position"] == {"position": TOTAL_STEPS}
    assert (latest_checkpoint(tmp_path / "b") / "config.yaml").is_file()
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_resave_same_step_replaces_it(tiny_model_path, tmp_path) -> None:
    cfg = make_config()
    learner = GRPOLearner(cfg, tiny_model_path)
    save_checkpoint(learner, tmp_path, 3, {"position": 3}, cfg)
    save_checkpoint(learner, tmp_path, 3, {"position": 4}, cfg)
    assert load_checkpoint(learner, latest_checkpoint(tmp_path)) == (3, {"position": 4})
    assert latest_checkpoint(tmp_path / "missing") is None


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_export_gives_a_plain_model_with_the_same_logits(tiny_model_path, tmp_path, lora) -> None:
    cfg = make_config(lora=lora, lr=1e-2)
    learner = GRPOLearner(cfg, tiny_model_path)
    learner.step(rollout(learner, ["x", "y"], group_size=3, new_tokens=5))
    ckpt = save_checkpoint(learner, tmp_path / "ckpts", 1, {"position": 1}, cfg)
    result = CliRunner().invoke(app, ["export", str(ckpt), str(tmp_path / "export")])
    assert result.exit_code == 0, result.output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    assert not (tmp_path / "export" / "adapter_config.json").exists()
    ids = torch.tensor([prompt_ids(learner.tokenizer, "hello <think>")])
    learner.model.eval()
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, learner.model(input_ids=ids).logits, atol=1e-5)
    assert export_checkpoint(ckpt, tmp_path / "export2").joinpath("tokenizer_config.json").is_file()


def test_export_cli_names_a_bad_folder(tmp_path) -> None:
    result = CliRunner().invoke(app, ["export", str(tmp_path / "nope"), str(tmp_path / "out")])
    assert result.exit_code == 2 and "not a checkpoint" in result.output
