"""Training: the GRPO learner, the one training schedule, checkpoints and the run record.

Owns `learner` (policy, frozen reference, AdamW: a batch of trajectories -> optimiser steps),
`session` (`TrainingSession.run(hooks)`: validate, then batch -> rollout -> reward -> update ->
broadcast -> checkpoint -> export), `checkpoint` (resume exactly, export an HF folder) and
`run_record` (which run a folder belongs to).

Imports: everything below it: `core`, `config`, `data`, `models`, `env`, `policy`, `rollout`,
and `warehouse`.
"""
