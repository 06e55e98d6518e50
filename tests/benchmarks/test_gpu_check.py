"""The GPU check (benchmarks/gpu/gpu_learner.py, scripts/gpu_check.sh) without a GPU: CI has none.

Both refuse cleanly (exit 2, a message naming CUDA) instead of timing the CPU; the batches they
build follow the protocol's masks and give every group non-zero advantages; and the measuring
code runs end to end on the tiny model (on CPU, the path `main` never takes) so it cannot rot
between the rare runs on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _script():
    from benchmarks.gpu import gpu_learner

    return gpu_learner


def _no_cuda_env() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}


def test_script_refuses_without_cuda(monkeypatch, capsys):
    gpu_learner = _script()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_learner.main(["--shape", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "CUDA" in err and "grpo_step.py" in err


def test_shell_check_refuses_without_cuda(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          env={**_no_cuda_env(), "GPU_CHECK_OUT": str(out)}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a CUDA GPU" in done.stderr and "nothing was measured" in done.stderr
    assert not out.exists()  # refused before measuring or writing anything


class _Vocab:
    def __len__(self) -> int:
        return 1000


def test_batches_are_protocol_shaped():
    gpu_learner = _script()
    args = gpu_learner.parse_args(["--shape", "tiny", "--questions", "3", "--group", "4",
                                   "--max-response-tokens", "600"])
    batch = gpu_learner.make_batch(_Vocab(), args)
    assert len(batch) == 12
    for q in range(3):
        group = [t for t in batch if t.question_id == f"q{q}"]
        assert len({tuple(t.prompt_ids) for t in group}) == 1  # one question, one prompt
        assert len({t.reward.total for t in group}) > 1  # non-zero advantages
    for t in batch:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) <= 600
        assert t.loss_mask[0] == 1 and t.loss_mask[-1] == 1  # starts with an agent turn, ends with the answer
        assert 0 in t.loss_mask  # at least one inserted environment reply
        assert all((lp < 0) == (m == 1) for lp, m in zip(t.logprobs, t.loss_mask))
        assert all(100 <= i < 1000 for i in t.prompt_ids + t.token_ids)


def test_measurement_runs_on_cpu(tiny_model_path, tmp_path):
    gpu_learner = _script()
    out = tmp_path / "figures.json"
    args = gpu_learner.parse_args([
        "--model", str(tiny_model_path), "--questions", "2", "--group", "2", "--prompt-tokens", "8", "12",
        "--agent-turn-tokens", "3", "6", "--env-reply-tokens", "3", "6", "--env-calls", "1", "2",
        "--dtype", "float32", "--no-gradient-checkpointing", "--lr", "1e-3", "--steps", "1", "--no-sync",
        "--json", str(out)])
    result = gpu_learner.run(args, device="cpu")
    assert result["loss_finite"] and result["changed_fraction"] > 0.5
    assert result["steps"] == 1 and result["tokens_per_s"] > 0 and result["random_init"] is False
    assert out.exists()


@pytest.mark.parametrize("shape", ["smollm2-135m", "qwen3-0.6b", "qwen3-1.7b"])
def test_shapes_have_the_published_sizes(shape):
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(_script().SHAPES[shape])
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    assert millions == pytest.approx({"smollm2-135m": 134.5, "qwen3-0.6b": 596.0, "qwen3-1.7b": 1720.6}[shape], abs=0.1)


def test_model_flops_match_a_flop_counter(tiny_model_path):
    """MFU's numerator against torch's own count of one forward pass (eager attention, whose full
    score matrices count twice the causal half the formula charges)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    gpu_learner = _script()
    args = gpu_learner.parse_args(["--shape", "tiny", "--questions", "2", "--group", "2", "--prompt-tokens", "8", "12",
                                   "--agent-turn-tokens", "3", "6", "--env-reply-tokens", "3", "6"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="eager")
    batch = gpu_learner.make_batch(_Vocab(), args)
    counted = 0
    for t in batch:
        ids = torch.tensor([t.prompt_ids + t.token_ids]) % model.config.vocab_size
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(input_ids=ids)
        counted += counter.get_total_flops()
    c = model.config
    width = c.num_hidden_layers * c.num_attention_heads * (c.hidden_size // c.num_attention_heads)
    causal_half = sum(2 * width * (len(t.prompt_ids) + len(t.token_ids)) ** 2 for t in batch)
    assert gpu_learner.model_flops(model, batch) / 4 == pytest.approx(counted - causal_half, rel=1e-3)


def test_driver_refuses_without_cuda(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--out", str(out),
                           "--tokenizer", str(tmp_path)], capture_output=True, text=True, env=_no_cuda_env(), timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "CUDA" in done.stderr and "--dry-run" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("cap", ["z=30", "d=", "d=soon", "d"])
def test_a_bad_cap_is_refused_before_anything_runs(tmp_path, cap):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--out", str(out),
                           "--tokenizer", str(tmp_path), "--cap", "e=180", "--cap", cap],
                          capture_output=True, text=True, env=_no_cuda_env(), timeout=300, cwd=ROOT)
    assert done.returncode == 2 and f"--cap {cap!r}: expected PART=SECONDS" in done.stderr
    assert "peak, a, b, c, d, e" in done.stderr and not out.exists()


