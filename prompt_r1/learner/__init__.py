"""Learner: the role that changes the agent's weights.

Owns `grpo_learner` (policy, frozen reference, AdamW: a batch of trajectories -> optimiser
steps, in four parts whose state is `update_state`), `devices` (`train.device` and the autocast
dtype), `batches` (mini-batch plan, its split over ranks, micro-batches), `collectives` (what one
rank or N call to agree: ddp, fsdp), `ray_group` (N learner ranks as Ray actors) with
`rank_gpus` (which GPUs a rank sees), `base` (the one interface a run has to its learner: in this
process or a Ray group) and `checkpoint` (the learner's state: resume exactly at any world size,
export an HF folder).

Imports: `core`, `config`, `models`, `cluster`.
"""
