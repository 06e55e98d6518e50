"""The README's Python API example runs as written: real training, a question, an evaluation.

The example is the fenced ```python block right after the line `<!-- api-example -->` in
README.md. It runs in a fresh interpreter from the repository root, as a reader would paste it,
with its own run home (`PROMPT_R1_HOME`) and the session's model cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- api-example -->"


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    assert MARKER in text, f"README.md has no {MARKER} line before its Python API example"
    found = re.match(r"\n```python\n(.*?)\n```\n", text.split(MARKER, 1)[1], re.S)
    assert found, f"the line after {MARKER} in README.md must open a ```python block"
    return found.group(1)


def test_the_example_is_found_and_uses_the_public_api():
    code = readme_example()
    compile(code, "README.md", "exec")
    for call in ("prompt_r1.load_config(", "prompt_r1.train(", "prompt_r1.load_agent(", ".ask(",
                 "prompt_r1.evaluate("):
        assert call in code, call


def test_relative_links_in_the_readme_and_docs_point_at_files_and_headings():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


@pytest.mark.slow
def test_the_readme_python_api_example_runs(tmp_path):
    home = tmp_path / "runs"
    env = {**os.environ, "PROMPT_R1_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", readme_example()], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1800)
    assert out.returncode == 0, f"the README example failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"

    run_id = re.search(r"^run ([0-9a-f]{32}) agent in (\S+)$", out.stdout, re.M)
    assert run_id, out.stdout
    assert Path(run_id.group(2)) == home / "smoke" / run_id.group(1) / "agent"
    assert (Path(run_id.group(2)) / "config.json").is_file()
    assert re.search(r"^validation reward: -?[\d.]+ -> -?[\d.]+$", out.stdout, re.M), out.stdout
    assert re.search(r"^answer: '.*' after \d+ environment call\(s\)$", out.stdout, re.M), out.stdout
    # The evaluation table: the environment, and the methods x agents asked for.
    assert "### environment: tiny-env" in out.stdout
    header = next(line for line in out.stdout.splitlines() if line.startswith("| dataset | metric |"))
    assert {"direct", "agent:base", "agent:trained"} <= {c.strip() for c in header.split("|")}, header
    assert list((home / "smoke").glob("*/eval/*.md")), "the evaluation wrote no report"