@pytest.mark.slow
def test_dry_run_runs_every_part(tiny_model_path, tmp_path):
    """`scripts/gpu_check.sh --dry-run`: the same unstaging (a stage holding a tokenizer folder), the
    same driver and parts, on CPU at tiny shapes, in a venv that sees only the GPU machine's packages:
    an import the host lacks or a wrong path fails here, not on the GPU."""
    import json
    import tarfile

    spec = importlib.util.spec_from_file_location("gpu_stage", ROOT / "scripts" / "gpu_stage.py")
    gpu_stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_stage)
    tar = tmp_path / "smollm2-tokenizer.tar"
    with tarfile.open(tar, "w") as t:
        for f in Path(tiny_model_path).iterdir():
            if "token" in f.name or f.name == "chat_template.jinja":
                t.add(f, arcname=f"smollm2-tokenizer/{f.name}")
    gpu_stage.pack([tar], tmp_path / "stage", 2**20)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_STAGE": str(tmp_path / "stage"),
           "GPU_STAGE_TARGET": str(tmp_path / "site"), "GPU_CHECK_OUT": str(out),
           "GPU_CHECK_SIM": str(tmp_path / "sim"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                          text=True, env=env, timeout=3000, cwd=ROOT)
    results = json.loads((out / "gpu_check.json").read_text())
    failed = {k: v.get("error") for k, v in results.items() if isinstance(v, dict) and v.get("status") != "ok"}
    assert done.returncode == 0 and not failed, (failed, done.stdout[-3000:], done.stderr[-3000:])
    assert results["dry_run"] is True and set("abcdef") <= set(results)
    assert not [row for row in results["a"]["result"].values() if "error" in row]  # every row of part a ran
    assert results["b"]["result"]["project"]["resumed_equal"]  # the learner's own ShardedRanks ran
    assert set(results["f"]["result"]["arms"]) == {"trained", "control"}
    c = results["c"]["result"]
    assert c["resumed"] and c["finished"] and c["sampled_by_previous_version"]
    assert results["e"]["result"]["measured"][1]["bytes"] < results["e"]["result"]["measured"][0]["bytes"]
    assert "| part | status |" in done.stdout and (out / "gpu_check.log").exists()


def test_a_parts_commands_share_its_deadline(tmp_path):
    """A part's cap bounds all its commands together (three shapes of part a cannot take three caps),
    and a command past it is killed and reported, not waited for."""
    from benchmarks.gpu import gpu_check
    runner = gpu_check.Runner(tmp_path / "x.log", dict(os.environ), budget_s=60, caps={"x": 2, "y": 30})
    runner.start("x")
    assert runner.run(["sleep", "0.1"], runner.left("x")).returncode == 0
    with pytest.raises(TimeoutError):
        runner.run(["sleep", "30"], runner.left("x"))
    assert runner.left("x") == 0  # the next command of this part gets nothing
    runner.start("y")
    assert 25 < runner.left("y") <= 30


def test_each_run_fits_about_ten_minutes_and_every_part_runs_once():
    """The three runs cover every part once, part a's headline shape first, and each run's caps sum
    to at most ten minutes (a run's deadline is that sum)."""
    from benchmarks.gpu import check_parts, gpu_check

    parts = "".join(p for p, _ in gpu_check.RUNS.values())
    assert sorted(parts.replace("f", "", 1)) == sorted(gpu_check.PARTS)  # f is split over two runs
    for name, (run_parts, _) in gpu_check.RUNS.items():
        assert gpu_check.CAPS["peak"] + sum(gpu_check.CAPS[p] for p in run_parts) <= 600, name
    assert check_parts.A_ROWS[0][1] == "qwen3-1.7b"
    assert {arm for _, arms in gpu_check.RUNS.values() for arm in arms} == {"trained", "control"}


def test_run_and_parts_are_exclusive(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.gpu_check", "--out", str(tmp_path / "out"),
                           "--tokenizer", str(tmp_path), "--run", "learner", "--parts", "ab"],
                          capture_output=True, text=True, env=_no_cuda_env(), timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "--run chooses the parts" in done.stderr
