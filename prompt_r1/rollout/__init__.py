"""Rollout: the multi-turn agent <-> environment episode, and its Ray actor pool.

Owns `episode` (one batch of Prompt-R1 episodes: agent turns from a policy, replies from an
environment, masks and scores) and `ray_pool` (the same episodes spread over Ray actors, each
with a policy copy that receives weight broadcasts).

Imports: `prompt_r1.core`, `prompt_r1.config`, `prompt_r1.models`, `prompt_r1.env`,
`prompt_r1.policy`.
"""
