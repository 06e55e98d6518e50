"""The packing / chunked-logits benchmark (benchmarks/speed/learner_packing.py) in its quick form on
the tiny bundled model, so the script cannot rot between real measurements: every arm is timed,
all arms give the baseline's first step (the script's own equality check), and on an uneven batch
the packed arms run fewer tokens, with less padding, than padded micro-batches.

One torch thread: on a loaded 2-core machine (the suite runs two workers) two OpenMP threads
spin against each other and the tiny model's steps take seconds instead of tenths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_reports_every_arm(_model_cache, tmp_path):
    out = tmp_path / "packing.json"
    # the session's model cache (PROMPT_R1_MODELS, set by the fixture) reaches the script's process
    done = subprocess.run([sys.executable, "-m", "benchmarks.speed.learner_packing", "--model", "tiny-protocol",
                           "--quick", "--threads", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all equal" in done.stdout
    report = json.loads(out.read_text())
    assert report["equal_first_step"] is True
    arms = report["arms"]
    assert len(arms) == 4
    base, chunked, packed, both = arms.values()
    assert base["pack_tokens"] == chunked["pack_tokens"] == 0 < packed["pack_tokens"] == both["pack_tokens"]
    assert base["logits_chunk_tokens"] == packed["logits_chunk_tokens"] == 0 < chunked["logits_chunk_tokens"]
    for arm in arms.values():
        assert arm["step_s"] > 0 and arm["ratio"] > 0 and len(arm["step_times_s"]) == report["repeats"]
        assert arm["real_tokens"] == report["real_tokens"]  # every trajectory, once
        assert arm["largest_vocab_tensor_bytes"] > 0
    assert base["ratio"] == 1.0
    # the uneven batch pads: packing runs every real token and nothing else
    assert base["padding_share"] > 0.1
    for arm in (packed, both):
        assert arm["padding_share"] == 0.0 < base["padding_share"]
        assert arm["positions"] == arm["real_tokens"] < base["positions"]
        assert arm["tokens_per_pass"] < base["tokens_per_pass"]  # even against a group's prompt run once
        assert arm["logit_positions"] < base["logit_positions"]
    # chunks bound the vocabulary-wide tensors: at most rows x chunk x vocab at once
    assert chunked["largest_vocab_tensor_bytes"] < base["largest_vocab_tensor_bytes"]
