"""Evaluation: methods x datasets x environment LLMs, with intervals, comparisons and reports.

Owns `evaluate` (the cells and their one scoring path), `answers` (each method's rule for its
prediction), `stats` (bootstrap intervals, paired tests), `compare` (trained agent against every
other method), `report` (tables and figures) and `baselines` (OPRO, GEPA, TextGrad).

Imports: everything below it: `core`, `config`, `data`, `models`, `env`, `policy`, `rollout`,
and `warehouse`; never `training`.
"""
