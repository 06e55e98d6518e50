"""Checkpoints: an interrupted + resumed run equals an uninterrupted one; exports load anywhere."""

from __future__ import annotations

import doctest
import json

import pytest
import torch
from grpo_helpers import make_config, prompt_ids, rollout
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from prompt_r1.data import order as data_order
from prompt_r1.learner.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from prompt_r1.models.export import export_checkpoint
from prompt_r1.cli import app
from prompt_r1.data.order import batches
from prompt_r1.learner.grpo_learner import GRPOLearner

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


@pytest.mark.parametrize("lora", [False, True, "all-linear"], ids=["full", "lora", "lora-all-linear"])
def test_export_gives_a_plain_model_with_the_same_logits(tiny_model_path, tmp_path, lora) -> None:
    cfg = make_config(lora=bool(lora), lr=1e-2)
    if lora == "all-linear":
        cfg.agent.lora.target_modules = "all-linear"
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


# -- export never deletes what it did not write --------------------------------------------
def _fake_checkpoint(folder):
    folder.mkdir(parents=True)
    (folder / "trainer_state.pt").write_bytes(b"")  # enough to pass the "is a checkpoint" check
    return folder


def test_export_refuses_a_folder_with_user_files_even_with_overwrite(tmp_path) -> None:
    ckpt = _fake_checkpoint(tmp_path / "ckpt")
    target = tmp_path / "my-project"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    for extra in ([], ["--overwrite"]):
        result = CliRunner().invoke(app, ["export", str(ckpt), str(target), *extra])
        assert result.exit_code == 2, result.output
        assert "not an earlier export" in result.output
        assert (target / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "my-project"]  # no temp folders left
    plain_file = tmp_path / "file.bin"
    plain_file.write_text("x")
    result = CliRunner().invoke(app, ["export", str(ckpt), str(plain_file), "--overwrite"])
    assert result.exit_code == 2 and plain_file.read_text() == "x"


