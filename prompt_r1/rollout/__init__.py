"""Rollout: the multi-turn agent <-> environment episode, and its Ray actor pool.

Owns `episode` (one batch of Prompt-R1 episodes: agent turns from a policy, replies from an
environment, masks), `reward_stage` (the one place a batch of trajectories is scored),
`scaffold` (a task's proposed first turn for some group members), `progress` (how far a rollout has got), `worker` (the Ray actor that runs episodes with its own policy
copy) and `pool` (the same episodes spread over those actors, each receiving weight broadcasts).

Imports: `prompt_r1.core`, `prompt_r1.config`, `prompt_r1.models`, `prompt_r1.env`,
`prompt_r1.policy`, `prompt_r1.cluster`.
"""
