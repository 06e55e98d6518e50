"""The scorer of the own-task example: how many of the asked-for fields the answer's JSON gets right.

prompt-r1 calls `score(prediction, golds, metadata)` for every non-blank answer, with the agent's
answer text, the row's gold answers (here one JSON object as text) and the row's metadata (here
`fields`, the keys to check). It returns a number in [0, 1] or, as here, a dict whose `score` is
that number and whose other entries are reported beside it. Malformed JSON is a wrong answer
(0), not an error: an exception would stop the run.
"""

import json


def _json_object(text: str) -> dict | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        value = json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _same(a, b) -> bool:
    return str(a).strip().lower() == str(b).strip().lower()


def score(prediction: str, golds: list[str], metadata: dict) -> dict:
    answer = _json_object(prediction)
    fields = metadata["fields"]
    best = 0.0
    for gold in golds:
        expected = json.loads(gold)
        if answer is not None:
            best = max(best, sum(_same(answer.get(f), expected[f]) for f in fields if f in answer) / len(fields))
    return {"score": best, "valid_json": float(answer is not None)}
