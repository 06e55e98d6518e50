"""Write `docs/config.md` from the typed config models (`prompt_r1.config.docs`).

    .venv/bin/python scripts/config_docs.py           # rewrite the page
    .venv/bin/python scripts/config_docs.py --check   # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prompt_r1.config.docs import render_config_docs  # noqa: E402

PAGE = ROOT / "docs" / "config.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="Only compare; exit 1 when the page differs.")
    args = parser.parse_args()
    text = render_config_docs()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text() == text
        print(f"{PAGE.relative_to(ROOT)} is {'up to date' if same else 'out of date: run scripts/config_docs.py'}")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
