"""Training: the one training schedule and the run folder.

Owns `session` (`TrainingSession.run(hooks)`: validate, then batch -> rollout -> reward -> update
-> broadcast -> checkpoint -> export), `checks` (the one pre-flight before anything starts), `batch_stats` (which trajectories a step learns from, their age, the scaffolded members' numbers, the warehouse rows), `hooks` (the extension points around that schedule), `rollout_traces` (k trajectories a step as trace records),
`run_ahead` (batches in flight while the learner trains, within `rollout.max_staleness`),
`run_folder` (which run a folder belongs to, which run continues, and the one process that
owns it; a killed owner's Ray leftovers are stopped).

Imports: everything below it: `core`, `config`, `warehouse`, `data`, `models`, `env`, `policy`,
`cluster`, `rollout`, `learner`, `planning`.
"""
