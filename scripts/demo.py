"""`make demo`: the main job on the embedded defaults (grows into the full pipeline)."""

from __future__ import annotations

import argparse
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--data", default=None, help="Also ingest this folder (e.g. ../shared/data/prompt-r1).")
    parser.add_argument("--quick", action="store_true", help="Shorter run.")
    args = parser.parse_args()
    sources = ["data/sample"] + ([args.data] if args.data else [])
    return subprocess.call([sys.executable, "-m", "prompt_r1.cli", "ingest", *sources])


if __name__ == "__main__":
    sys.exit(main())
