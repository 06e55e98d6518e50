"""The one module that opens, reads and writes the DuckDB warehouse (`sources` writes one
source's questions inside its transaction).

Everything durable goes through `Warehouse`: ingested questions, rollout trajectories and
their environment calls, the environment reply cache, and evaluation rows. SQL lives here
and in `schema.sql`; callers pass and receive plain Python values (questions also as one Arrow
table per source, so a whole source is written in one statement). Only the driver process opens
the file (DuckDB lets one process write it, and no other process even read it meanwhile); Ray
actors return data instead. Readers open it read-only, so they never block each other, and an
open that finds the file locked waits a bounded time, then names the process holding it.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from prompt_r1.core.failures import UserError
from prompt_r1.core.questions import QuestionRow
from warehouse.sources import SourceCounts, questions_table, write_source

SCHEMA = Path(__file__).with_name("schema.sql")
# How long an open waits for another process to release the file before giving up.
LOCK_WAIT_S = 30.0


def lock_holder(message: str) -> str:
    """The process named in DuckDB's lock error, or '' when the text names none.

    >>> lock_holder('Could not set lock on file "w.duckdb": Conflicting lock is held in '
    ...             '/usr/bin/python3.11 (PID 4242) by user ann. See also https://duckdb.org')
    'PID 4242 (/usr/bin/python3.11)'
    """
    found = re.search(r"held in (.*?) \(PID (\d+)\)", message)
    return f"PID {found.group(2)} ({found.group(1)})" if found else ""


def _command_line(holder: str) -> str:
    """The holder's command line where /proc shows it (Linux), so the message says what runs."""
    pid = re.search(r"PID (\d+)", holder)
    try:
        raw = Path(f"/proc/{pid.group(1)}/cmdline").read_bytes() if pid else b""
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# what DuckDB raises when the disk refuses a write (ENOSPC, EFBIG) at the statement or at COMMIT
WRITE_ERRORS = (duckdb.IOException, duckdb.TransactionException)


class WarehouseError(UserError, RuntimeError):
    """The warehouse file cannot be opened or written; the message names the file."""


class WarehouseLockedError(WarehouseError):
    """Another process held the file for longer than the open was willing to wait."""