def test_export_replaces_only_an_earlier_export(tiny_model_path, tmp_path) -> None:
    from prompt_r1.models.export import EXPORT_MARKER

    cfg = make_config()
    learner = GRPOLearner(cfg, tiny_model_path)
    ckpt = save_checkpoint(learner, tmp_path / "ckpts", 1, {"position": 1}, cfg)
    target = tmp_path / "out"
    target.mkdir()  # an empty folder is fine
    assert CliRunner().invoke(app, ["export", str(ckpt), str(target)]).exit_code == 0
    assert (target / EXPORT_MARKER).is_file() and (target / "config.json").is_file()
    (target / "stale.txt").write_text("from the earlier export")
    again = CliRunner().invoke(app, ["export", str(ckpt), str(target)])
    assert again.exit_code == 2 and "--overwrite" in again.output and (target / "stale.txt").exists()
    replaced = CliRunner().invoke(app, ["export", str(ckpt), str(target), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert not (target / "stale.txt").exists() and (target / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpts", "out"]  # no temp or old folders left


# -- resume continues only the same run ------------------------------------------------------
def test_open_run_refuses_changed_or_finished_runs(tmp_path) -> None:
    from prompt_r1.training.run_folder import ResumeError, mark_finished, open_run, read_record

    run = tmp_path / "r1"
    first = open_run(run, "smoke", "cfgA", "poolP", resume=False)
    assert read_record(run) == first and first["finished_at"] is None
    with pytest.raises(ResumeError, match="already holds a run"):
        open_run(run, "smoke", "cfgA", "poolP", resume=False)
    assert open_run(run, "smoke", "cfgA", "poolP", resume=True)["config_hash"] == "cfgA"
    for cfg_hash, pool, needle in [("cfgB", "poolP", "config hash cfgA -> cfgB"),
                                   ("cfgA", "poolQ", "training pool hash poolP -> poolQ")]:
        with pytest.raises(ResumeError, match="refusing to resume") as err:
            open_run(run, "smoke", cfg_hash, pool, resume=True)
        assert needle in str(err.value) and "--force" in str(err.value)
    assert read_record(run)["config_hash"] == "cfgA"  # a refusal changes nothing
    forced = open_run(run, "smoke", "cfgB", "poolP", resume=True, force=True)
    assert forced["config_hash"] == "cfgB" and forced["forced"][0]["from_config_hash"] == "cfgA"
    assert read_record(run) == forced
    mark_finished(run)
    for force in (False, True):
        with pytest.raises(ResumeError, match="never resumed"):
            open_run(run, "smoke", "cfgB", "poolP", resume=True, force=force)


def test_find_resumable_is_the_newest_unfinished_matching_run(tmp_path) -> None:
    """Random run folders against a brute-force statement of the rule."""
    import random

    from prompt_r1.training.run_folder import find_resumable, write_record

    rng = random.Random(5)
    for case in range(60):
        root = tmp_path / f"case{case}"
        runs = []
        for i in range(rng.randint(0, 6)):
            run = {"name": f"{rng.choice('abz')}{i}", "config_hash": rng.choice(["A", "B"]),
                   "pool_hash": rng.choice(["P", "Q"]), "started_at": f"2025-01-01T00:00:{rng.randint(0, 59):02d}.{i:06d}",
                   "finished_at": rng.choice([None, "2025-01-02"])}
            write_record(root / run["name"], {k: v for k, v in run.items() if k != "name"})
            runs.append(run)
        found, skipped = find_resumable(root, "A", "P")
        eligible = [r for r in runs if r["config_hash"] == "A" and r["pool_hash"] == "P" and not r["finished_at"]]
        expected = max(eligible, key=lambda r: r["started_at"])["name"] if eligible else None
        assert found == expected, (case, runs)
        newer = [r for r in runs if expected is None or r["started_at"] > max(e["started_at"] for e in eligible)]
        assert len(skipped) == len(newer)


class _FakeSession:
    """Stands in for TrainingSession in CLI tests: runs the real identity check, trains nothing."""

    seen: list[str] = []

    def __init__(self, cfg, wh, run_id, run_dir, resume=False, force=False, questions=None):
        self.args = (cfg, wh, run_id, run_dir, resume, force, questions)

    def __enter__(self):
        from prompt_r1.training.run_folder import open_run
        from prompt_r1.data.pool import TrainingPool

        cfg, wh, run_id, run_dir, resume, force, questions = self.args
        open_run(run_dir, cfg.name, cfg.hash(), (questions or TrainingPool.load(wh, cfg)).hash, resume, force)
        _FakeSession.seen.append(run_id)
        return self

    def __exit__(self, *exc):
        return None

    def run(self, hooks=None):
        from prompt_r1.training.hooks import TrainingOutcome

        return TrainingOutcome(None, {}, {})

    def mark_finished(self):
        return None


def test_cli_resume_picks_the_same_unfinished_run(home, monkeypatch) -> None:
    from prompt_r1.training import session as train_loop
    from prompt_r1.config.experiment import load_config
    from prompt_r1.data.ingest import ingest
    from prompt_r1.data.pool import TrainingPool
    from prompt_r1.training.run_folder import write_record
    from warehouse.store import Warehouse

    monkeypatch.setattr(train_loop, "TrainingSession", _FakeSession)
    cfg = load_config("configs/smoke.yaml")
    with Warehouse(home / "warehouse.duckdb") as wh:
        ingest(wh, cfg.data.sources)
        pool = TrainingPool.load(wh, cfg).hash
    same = {"config_hash": cfg.hash(), "pool_hash": pool, "finished_at": None}
    write_record(home / "smoke" / "20250101-000000-aaaaaa", {**same, "started_at": "2025-01-01T00:00:00"})
    write_record(home / "smoke" / "20250102-000000-bbbbbb", {**same, "config_hash": "other", "started_at": "2025-01-02"})
    write_record(home / "smoke" / "20991231-000000-zzzzzz", {**same, "started_at": "2099-12-31",
                                                              "finished_at": "2099-12-31"})
    result = CliRunner().invoke(app, ["train", "-c", "configs/smoke.yaml", "--resume"])
    assert result.exit_code == 0, result.output
    assert _FakeSession.seen[-1] == "20250101-000000-aaaaaa" and "resuming run 20250101-000000-aaaaaa" in result.output

    changed = CliRunner().invoke(app, ["train", "-c", "configs/smoke.yaml", "--resume", "--set", "train.lr=0.5"])
    assert changed.exit_code == 2 and "no unfinished run" in changed.output
    assert "20991231-000000-zzzzzz: finished" in changed.output
    by_id = ["train", "-c", "configs/smoke.yaml", "--resume", "--run-id", "20250102-000000-bbbbbb"]
    refused = CliRunner().invoke(app, by_id)
    assert refused.exit_code == 2 and "refusing to resume" in refused.output
    assert CliRunner().invoke(app, [*by_id, "--force"]).exit_code == 0
    assert _FakeSession.seen[-1] == "20250102-000000-bbbbbb"
    finished = CliRunner().invoke(app, ["train", "-c", "configs/smoke.yaml", "--resume", "--force",
                                        "--run-id", "20991231-000000-zzzzzz"])
    assert finished.exit_code == 2 and "never resumed" in finished.output


def test_training_session_checks_the_run_before_loading_anything(home, warehouse) -> None:
    from prompt_r1.config.experiment import load_config
    from prompt_r1.config.run_home import run_dir
    from prompt_r1.data.ingest import ingest
    from prompt_r1.training.run_folder import ResumeError, write_record
    from prompt_r1.training.session import TrainingSession

    # an existing folder passes the spec check (a name that is no agent, or an offline hub id, fails before
    # the run is opened), but loading it would fail: it holds no model
    empty = home / "not-a-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    cfg = load_config("configs/smoke.yaml", {"agent.model": str(empty)})
    ingest(warehouse, cfg.data.sources)
    folder = run_dir(cfg.name, "r1")
    write_record(folder, {"config_hash": "old", "pool_hash": "old", "started_at": "x", "finished_at": None})
    with pytest.raises(ResumeError, match="config hash old -> "):
        with TrainingSession(cfg, warehouse, "r1", folder, resume=True):
            pass


# -- damaged checkpoints ---------------------------------------------------------------------------
def test_a_damaged_checkpoint_is_named_and_resume_falls_back_to_the_newest_intact_one(
        tiny_model_path, tmp_path, caplog) -> None:
    import logging

    from prompt_r1.learner.checkpoint import resume_checkpoint
    from prompt_r1.models.export import MANIFEST, CheckpointError, verify_checkpoint

    cfg = make_config(keep_checkpoints=3)
    learner = GRPOLearner(cfg, tiny_model_path)
    for step in (1, 2, 3):
        save_checkpoint(learner, tmp_path, step, {"position": step}, cfg)
    folders = {step: path for step, path in list_checkpoints(tmp_path)}
    for path in folders.values():
        verify_checkpoint(path)  # intact, and each carries a manifest
        assert "model.safetensors" in json.loads((path / MANIFEST).read_text())["files"]

    weights = folders[3] / "model.safetensors"  # truncated
    weights.write_bytes(weights.read_bytes()[:1000])
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint(tmp_path) == folders[2]
    assert f"checkpoint {folders[3]} is corrupted: model.safetensors has 1000 bytes" in caplog.text
    assert "resuming from step-000002, the newest intact checkpoint; passed over the corrupted step-000003" \
        in caplog.text
    assert load_checkpoint(learner, folders[2]) == (2, {"position": 2})

    state = folders[2] / "trainer_state.pt"  # same size, one byte changed
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="trainer_state.pt does not match its checksum"):
        verify_checkpoint(folders[2])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint(tmp_path) == folders[1]
    assert "passed over the corrupted step-000003, step-000002" in caplog.text

    (folders[1] / "tokenizer.json").unlink()  # a file gone
    with pytest.raises(CheckpointError, match=r"every checkpoint in .* is corrupted \(step-000003, step-000002, "
                                              r"step-000001.*drop --resume"):
        resume_checkpoint(tmp_path)
    assert resume_checkpoint(tmp_path / "none") is None

    out = CliRunner().invoke(app, ["export", str(folders[3]), str(tmp_path / "out")])
    assert out.exit_code == 2 and "step-000003 is corrupted: model.safetensors" in " ".join(out.output.split())
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_without_a_manifest_is_checked_by_reading_it(tiny_model_path, tmp_path) -> None:
    from prompt_r1.models.export import MANIFEST, CheckpointError, verify_checkpoint

    cfg = make_config()
    path = save_checkpoint(GRPOLearner(cfg, tiny_model_path), tmp_path, 1, {"position": 1}, cfg)
    (path / MANIFEST).unlink()  # as written before manifests existed
    verify_checkpoint(path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors cannot be read"):
        verify_checkpoint(path)
    state = path / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is corrupted: trainer_state.pt cannot be read"):
        verify_checkpoint(path)


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of a given size (tmpfs), so a checkpoint really runs out of space;
    skipped where mounting is not allowed (not root)."""
    import subprocess

    mounted = []

    def make(size_kib: int):
        folder = tmp_path / f"disk-{size_kib}k"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)  # lazy: a file still open never keeps it mounted


@pytest.mark.parametrize("fails_in", ["optimizer", "torch.save"])
def test_a_full_disk_during_a_checkpoint_says_so_and_keeps_nothing_half_written(
        tiny_model_path, small_disk, tmp_path, fails_in) -> None:
    """The disk fills while the optimiser state (torch.distributed.checkpoint, which wraps the
    error) or the trainer state (torch's zip writer, whose error says only `unexpected pos`) is
    written: DiskFullError says the disk is full, names the folder and `--resume`; no step folder
    and no temp folder stay behind."""
    from prompt_r1.core.failures import UserError
    from prompt_r1.learner.checkpoint import DiskFullError
    from prompt_r1.models.export import MANIFEST, STATE_FILE

    cfg = make_config()
    learner = GRPOLearner(cfg, tiny_model_path)
    learner.step(rollout(learner, ["a", "b"], group_size=2, new_tokens=3))  # optimiser state to save
    if fails_in == "optimizer":
        size_kib = 200
    else:  # room (in 4 KiB pages) for everything written before the trainer state, plus one page
        full = save_checkpoint(learner, tmp_path / "sizes", 1, {"position": 1}, cfg)
        before = sum(-(-f.stat().st_size // 4096) * 4 for f in full.rglob("*")
                     if f.is_file() and f.name not in (STATE_FILE, MANIFEST))
        size_kib = before + 4
    ckpt_dir = small_disk(size_kib) / "checkpoints"
    with pytest.raises(DiskFullError) as err:
        save_checkpoint(learner, ckpt_dir, 1, {"position": 1}, cfg)
    message = str(err.value)
    assert message.startswith("the disk is full: writing checkpoint ") and str(ckpt_dir / "step-000001") in message
    assert "--resume" in message and "there is no earlier checkpoint" in message
    assert isinstance(err.value, UserError)  # the CLI prints it as one line, exit 2
    cause = err.value.__cause__
    if fails_in == "torch.save":
        assert isinstance(cause, RuntimeError) and "unexpected pos" in str(cause)  # the fault really hit torch
    assert list(ckpt_dir.iterdir()) == []


def test_a_full_disk_keeps_the_last_checkpoint_and_resume_continues_from_it(tiny_model_path, small_disk) -> None:
    from prompt_r1.learner.checkpoint import DiskFullError

    cfg = make_config(keep_checkpoints=3)
    learner = GRPOLearner(cfg, tiny_model_path)
    learner.step(rollout(learner, ["a", "b"], group_size=2, new_tokens=3))
    ckpt_dir = small_disk(1600) / "checkpoints"  # room for one checkpoint (about 1.1 MB), not two
    save_checkpoint(learner, ckpt_dir, 1, {"position": 1}, cfg)
    with pytest.raises(DiskFullError, match="the last checkpoint is step-000001"):
        save_checkpoint(learner, ckpt_dir, 2, {"position": 2}, cfg)
    assert [p.name for p in ckpt_dir.iterdir()] == ["step-000001"]
    assert load_checkpoint(GRPOLearner(cfg, tiny_model_path), latest_checkpoint(ckpt_dir)) == (1, {"position": 1})


def test_a_failed_write_with_room_left_is_not_called_a_full_disk(tmp_path) -> None:
    from prompt_r1.learner.checkpoint import disk_full

    import shutil

    if shutil.disk_usage(tmp_path).free < 64 * 2**20:
        pytest.skip("this disk is nearly full itself")
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2")
    assert disk_full(torch_error, tmp_path) is None  # the text alone does not make a full disk
    assert disk_full(OSError(28, "No space left on device"), tmp_path).startswith("No space left on device")


def test_a_checkpoint_with_the_whole_optimiser_state_in_one_file_still_resumes(tiny_model_path, tmp_path) -> None:
    """Checkpoints written before the optimiser state was saved sharded (`optimizer/`) held it whole,
    by parameter index, in trainer_state.pt: they load as before."""
    import shutil

    from prompt_r1.learner.checkpoint import OPTIMIZER_DIR
    from prompt_r1.models.export import MANIFEST, STATE_FILE

    cfg = make_config(lr=5e-3)
    learner = GRPOLearner(cfg, tiny_model_path)
    learner.step(rollout(learner, ["a", "b"], group_size=3, new_tokens=5))
    path = save_checkpoint(learner, tmp_path, 1, {"position": 1}, cfg)
    assert (path / OPTIMIZER_DIR).is_dir()
    state = torch.load(path / STATE_FILE, weights_only=False)
    state["optimizer"] = learner.optimizer.state_dict()  # the old layout
    torch.save(state, path / STATE_FILE)
    shutil.rmtree(path / OPTIMIZER_DIR)
    (path / MANIFEST).unlink()
    for old_layout in (True, False):
        resumed = GRPOLearner(cfg, tiny_model_path)
        assert load_checkpoint(resumed, path) == (1, {"position": 1})
        mine, theirs = resumed.optimizer.state_dict(), learner.optimizer.state_dict()
        assert mine["state"].keys() == theirs["state"].keys()
        for i, entry in theirs["state"].items():
            assert all(torch.equal(value, mine["state"][i][key]) for key, value in entry.items())
        assert mine["param_groups"] == theirs["param_groups"]
        if old_layout:  # saved again: the new layout, which loads the same
            path = save_checkpoint(resumed, tmp_path / "again", 1, {"position": 1}, cfg)
            assert (path / OPTIMIZER_DIR).is_dir() and "optimizer" not in torch.load(path / STATE_FILE,
                                                                                      weights_only=False)


def test_a_refused_resume_names_the_settings_that_changed() -> None:
    """Not two hashes: each changed key with its old and new value, from the newest checkpoint's
    config.yaml; the learner's layout (outside the hash) is not named."""
    import random
    import tempfile
    from pathlib import Path

    import yaml

    from prompt_r1.config.experiment import parse_config
    from prompt_r1.learner.checkpoint import STATE_FILE
    from prompt_r1.training.run_folder import ResumeError, open_run

    rng = random.Random(7)
    changes = [("train.lr", 1e-5), ("rollout.group_size", 4), ("seed", 3), ("agent.temperature", 0.7),
               ("train.kl_coef", 0.0), ("rollout.max_turns", 3), ("environment.max_tokens", 64)]
    for case in range(12):
        old = parse_config({})
        picked = rng.sample(changes, rng.randint(1, 3))
        data = old.model_dump(mode="json")
        for key, value in picked + [("train.world_size", 2)]:  # a layout key rides along
            section, leaf = (key.split(".") + [None])[:2] if "." in key else (key, None)
            if leaf is None:
                data[section] = value
            else:
                data[section][leaf] = value
        new = parse_config(data)
        run = Path(tempfile.mkdtemp()) / "run"
        open_run(run, "smoke", old.hash(), "pool", resume=False)
        ckpt = run / "checkpoints" / "step-00002"
        ckpt.mkdir(parents=True)
        (ckpt / STATE_FILE).write_bytes(b"x")
        (ckpt / "config.yaml").write_text(yaml.safe_dump(old.model_dump(mode="json")))
        with pytest.raises(ResumeError) as err:
            open_run(run, "smoke", new.hash(), "pool", resume=True, config=new)
        text = str(err.value)
        for key, value in picked:
            assert f"{key}: " in text and f"-> {value!r}" in text, (case, key, text)
        assert "world_size" not in text and old.hash() in text and "--force" in text
