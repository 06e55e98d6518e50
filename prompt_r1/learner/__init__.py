"""Learner: the role that changes the agent's weights.

Owns `grpo_learner` (policy, frozen reference, AdamW: a batch of trajectories -> optimiser
steps, in four parts whose state is `update_state`), `policy_build` (the policy and its reference,
laid out over the ranks), `weights_out` (the weight sync and the merged weights) with `sync_copy`
(their one-buffer cast copy), `finite` (a non-finite update stops the run), `advantages` (the group-relative advantages), `devices` (`train.device` and the autocast
dtype), `batches` (mini-batch plan, its split over ranks, micro-batches), `collectives` (what one
rank or N call to agree: ddp, fsdp), `ray_group` (N learner ranks as Ray actors) with
`rank_gpus` (which GPUs a rank sees), `base` (the one interface a run has to its learner: in this
process or a Ray group) and `checkpoint` (the learner's state: resume exactly at any world size).

Imports: `core`, `config`, `models`, `cluster`.
"""
