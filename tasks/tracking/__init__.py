"""MLflow for the flows: training runs and their identity (`runs`), evaluation runs (`eval_runs`),
agent episodes as traces (`traces`) and the model registry (`registry`).

Imports run one way: `eval_runs` -> `traces` -> `runs`, and `registry` -> `runs`. The library
(`prompt_r1/`) never imports this package; the flows plug it in.
"""
