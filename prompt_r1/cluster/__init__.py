"""Cluster: reaching Ray and placing actors on it, for every role that runs as Ray actors.

Owns `connect` (a local Ray instance of this process's own, or a cluster's address, within
deadlines), `placement` (placement groups reserved and released with deadlines),
`engine_placement` (the bundle each engine asks for, colocation with the learner's GPUs, where an
actor landed), `actor_env` (the driver's settings and secrets handed to actors) and `actor_group`
(`ActorGroup`: N actors of one role, started, gathered under a deadline and stopped one way). The
rollout pool, the learner group and the evaluation engines each hold an `ActorGroup`; it knows
nothing of them.

Imports: `prompt_r1.core`, `prompt_r1.config`.
"""
