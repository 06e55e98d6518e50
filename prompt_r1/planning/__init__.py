"""Planning: whether a config fits the machines, before any model loads.

Owns `memory` (what each process of a run holds, from the agent's shape, and the GPU-memory
share of evaluation's in-process agent engines), `plan` (placement and verdict on any machine it
is given), `fixes` (the settings that would make a config fit) and `machine` (the machine at
hand and the pre-flight check `train` and `evaluate` run). It serves
`train`, `evaluate` and `prompt-r1 plan` alike.

Imports: `core`, `config`, `models`, `env`, `cluster`, `learner`.
"""
