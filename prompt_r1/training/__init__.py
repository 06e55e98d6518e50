"""Training: the GRPO learner, the one training schedule, checkpoints and the run record.

Owns `learner` (policy, frozen reference, AdamW: a batch of trajectories -> optimiser steps),
`batches` (mini-batch plan, its split over ranks, micro-batches), `parallel` (the collectives of
one rank or N: ddp, fsdp), `learner_group` (N learner ranks as Ray actors), `learners` (the one
interface a run has to its learner), `session` (`TrainingSession.run(hooks)`: validate, then
batch -> rollout -> reward -> update -> broadcast -> checkpoint -> export), `hooks` (the extension
points around that schedule), `run_ahead` (batches in flight while the learner trains, within
`rollout.max_staleness`), `checkpoint` (resume
exactly at any world size, export an HF folder), `run_record` (which run a folder belongs to),
`memory` (what each process of a run holds, from the agent's shape) and `plan` (whether a config
fits the machines: placement, verdict, `train`'s check).

Imports: everything below it: `core`, `config`, `data`, `models`, `env`, `policy`, `rollout`,
and `warehouse`.
"""
