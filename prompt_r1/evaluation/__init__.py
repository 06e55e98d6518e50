"""Evaluation: methods x datasets x environment LLMs, with intervals, comparisons and reports.

Owns `evaluate` (the cells and their one scoring path), `questions` (which questions it asks),
`engines` (the agent engines, in this process or as Ray actors), `answers` (each method's rule
for its prediction), `scoring` (scored rows from predictions), `stats` (bootstrap intervals,
paired tests), `compare` (trained agent against every other method), `heldout` (environments the
agent never trained on), `training_effect` (base beside trained; its figure: `effect_plot`), `turns` (what the agent did
with the environment), `report` (tables and figures) and `baselines` (OPRO, GEPA, TextGrad).

Imports: everything below it: `core`, `config`, `data`, `models`, `env`, `policy`, `rollout`,
and `warehouse`; never `training`.
"""
