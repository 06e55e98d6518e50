"""Parameter count and layer shapes of a decoder-only LLM from its `config.json` alone.

Why it exists: `prompt-r1 plan` (and `train`'s check before any model loads, `planning.plan`)
sizes weights, gradients, optimiser state, activations and the KV cache of the agent model
without loading it: loading a 4B model to learn that it does not fit is what the plan avoids.
Everything here reads numbers; nothing imports torch.

The count covers the decoder families the project uses (Llama, Qwen2/Qwen3, Gemma 3, Mistral):
token embeddings (plus an output head unless `tie_word_embeddings`), and per layer the q/k/v/o
projections (with biases where the family has them), a gated MLP (gate, up, down), the RMSNorm
weights, and Qwen3/Gemma 3's per-head q/k norms. Mixture-of-experts configs are refused (their
expert count changes everything): pass the count (`--params`) instead.

Where the numbers come from (`architecture_for`): the model folder's `config.json` when the
folder is here (a local folder, a run id, a bundled model already built); otherwise
`architectures.json` beside this file, which holds the `config.json` numbers of the paper's agent
(`Qwen/Qwen3-4B`, not downloadable offline) and of the bundled models (so a plan needs no
minutes-long build of SmolLM2 first). A hub id not listed there has no shape: pass `--params`,
and the plan guesses a shape of that size (`Architecture.guess`) and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prompt_r1.core.failures import UserError
from prompt_r1.models.kv_cache import head_dim as config_head_dim, kv_bytes_per_token, text_config

KNOWN_FILE = Path(__file__).with_name("architectures.json")
# Families whose q/k/v projections carry a bias although their config has no `attention_bias` key.
QKV_BIAS_TYPES = ("qwen2",)
# Families with an RMSNorm over each query and key head (its weight: head_dim numbers each).
QK_NORM_TYPES = ("qwen3", "gemma3", "gemma3_text")
# Families with four norms per layer (before and after attention and MLP) instead of two.
FOUR_NORM_TYPES = ("gemma2", "gemma3", "gemma3_text")
# The linear layers of one decoder layer, as peft names them (LoRA's `target_modules`).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ArchitectureError(UserError, ValueError):
    """A model whose shape cannot be read; the message says what to pass instead."""


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only model that set its memory, and where they came from."""

    name: str
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    model_type: str = ""
    attention_bias: bool = False
    source: str = ""                 # "config.json of DIR", "known architecture", "guessed from --params"
    params_given: int | None = None  # a count from the user (`--params`) wins over the computed one
    config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_params(self) -> int:
        """Weights of one decoder layer (linear layers, biases, norms)."""
        linear = sum(a * b for a, b in self.linear_shapes().values())
        bias = 0
        if self.attention_bias:  # Llama-style: all four projections
            bias = self.q_dim + 2 * self.kv_dim + self.hidden
        elif self.model_type in QKV_BIAS_TYPES:
            bias = self.q_dim + 2 * self.kv_dim
        norms = (4 if self.model_type in FOUR_NORM_TYPES else 2) * self.hidden
        qk_norm = 2 * self.head_dim if self.model_type in QK_NORM_TYPES else 0
        return linear + bias + norms + qk_norm

    def embedding_params(self) -> int:
        """Input embeddings plus the output head when it is not tied to them."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def counted_params(self) -> int:
        """The count from the shape: embeddings, layers, the final norm.

        SmolLM2-135M: 49152 x 576 tied embeddings + 30 layers + 576 = 134,515,008 (its weights file holds as many).

        >>> known_architecture("smollm2-135m-instruct").counted_params
        134515008
        """
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden

    @property
    def params(self) -> int:
        return self.params_given if self.params_given is not None else self.counted_params

    def lora_params(self, r: int, targets: list[str] | str) -> int:
        """Trainable weights of LoRA adapters of rank `r` on `targets` (names, or `all-linear`):
        r x (in + out) per adapted linear layer. Names this shape does not know count 0 (peft would
        match them against the real model; an adapter is small next to the model anyway)."""
        shapes = self.linear_shapes()
        names = LINEAR_NAMES if targets == "all-linear" else [t for t in targets if t in shapes]
        per_layer = sum(r * sum(shapes[n]) for n in names)
        return self.layers * per_layer

    def kv_config(self) -> dict[str, int]:
        """The `config.json` keys `models.kv_cache` sizes a KV cache from."""
        return {"num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "hidden_size": self.hidden}

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes of one token over all layers (`models.kv_cache`, the one rule)."""
        return kv_bytes_per_token(self.kv_config(), dtype_bytes)

    def with_params(self, params: int | None) -> "Architecture":
        """This shape with a count from the user (None: keep the computed one)."""
        return self if params is None else replace(self, params_given=int(params))

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str, source: str) -> "Architecture":
        """The shape in a HF `config.json` (its text part, for multimodal configs)."""
        if not isinstance(config, dict) or not isinstance(text_config(config), dict):
            part = "its `text_config`" if isinstance(config, dict) else "the file"
            raise ArchitectureError(f"{name}: {source} is not a model config: {part} holds a JSON "
                                    f"{_json_kind(text_config(config) if isinstance(config, dict) else config)}, "
                                    "not an object of keys; fix the file or pass --params (e.g. --params 4e9)")
        text = text_config(config)
        experts = text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts")
        if experts:
            raise ArchitectureError(f"{name}: {source} describes a mixture-of-experts model ({experts} experts), "
                                    "which the plan cannot size from its shape; pass the parameter count "
                                    "(--params, e.g. --params 30e9)")
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
        missing = [k for k in need if not text.get(k)]
        if missing:
            raise ArchitectureError(f"{name}: {source} lacks {', '.join(missing)}, so its size cannot be "
                                    "computed; pass the parameter count (--params, e.g. --params 4e9)")
        for key in (*need, "num_key_value_heads", "head_dim"):
            value = text.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ArchitectureError(f"{name}: {source} field `{key}` is {value!r}, not a positive whole "
                                        "number; fix the file or pass --params (e.g. --params 4e9)")
        return cls(
            name=name, vocab=int(text["vocab_size"]), hidden=int(text["hidden_size"]),
            layers=int(text["num_hidden_layers"]), intermediate=int(text["intermediate_size"]),
            heads=int(text["num_attention_heads"]),
            kv_heads=int(text.get("num_key_value_heads") or text["num_attention_heads"]),
            head_dim=int(config_head_dim(text)),
            tied=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", True))),
            model_type=str(text.get("model_type", "")), attention_bias=bool(text.get("attention_bias", False)),
            source=source, config=text)

    @classmethod
    def guess(cls, params: float, name: str) -> "Architecture":
        """A Qwen3-like shape of about `params` weights, for a model with no `config.json` here.

        Layers grow with size as in the Qwen3 family (hidden = 64 x layers rounded to 128, MLP
        3.8 x hidden, heads of 128, 8 KV heads, a 151,936-token vocabulary, tied embeddings); the
        count itself is `params` exactly. Activations, logits and the KV cache follow the guessed
        shape, so they are rough; the plan says so.

        >>> g = Architecture.guess(4e9, "x"); (g.params, 30 <= g.layers <= 48, g.head_dim)
        (4000000000, True, 128)
        """
        if params < 1e6:
            raise ArchitectureError(f"--params {params:g}: a model of under a million weights is no LLM; "
                                    "give the count, e.g. --params 4e9")
        layers = 1
        while True:
            shape = _qwen3_like(layers, name)
            if shape.counted_params >= params or layers >= 200:
                return replace(shape, params_given=int(params))
            layers += 1