class Warehouse:
    """A DuckDB warehouse file. Thread-safe: one connection, one lock, a cursor per call."""

    def __init__(self, path: str | Path, read_only: bool = False, wait_s: float = LOCK_WAIT_S):
        """Open (a writer also creates) the file; `read_only` for processes that only read.

        DuckDB holds a file-level lock: while one process writes, no other may open the file, and
        while any reads, none may write. A busy file is retried until `wait_s` has passed, then
        `WarehouseLockedError` names the process holding it.
        """
        self.path = Path(path)
        if read_only and not self.path.is_file():
            raise WarehouseError(f"no warehouse at {self.path}: nothing has been ingested there yet "
                                 "(run `prompt-r1 ingest ...` first, or pass --db with the right file)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                self._con = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.IOException as err:
                holder = lock_holder(str(err))
                if not holder and "lock" not in str(err).lower():
                    raise self._open_error(err) from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._locked_error(holder or str(err), wait_s) from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 1.0)
            except duckdb.Error as err:
                raise self._open_error(err) from None
        if not read_only:
            try:
                self._con.execute(SCHEMA.read_text())
            except duckdb.Error as err:
                self._con.close()
                raise self._open_error(err) from None
        self._lock = threading.RLock()

    def _open_error(self, err: Exception) -> WarehouseError:
        return WarehouseError(f"cannot open warehouse {self.path}: {err}. If the file is corrupt, "
                              "move it aside and re-ingest.")

    def _locked_error(self, holder: str, wait_s: float) -> WarehouseLockedError:
        cmd = _command_line(holder)
        return WarehouseLockedError(
            f"cannot open warehouse {self.path}: it is in use by {holder}"
            + (f", running `{cmd}`" if cmd else "")
            + f"; waited {wait_s:g} s. Let that process finish (or stop it), or pass --db with "
            "another file. DuckDB lets one process write a warehouse, and none read it meanwhile."
        )

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Warehouse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._con.cursor().execute(sql, list(params)).fetchall()

    def query_dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._con.cursor().execute(sql, list(params))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All-or-nothing: an exception inside rolls back every write of the block. A write the disk
        refuses (full, a file-size limit) is a `WarehouseError` naming the file and the free space,
        not DuckDB's traceback: the block was rolled back, so nothing of it was kept."""
        with self._lock:
            cur = self._con.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
            except BaseException as err:
                try:
                    cur.execute("ROLLBACK")
                except duckdb.Error:
                    if not isinstance(err, WRITE_ERRORS):
                        raise
                if isinstance(err, WRITE_ERRORS):
                    raise self._write_error(err) from None
                raise
            else:
                try:
                    cur.execute("COMMIT")
                except WRITE_ERRORS as err:
                    raise self._write_error(err) from None

    def _write_error(self, err: Exception) -> WarehouseError:
        try:
            free = f"{shutil.disk_usage(self.path.parent).free / 2**20:,.0f} MiB free on its device"
        except OSError:
            free = "its free space unknown"
        reason = " ".join(str(err).split())[:300]
        return WarehouseError(f"writing to warehouse {self.path} failed ({free}): {type(err).__name__}: {reason}. "
                              "Nothing of this write was kept (it was rolled back); if the disk is full or a file-size "
                              "limit was reached, free space and run the command again")

    # -- questions --------------------------------------------------------------------------
    def source_ingested(self, content_hash: str) -> bool:
        return bool(self.query("SELECT 1 FROM sources WHERE content_hash = ?", [content_hash]))

    def add_source(
        self, source_file: str, content_hash: str, dataset: str,
        rows: pa.Table | Iterable[QuestionRow], rekey: bool = False,
    ) -> SourceCounts:
        """Write one source's questions in one transaction; the source is the truth about its rows.

        `rows` is an Arrow table with `sources.QUESTION_COLUMNS` (or QuestionRows). A question whose id
        is stored already is updated in place when its content differs (a corrected gold answer),
        questions stored from an earlier version of `source_file` that it no longer holds are
        removed, and the source replaces that file's earlier `sources` row.

        With `rekey` (a source keyed by its rows' text), questions stored for `source_file` under
        ids it no longer gives are matched to its new ids by (dataset, split, text, repeat), and
        every row that refers to them (trajectories, env calls, predictions) takes the new id, so
        a change of row-key rule loses nothing already recorded (`question_renames` keeps the map).
        """
        table = rows if isinstance(rows, pa.Table) else questions_table(rows)
        with self.transaction() as cur:
            return write_source(cur, source_file, content_hash, dataset, table, rekey, _now())

    def adopt_questions(self, old_file: str, source_file: str, dataset: str) -> None:
        """Move `dataset`'s questions (and its `sources` row) stored under `old_file` to `source_file`,
        so a source whose key changed (a mapped file, now keyed with its dataset) finds them as its
        own: updated in place, never removed as gone and inserted again."""
        with self.transaction() as cur:
            cur.execute("UPDATE questions SET source_file = ? WHERE source_file = ? AND dataset = ?",
                        [source_file, old_file, dataset])
            cur.execute("DELETE FROM sources WHERE source_file = ? AND dataset = ?", [old_file, dataset])

    def questions(
        self,
        splits: Sequence[str] | None = None,
        datasets: Sequence[str] | None = None,
        limit_per_dataset: int | None = None,
    ) -> list[QuestionRow]:
        """Questions in a stable order (dataset, row), optionally the first N of each dataset."""
        where, params = ["TRUE"], []
        if splits:
            where.append("split IN (SELECT UNNEST(?))")
            params.append(list(splits))
        if datasets:
            where.append("dataset IN (SELECT UNNEST(?))")
            params.append(list(datasets))
        rank = "ROW_NUMBER() OVER (PARTITION BY dataset ORDER BY row_index, question_id)"
        sql = (
            f"SELECT * EXCLUDE (rk) FROM (SELECT *, {rank} AS rk FROM questions "
            f"WHERE {' AND '.join(where)}) "
            + ("WHERE rk <= ? " if limit_per_dataset else "")
            + "ORDER BY dataset, row_index, question_id"
        )
        if limit_per_dataset:
            params.append(limit_per_dataset)
        return [
            QuestionRow(
                question_id=r["question_id"], dataset=r["dataset"], split=r["split"],
                question=r["question"], golds=list(r["golds"]), task_family=r["task_family"],
                primary_metric=r["primary_metric"], source_file=r["source_file"],
                source_hash=r["source_hash"], row_index=r["row_index"],
                metadata=None if r["metadata"] is None else json.loads(r["metadata"]), scorer=r["scorer"],
            )
            for r in self.query_dicts(sql, params)
        ]

    def source_datasets(self, source_files: Sequence[str]) -> list[str]:
        """The datasets of the questions stored from `source_files` (resolved paths)."""
        if not source_files:
            return []
        return [d for (d,) in self.query("SELECT DISTINCT dataset FROM questions WHERE source_file IN "
                                         "(SELECT UNNEST(?)) ORDER BY 1", [list(source_files)])]

    def question_summary(self) -> list[dict[str, Any]]:
        return self.query_dicts(
            "SELECT dataset, split, task_family, primary_metric, COUNT(*) AS n "
            "FROM questions GROUP BY ALL ORDER BY split, dataset"
        )

    def source_hashes(self) -> dict[str, str]:
        """dataset -> combined content hash of its sources (recorded with every run)."""
        rows = self.query(
            "SELECT dataset, string_agg(content_hash, ',' ORDER BY content_hash) FROM sources GROUP BY 1"
        )
        return {d: h for d, h in rows}

    # -- rollouts ---------------------------------------------------------------------------
    def replace_step(
        self, run_id: str, step: int, trajectories: Sequence[dict[str, Any]],
        env_calls: Sequence[dict[str, Any]],
    ) -> None:
        """Write one training step's trajectories and env calls; a rerun of the step replaces them."""
        now = _now()
        with self.transaction() as cur:
            cur.execute("DELETE FROM trajectories WHERE run_id = ? AND step = ?", [run_id, step])
            cur.execute("DELETE FROM env_calls WHERE run_id = ? AND step = ?", [run_id, step])
            if trajectories:
                cur.executemany(  # named columns: files made before `error` / `policy_version` / `env_name`
                    # hold them last
                    "INSERT INTO trajectories (run_id, step, question_id, group_index, token_ids, loss_mask, "
                    "agent_turns, env_replies, answer, reward_format, reward_answer, reward_total, num_turns, "
                    "stop_reason, created_at, error, policy_version, reward_cost, env_name) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [
                        (run_id, step, t["question_id"], t["group_index"], t["token_ids"],
                         t["loss_mask"], t["agent_turns"], t["env_replies"], t["answer"],
                         *((t["reward"]["format"], t["reward"]["answer"], t["reward"]["total"])
                           if t.get("reward") else (None, None, None)),  # no reward: ended by an env failure
                         len(t["agent_turns"]), t["stop_reason"], now, t.get("error"), t.get("policy_version"),
                         t["reward"].get("cost", 0.0) if t.get("reward") else None,
                         t.get("env_name") or None)
                        for t in trajectories
                    ],
                )
            if env_calls:
                cur.executemany(
                    "INSERT INTO env_calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [
                        (run_id, step, c["question_id"], c["group_index"], c["turn"], c["env_name"],
                         c["model"], c["prompt_tokens"], c["completion_tokens"], c["latency_s"],
                         c["attempts"], c["cached"], c["error"], now)
                        for c in env_calls
                    ],
                )

    def steps_recorded(self, run_id: str) -> list[int]:
        return [r[0] for r in self.query(
            "SELECT DISTINCT step FROM trajectories WHERE run_id = ? ORDER BY step", [run_id])]

    def step_rewards(self, run_id: str) -> list[dict[str, Any]]:
        """Per recorded step and environment of a training run: trajectories, failed ones, and the
        mean total and answer reward of the scored ones (a failure has no reward). Read from the
        rows themselves, so a run resumed from a checkpoint shows every step."""
        rows = self.query(
            "SELECT step, env_name, count(*), count(error), avg(reward_total), avg(reward_answer) "
            "FROM trajectories WHERE run_id = ? GROUP BY step, env_name ORDER BY step, env_name", [run_id])
        return [{"step": step, "env_name": env, "trajectories": n, "errors": errors, "reward_mean": reward,
                 "answer_mean": answer} for step, env, n, errors, reward, answer in rows]

    def delete_steps_after(self, run_id: str, step: int) -> None:
        """Drop rows of steps past a checkpoint (a resumed run redoes them)."""
        with self.transaction() as cur:
            cur.execute("DELETE FROM trajectories WHERE run_id = ? AND step > ?", [run_id, step])
            cur.execute("DELETE FROM env_calls WHERE run_id = ? AND step > ?", [run_id, step])

    # -- environment cache ------------------------------------------------------------------
    def cache_get(self, key: str) -> tuple[str, int, int] | None:
        rows = self.query(
            "SELECT reply, prompt_tokens, completion_tokens FROM env_cache WHERE cache_key = ?", [key])
        return tuple(rows[0]) if rows else None  # type: ignore[return-value]

    def cache_put(self, key: str, model: str, reply: str, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self._con.cursor().execute(
                "INSERT INTO env_cache VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                [key, model, reply, prompt_tokens, completion_tokens, _now()],
            )

    # -- evaluation -------------------------------------------------------------------------
    def write_eval(
        self, run_id: str, predictions: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]]
    ) -> None:
        """Replace one run's rows for the (env, method, dataset) cells given, in one transaction."""
        now = _now()
        pred_cols = ["run_id", "env_name", "method", "dataset", "question_id", "prediction",
                     "primary_metric", "score", "em", "f1", "substring", "ssim", "num_turns",
                     "env_prompt_tokens", "env_completion_tokens", "error", "parts"]
        res_cols = ["run_id", "env_name", "method", "dataset", "n", "primary_metric", "score", "em",
                    "f1", "substring", "ssim", "env_prompt_tokens", "env_completion_tokens", "cost_usd", "errors", "ci_low", "ci_high", "parts"]
        cells = {(r["env_name"], r["method"], r["dataset"]) for r in results}
        with self.transaction() as cur:
            for env_name, method, dataset in cells:
                for table in ("eval_predictions", "eval_results"):
                    cur.execute(
                        f"DELETE FROM {table} WHERE run_id=? AND env_name=? AND method=? AND dataset=?",
                        [run_id, env_name, method, dataset],
                    )
            if predictions:
                cur.executemany(
                    f"INSERT INTO eval_predictions ({', '.join(pred_cols)}, created_at) "
                    f"VALUES ({','.join('?' * (len(pred_cols) + 1))})",
                    [[run_id if c == "run_id" else p.get(c) for c in pred_cols] + [now] for p in predictions],
                )
            if results:
                cur.executemany(
                    f"INSERT INTO eval_results ({', '.join(res_cols)}, created_at) "
                    f"VALUES ({','.join('?' * (len(res_cols) + 1))})",
                    [[run_id if c == "run_id" else r.get(c, 0 if c == "errors" else None) for c in res_cols] + [now]
                     for r in results],
                )

    def eval_results(self, run_id: str) -> list[dict[str, Any]]:
        return self.query_dicts(
            "SELECT * EXCLUDE (created_at) FROM eval_results WHERE run_id = ? "
            "ORDER BY env_name, dataset, method", [run_id])

    # -- prompt-optimisation baselines ------------------------------------------------------
    def baseline_get(self, key: str) -> dict[str, Any] | None:
        rows = self.query_dicts("SELECT * FROM baseline_instructions WHERE cache_key = ?", [key])
        return rows[0] if rows else None

    def baseline_put(self, key: str, method: str, env_name: str, instruction: str, train_score: float | None,
                     spend_json: str, history_json: str) -> None:
        with self._lock:
            self._con.cursor().execute(
                "INSERT OR REPLACE INTO baseline_instructions VALUES (?,?,?,?,?,?,?,?)",
                [key, method, env_name, instruction, train_score, spend_json, history_json, _now()])

    def table_counts(self) -> dict[str, int]:
        names = ["sources", "questions", "trajectories", "env_calls", "env_cache",
                 "eval_predictions", "eval_results"]
        return {n: self.query(f"SELECT COUNT(*) FROM {n}")[0][0] for n in names}
