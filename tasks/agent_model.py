"""A registered agent (`prompt-r1-<config name>`, a config's registered model) as a real MLflow
model (pyfunc flavour).

A version holds the agent's HF folder (artifact `agent`) and the config it was trained with
(artifact `config`), so `mlflow.pyfunc.load_model("models:/prompt-r1-demo@champion")` gives
an object whose `predict` answers questions against an environment LLM, and
`mlflow models serve -m models:/prompt-r1-demo@champion --env-manager local` serves it.

The environment is chosen, in this order: `params={"environment": NAME}` or
`params={"env_base_url": URL, "env_model": MODEL}` (any OpenAI-compatible endpoint) at predict
time; `model_config={"environment": NAME or {EnvConfig fields}}` at load time; else the config's
training environment. Input: a DataFrame (or dict) with a `question` column, a list of strings
or one string. Output: one row per question with the answer, stop reason, token counts, cost
and the episode as JSON. Questions of one call share the agent's generation batches.

This wrapper lives outside `prompt_r1/` because the library never imports MLflow.
"""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import mlflow.pyfunc

PARAMS = {"environment": "", "env_base_url": "", "env_model": ""}


class AgentModel(mlflow.pyfunc.PythonModel):
    """pyfunc model: question(s) in, the agent's answers (and episodes) out."""

    def load_context(self, context: Any) -> None:
        import yaml

        from prompt_r1.serving.service import BatchingPolicy
        from prompt_r1.config.experiment import parse_config
        from prompt_r1.evaluation.evaluate import eval_agent
        from prompt_r1.policy import make_policy

        self.agent_dir = Path(context.artifacts["agent"])
        self.cfg = parse_config(yaml.safe_load(Path(context.artifacts["config"]).read_text()) or {})
        self.default_env = self._env_config((context.model_config or {}).get("environment"))
        self.policy = BatchingPolicy(make_policy(eval_agent(self.cfg), self.agent_dir, seed=self.cfg.seed))
        # One event loop for the model's life: async environment clients stay on the loop they started on.
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="agent-model-loop", daemon=True).start()
        self.stack = ExitStack()
        self.envs: dict[str, Any] = {}
        self.lock = threading.Lock()

    def _env_config(self, spec: Any):
        """EnvConfig from a name in the config, a dict of EnvConfig fields, or None (training env)."""
        from prompt_r1.serving.service import pick_environment
        from prompt_r1.config.env import EnvConfig

        if isinstance(spec, dict):
            return EnvConfig(**spec)
        try:
            return pick_environment(self.cfg, spec or None)
        except KeyError as err:
            raise ValueError(err.args[0]) from None

    def _environment(self, env_cfg: Any) -> Any:
        from prompt_r1.env import open_environment

        key = env_cfg.model_dump_json()
        with self.lock:
            if key not in self.envs:
                self.envs[key] = self.stack.enter_context(open_environment(env_cfg))
            return self.envs[key]

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        import pandas as pd

        from prompt_r1.serving.service import answer_question, episode_report
        from prompt_r1.config.env import EnvConfig

        params = {k: v for k, v in (params or {}).items() if v}
        if params.get("env_base_url"):
            env_cfg = EnvConfig(name="request-env", kind="openai", base_url=params["env_base_url"],
                                model=params.get("env_model") or "default")
        elif params.get("environment"):
            env_cfg = self._env_config(params["environment"])
        else:
            env_cfg = self.default_env
        questions = input_questions(model_input)
        env = self._environment(env_cfg)

        async def run() -> list[dict[str, Any]]:
            trajs = await asyncio.gather(*(answer_question(self.policy, env, q, self.cfg) for q in questions))
            return [episode_report(q, t, env_cfg, str(self.agent_dir), 0.0) for q, t in zip(questions, trajs)]

        reports = asyncio.run_coroutine_threadsafe(run(), self.loop).result()
        return pd.DataFrame([{
            "question": r["question"], "answer": r["answer"], "environment": r["environment"],
            "stop_reason": r["stop_reason"], "error": r["error"] or "",
            "prompt_tokens": r["usage"]["prompt_tokens"], "completion_tokens": r["usage"]["completion_tokens"],
            "cost_usd": r["cost_usd"], "episode": json.dumps(r)} for r in reports])


def input_questions(model_input: Any) -> list[str]:
    """The questions of a predict call: a `question` column, a list of strings, or a string.

    >>> input_questions("Why?"), input_questions(["a", "b"]), input_questions({"question": ["c"]})
    (['Why?'], ['a', 'b'], ['c'])
    """
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, dict):
        value = model_input.get("question")
        return [value] if isinstance(value, str) else [str(q) for q in value or []]
    if hasattr(model_input, "columns"):
        if "question" not in model_input.columns:
            raise ValueError(f"input needs a `question` column; got columns {list(model_input.columns)}")
        return [str(q) for q in model_input["question"]]
    return [str(q) for q in model_input]


def log_agent_model(agent_dir: Path, config_yaml: Path, name: str = "agent_model",
                    registered_model_name: str | None = None) -> Any:
    """Log the agent as a pyfunc model in the active run (registering it when a name is given)."""
    import pandas as pd
    from mlflow.models import infer_signature

    example = pd.DataFrame({"question": ["What is the capital of France?"]})
    output = pd.DataFrame({"question": [""], "answer": [""], "environment": [""], "stop_reason": [""],
                           "error": [""], "prompt_tokens": [0], "completion_tokens": [0], "cost_usd": [0.0],
                           "episode": [""]})
    return mlflow.pyfunc.log_model(
        name=name, python_model=AgentModel(), artifacts={"agent": str(agent_dir), "config": str(config_yaml)},
        signature=infer_signature(example, output, params=PARAMS), registered_model_name=registered_model_name,
        pip_requirements=[])  # the serving environment is this project's own (--env-manager local)
