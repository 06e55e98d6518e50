"""The pure core: what the paper states exactly, with no model, config or I/O.

Owns the Prompt-R1 protocol (`protocol`), the dual-constrained reward (`reward`), the answer
metrics (`metrics`), the GRPO maths (`grpo`), the records a rollout produces (`trajectory`), the
question type (`questions`), the one seed rule (`seeding`), token conventions (`tokens`), the
failure-rate rule and the user-error marker (`failures`), the one atomic write (`fsutil`) and
the SIGTERM rule (`signals`).

Imports: nothing else of `prompt_r1` (the bottom layer); `warehouse/` builds on it.
"""
