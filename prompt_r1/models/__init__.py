"""Model folders: the bundled offline models, the format warm start, and the one agent resolver.

Owns `bundled` (SmolLM2 / Gemma GGUF packages and tiny random models as HF folders), `warm_start`
(supervised steps that teach a tiny model the turn shapes), `resolver` (agent spec -> folder:
bundled name, folder, run id, `models:/` URI through a registered scheme, hub id),
`kv_cache` (the KV-cache bytes a vLLM engine on CPU needs, from a folder's `config.json`) and
`architecture` (parameter count and layer shapes from `config.json` alone, or from
`architectures.json` for models not on this machine, such as the paper's Qwen3-4B), `export`
(a checkpoint's manifest and its export to a plain HF model), `adapter` (a LoRA adapter folder
as an agent), `adapter_extract` (a full-weight agent kept as a LoRA adapter: each linear layer's
change cut to a rank) and `agent_files` (the files that mark an agent folder).

Imports: `prompt_r1.core`, `prompt_r1.config`.
"""
