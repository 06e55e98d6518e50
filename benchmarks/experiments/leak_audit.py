"""Read the leak indicators of a learning experiment question by question.

The registered leak check (`benchmarks/experiments/learning.py`, `LEAKS`) compares shares; a share
says nothing of why an answer was flagged. Up to recipe 3, `answer_unseen` flagged an answer naming
a gold that no reply named as whole words (`prompt_r1.core.metrics.mentions`), so a reply saying
"the European continent" left the answer "Europe" flagged as much as a bare guess. This prints, per arm,
every probe answer a leak flags after training (and whether it was flagged before), with its calls
and replies, and sorts the `answer_unseen` ones into those where a reply named the gold in a derived
form (European, Asia-Pacific) and the rest. It changes no verdict. From recipe 4 on, `answer_unseen`
itself counts derived forms as seen (`prompt_r1.core.metrics.mentions_in_some_form`), so there
every flagged answer reads `unsupported`.

    .venv/bin/python -m benchmarks.experiments.leak_audit benchmarks/results/first-call/follow-up/learning.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prompt_r1.core.metrics import mentions, mentions_in_some_form

LEAKS = ("bridge_before_reply", "answer_unseen")


def derived_in_reply(gold: str, replies: list[str]) -> bool:
    """Some reply names the gold in any form (`mentions_in_some_form`, the rule the indicator itself
    uses since recipe 4): on an answer the whole-words rule flagged, a derived form such as
    "European" for Europe or "Asia-Pacific" for Asia.

    >>> derived_in_reply("Europe", ["Finland is a member of the European continent."])
    True
    >>> derived_in_reply("Asia", ["Japan is in the Asia-Pacific region."])
    True
    >>> derived_in_reply("Europe", ["Italy is located in the western hemisphere."])
    False
    """
    return any(mentions_in_some_form(r, [gold]) for r in replies)


def kind(row: dict) -> str:
    """Why `answer_unseen` flagged this answer: `derived` (a reply named a form of a gold the
    answer names) or `unsupported` (no reply named it in any form)."""
    named = [g for g in row["golds"] if mentions(row["answer"] or "", [g])]
    return "derived" if any(derived_in_reply(g, row["replies"]) for g in named) else "unsupported"


def audit(saved: dict) -> dict[str, dict]:
    """Per arm and leak: the flagged question ids before and after, and for `answer_unseen` the
    count of each `kind` before and after training."""
    out = {}
    for arm, result in saved["results"].items():
        before = {r["question_id"]: r for r in result["probe_before"]}
        after = result.get("probe_after") or []
        entry = {}
        for leak in LEAKS:
            flagged = {"before": [r for r in before.values() if r.get(leak)], "after": [r for r in after if r.get(leak)]}
            entry[leak] = {when: sorted(r["question_id"] for r in rows) for when, rows in flagged.items()}
            if leak == "answer_unseen":
                entry[leak]["kinds"] = {when: {k: [kind(r) for r in rows].count(k) for k in ("derived", "unsupported")}
                                        for when, rows in flagged.items()}
        out[arm] = entry
    return out


def print_audit(saved: dict) -> None:
    summary = audit(saved)
    for arm, result in saved["results"].items():
        before = {r["question_id"]: r for r in result["probe_before"]}
        n = len(result["probe_before"])
        for leak in LEAKS:
            figures = summary[arm][leak]
            kinds = figures.get("kinds")
            said = {when: f" ({kinds[when]['derived']} derived, {kinds[when]['unsupported']} unsupported)" if kinds
                    else "" for when in ("before", "after")}
            print(f"{arm}: {leak} {len(figures['before'])}/{n} before{said['before']} -> "
                  f"{len(figures['after'])}/{n} after{said['after']}")
            for row in (r for r in result.get("probe_after") or [] if r.get(leak)):
                was = "flagged before too" if before[row["question_id"]].get(leak) else "new"
                label = f", {kind(row)}" if leak == "answer_unseen" else ""
                print(f"  {row['question_id']} ({row.get('relation')}, {was}{label}): answer {row['answer']!r}, "
                      f"golds {row['golds']}")
                for prompt, reply in zip(row["prompts"], row["replies"]):
                    print(f"      asked {prompt!r}\n      reply {reply!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("learning_json", type=Path, help="an experiment's learning.json")
    print_audit(json.loads(parser.parse_args().learning_json.read_text()))


if __name__ == "__main__":
    main()
