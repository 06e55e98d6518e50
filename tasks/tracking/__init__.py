"""MLflow for the flows: training runs, their identity and the choice of the run to continue
(`runs`), evaluation runs (`eval_runs`), agent episodes as traces (`traces`) and the model registry
(`registry`, which logs the agent as `tasks.agent_model`).

Imports run one way: `eval_runs` -> `traces` -> `runs`, and `registry` -> `runs`. The library
(`prompt_r1/`) never imports this package; the flows plug it in.
"""