def _json_kind(value: Any) -> str:
    """JSON's name for a parsed value's type.

    >>> _json_kind([1]), _json_kind("x"), _json_kind(None)
    ('list', 'string', 'null')
    """
    kinds = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _qwen3_like(layers: int, name: str) -> Architecture:
    hidden = max(128, 128 * round(64 * layers / 128))
    return Architecture(name=name, vocab=151936, hidden=hidden, layers=layers,
                        intermediate=128 * math.ceil(3.8 * hidden / 128), heads=hidden // 128,
                        kv_heads=min(8, hidden // 128), head_dim=128, tied=True, model_type="qwen3",
                        source="guessed from --params (no config.json): a Qwen3-like shape")


def known_architecture(spec: str) -> Architecture | None:
    """The shape `architectures.json` lists for agent spec `spec`, or None."""
    known = json.loads(KNOWN_FILE.read_text())
    config = known.get(spec)
    if not isinstance(config, dict):
        return None
    return Architecture.from_config(config, spec, f"the known architecture of {spec} "
                                    f"(prompt_r1/models/{KNOWN_FILE.name})")


def folder_architecture(folder: Path, name: str) -> Architecture | None:
    """The shape in `folder/config.json`, or None when the folder has none."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise ArchitectureError(f"{name}: {path} is not valid JSON ({err}); pass --params instead") from None
    return Architecture.from_config(config, name, f"config.json of {folder}")


def architecture_for(spec: str, config_name: str | None = None, agent: bool = True) -> Architecture | None:
    """The shape of the model `spec` names, without building or loading it.

    A bundled model: its built folder if there is one, else the known architecture. An agent spec
    (`agent`) goes through the one agent resolver (`models.resolver`: a folder, a run id, a
    registry URI), an environment model is a folder or a name; a hub id has the known
    architecture or none (None)."""
    from prompt_r1.models.bundled import BUNDLED_NAMES, bundled_folder
    from prompt_r1.models.resolver import resolve_agent

    if spec in BUNDLED_NAMES:
        return folder_architecture(bundled_folder(spec), spec) or known_architecture(spec)
    if agent:
        folder: Path | str = resolve_agent(spec, config_name=config_name)
    else:
        folder = Path(spec).expanduser() if Path(spec).expanduser().is_dir() else spec
    if isinstance(folder, Path):
        return folder_architecture(folder, spec) or known_architecture(spec)
    return known_architecture(spec)
