"""Serving: a trained agent put to work on one question, and over an OpenAI-compatible API.

Owns `service` (`answer_question`: one multi-turn episode for a user's question, the answer and
the turns), `http` (FastAPI + uvicorn server, `prompt-r1:<environment>` models) and `observers`
(who else sees a finished episode: the `--trace` hook).

Imports: `core`, `config`, `models`, `env`, `policy`, `rollout`, `evaluation`.
"""
