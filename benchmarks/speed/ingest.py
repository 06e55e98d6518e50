"""Ingestion speed: the bulk path (`prompt_r1.data.ingest`) against a row-by-row baseline, one process.

The baseline is the write path ingestion used before it went bulk: the same rows inserted with
one `executemany` parameter set per row (`INSERT ... ON CONFLICT`), one transaction per file. Both
write a fresh warehouse file in a temporary folder; reading and checking the rows is the same
code in both, so the ratio is the price of writing row by row. Measured:

1. the 13 Prompt-R1 files (3584 rows), cold (first ingest in this process, imports included) and
   warm, and the second ingest (every file already there);
2. a generated Prompt-R1-layout Parquet file and a JSONL file of `--rows` rows (default 100k),
   plus re-ingesting the Parquet file with every 10th gold answer corrected (updates in place).
   The baseline ingests files made the same way with only `--baseline-rows` rows (it needs
   several ms a row); the ratio compares rows per second.

    .venv/bin/python -m benchmarks.speed.ingest --data path/to/prompt-r1-data --rows 100000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import duckdb

from prompt_r1.data.ingest import discover, ingest
from prompt_r1.data.rows import source_hash
from prompt_r1.data.files import READERS
from prompt_r1.core.protocol import build_agent_prompt
from warehouse.store import Warehouse


def row_by_row(wh: Warehouse, files: list[Path]) -> int:
    """The baseline: rows read as the bulk path reads them, written one parameter set at a time."""
    n = 0
    for path in files:
        rows = READERS[path.suffix](path.resolve()).to_pylist()
        with wh.transaction() as cur:
            cur.executemany(
                "INSERT INTO questions VALUES (?,?,?,?,?,?,?,?,?,?,now()) ON CONFLICT DO NOTHING",
                [(r["question_id"], r["dataset"], r["split"], r["question"], r["golds"], r["task_family"],
                  r["primary_metric"], str(path), source_hash(path), r["row_index"]) for r in rows])
        n += len(rows)
    return n


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def generate(folder: Path, rows: int, fix_every: int = 0) -> tuple[Path, Path]:
    """A Prompt-R1-layout Parquet file (`train/validation.parquet`) and a JSONL file of `rows`
    rows; with `fix_every`, every fix_every-th gold answer differs (a corrected release)."""
    (folder / "train").mkdir(parents=True, exist_ok=True)
    parquet, jsonl = folder / "train" / "validation.parquet", folder / "gen.jsonl"
    template = build_agent_prompt("QUESTION").replace("'", "''")
    fixed = f"CASE WHEN i % {fix_every} = 0 THEN 'fixed ' ELSE '' END || " if fix_every else ""
    duckdb.sql(f"""COPY (SELECT 'gen' AS data_source,
        [{{'content': replace('{template}', 'QUESTION', 'What is ' || i || ' plus ' || (i % 97) || '?'),
           'role': 'user'}}] AS prompt, 'math' AS ability,
        {{'ground_truth': [{fixed}(i + i % 97)::VARCHAR, 'about ' || i], 'style': 'rule'}} AS reward_model
        FROM range({rows}) t(i)) TO '{parquet}' (FORMAT parquet)""")
    with jsonl.open("w") as fh:
        for i in range(rows):
            fh.write(json.dumps({"question": f"Who is person {i}?", "answers": [f"name {i}", f"n{i}"],
                                 "task_family": "standard_qa", "split": "train"}) + "\n")
    return parquet, jsonl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/prompt-r1"))
    parser.add_argument("--rows", type=int, default=100_000, help="Rows of each generated file.")
    parser.add_argument("--baseline-rows", type=int, default=5_000, help="Rows the baseline writes per generated file.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shared = discover(Path(args.data))
        with Warehouse(tmp / "cold.duckdb") as wh:
            reports, cold = timed(lambda: ingest(wh, [args.data]))
            n = sum(r.inserted for r in reports)
            _, again = timed(lambda: ingest(wh, [args.data]))
            assert wh.table_counts()["questions"] == n
        with Warehouse(tmp / "warm.duckdb") as wh:
            _, warm = timed(lambda: ingest(wh, [args.data]))
        with Warehouse(tmp / "base.duckdb") as wh:
            nb, base = timed(lambda: row_by_row(wh, shared))
        print(f"13 shared files, {n} rows: bulk {cold:.2f} s cold ({n / cold:,.0f} rows/s), "
              f"{warm:.2f} s warm ({n / warm:,.0f} rows/s); second ingest {again:.3f} s; "
              f"row-by-row baseline {base:.2f} s ({nb / base:,.0f} rows/s); bulk (warm) {base / warm:.1f}x faster")

        parquet, jsonl = generate(tmp / "gen", args.rows)
        small = dict(zip(("Parquet", "JSONL"), generate(tmp / "small", args.baseline_rows)))
        fixed_dir = tmp / "fixed"
        fixed_parquet, _ = generate(fixed_dir, args.rows, fix_every=10)
        for label, path in (("Parquet", parquet), ("JSONL", jsonl)):
            with Warehouse(tmp / f"bulk-{label}.duckdb") as wh:
                reports, bulk = timed(lambda: ingest(wh, [path]))
                rows = reports[0].inserted
                line = f"generated {label}, {rows:,} rows: bulk {bulk:.2f} s ({rows / bulk:,.0f} rows/s)"
                if label == "Parquet":
                    # the corrected release replaces the file at the same path
                    fixed_parquet.replace(parquet)
                    reports, upd = timed(lambda: ingest(wh, [path]))
                    line += f"; corrected re-ingest {upd:.2f} s ({reports[0].updated:,} updated)"
            with Warehouse(tmp / f"base-{label}.duckdb") as wh:
                nb, base = timed(lambda: row_by_row(wh, [small[label]]))
            print(f"{line}; row-by-row baseline on a {nb:,}-row file {base:.2f} s ({nb / base:,.0f} rows/s); "
                  f"bulk {(rows / bulk) / (nb / base):.1f}x the rows/s")


if __name__ == "__main__":
    main()
