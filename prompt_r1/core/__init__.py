"""The core: what the paper states exactly, and the small rules every layer shares; no config.

Owns the Prompt-R1 protocol (`protocol`), the dual-constrained reward (`reward`) and its cost
parts (`cost_reward`), the answer metrics (`metrics`), the GRPO maths (`grpo`), turn-level credit
(`turn_credit`), the sampler-against-learner corrections (`rollout_correction`), the records a
rollout produces (`trajectory`), the question type (`questions`), a task's own scorer (`scorer`:
the contract; `scorer_code`: which code it is; `scorer_deadline`: a deadline on each call), one
weight sync (`weights`) and its same-GPU hand-over (`device_share`), the one seed rule
(`seeding`), token conventions (`tokens`), the failure-rate rule and the user-error marker
(`failures`), URLs without credentials (`urls`), the one atomic write (`fsutil`) and the SIGTERM
rule (`signals`).

Imports: nothing else of `prompt_r1` (the bottom layer); `warehouse/` builds on it.
"""
