"""The watermark ledger: planned/applied delta windows per dataset, and the apply protocol.

Owns the `pipeline_output.windows` table (see `sql/010_windows.sql`: the database keeps each
dataset's windows contiguous and non-overlapping) and the exactly-once protocol around applying one:

1. `begin(dataset, key, run_id)` — under a per-dataset advisory lock held for the whole apply —
   returns what to do: `apply` (attempt n is recorded as `applying` and committed first), `skip`
   (already applied), or `repair` (a previous attempt committed its write but crashed before the
   ledger update: the caller finds its marker in the write history and calls `mark_applied`).
2. the caller writes, carrying the attempt marker `<window id>:<attempt>` in the snapshot summary;
3. `mark_applied(...)` / `mark_failed(...)`.

An audited run's write lands on its audit branch first: the window is `staged` (`mark_staged`) and
becomes `applied` only when the audit publishes (`publish_staged`), or `failed` when it does not
(`fail_staged`). A rollback puts windows applied after its target back to `planned`
(`reset_to_planned`), so the sensor re-applies them (they are never planned twice).

The reads (`WindowRow`, `last`, `pending`, ...) are `window_reads.py`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import sql

from pipeline_output.contract.windows import Window
from pipeline_output.errors import WindowLedgerError
from pipeline_output.infra import locks, pgsession
from pipeline_output.ledger.window_reads import (
    WINDOW_COLUMNS,
    WINDOWS_TABLE,
    State,
    WindowReads,
    WindowRow,
    window_row,
)

Action = Literal["apply", "skip", "repair"]


@dataclass(frozen=True)
class Ticket:
    """What `begin` decided for one window."""

    action: Action
    row: WindowRow


_COLS = WINDOW_COLUMNS
_T = WINDOWS_TABLE
_row = window_row


class WindowLedger(WindowReads):
    """Windows of delta datasets in the control-plane Postgres: the reads (`WindowReads`) and
    the planning and apply protocol that write them."""

    def plan(self, dataset: str, windows: Sequence[Window]) -> list[WindowRow]:
        """Append `windows` to the chain (in one transaction); they must continue it exactly."""
        if not windows:
            return []
        with self._connect() as conn, conn.transaction():
            locks.acquire(conn, locks.window_plan(dataset), transaction=True)
            last = conn.execute(
                sql.SQL(
                    "SELECT seq, high_key FROM {} WHERE dataset = %s ORDER BY seq DESC LIMIT 1"
                ).format(_T),
                (dataset,),
            ).fetchone()
            seq = last["seq"] if last else 0
            prev = last["high_key"] if last else None
            out = []
            for window in windows:
                key = window.to_key()
                low_key = key.split("..", 1)[0] or None
                if prev is not None and low_key is not None and low_key == prev + "Z":
                    # the chain was planned before keys carried their zone: the same UTC instant
                    low_key = prev
                if prev is not None and low_key != prev:
                    raise WindowLedgerError(
                        f"dataset {dataset!r}: window {window} does not start where the last "
                        f"window ends ({Window.from_key('..' + prev).high}); windows must be "
                        "contiguous"
                    )
                seq += 1
                rec = conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (dataset, seq, low_key, high_key, prev_high_key, "
                        "partition_key) VALUES (%s, %s, %s, %s, %s, %s) RETURNING {}"
                    ).format(_T, _COLS),
                    (dataset, seq, low_key, key.split("..", 1)[1], prev, key),
                ).fetchone()
                assert rec is not None
                out.append(_row(rec))
                prev = key.split("..", 1)[1]
            return out

    @contextmanager
    def apply_lock(self, dataset: str) -> Iterator[None]:
        """Serialize window application of one dataset (held by the applying process)."""
        with pgsession.connect(self.url, autocommit=True) as conn:
            name = locks.window_apply(dataset)
            locks.acquire(conn, name, transaction=False)
            try:
                yield
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (locks.lock_key(name),))

    def begin(
        self, dataset: str, partition_key: str, *, run_id: str | None, restate: bool = False
    ) -> Ticket:
        """Decide and record the next step for a window (call under `apply_lock`)."""
        row = self.get(dataset, partition_key)
        if row is None:
            raise WindowLedgerError(
                f"dataset {dataset!r}: window {partition_key!r} is not in the ledger; windows are "
                "planned by the dataset's sensor (or `pipeline-output windows plan`)"
            )
        if row.state == "applied" and not restate:
            return Ticket("skip", row)
        if row.state == "staged" and row.run_id == run_id and run_id is not None:
            return Ticket("skip", row)  # already on this run's audit branch
        if row.state in ("applying", "staged"):
            return Ticket("repair", row)
        rec = self._start_attempt(row, run_id=run_id, from_state=None)
        assert rec is not None
        return Ticket("apply", _row(rec))

    def retry_after_lost_attempt(self, row: WindowRow, *, run_id: str | None) -> WindowRow:
        """A crashed attempt left no write: start the next attempt."""
        rec = self._start_attempt(row, run_id=run_id, from_state=row.state)
        if rec is None:
            raise WindowLedgerError(f"window {row.partition_key!r} changed state concurrently")
        return _row(rec)

    def _start_attempt(self, row: WindowRow, *, run_id: str | None, from_state: str | None) -> Any:
        """Count the next attempt of `row` (a fresh marker) and mark it `applying`; with
        `from_state`, only while the row is still in that state (None when it is not)."""
        guard = sql.SQL(" AND state = %s") if from_state is not None else sql.SQL("")
        params = (run_id, row.id, from_state) if from_state is not None else (run_id, row.id)
        with self._connect() as conn:
            return conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'applying', attempts = attempts + 1, run_id = %s, "
                    "started_at = clock_timestamp(), updated_at = clock_timestamp(), error = NULL "
                    "WHERE id = %s{} RETURNING {}"
                ).format(_T, guard, _COLS),
                params,
            ).fetchone()

    def mark_applied(
        self,
        row: WindowRow,
        *,
        iceberg_snapshot_id: int | None = None,
        pg_deploy_id: int | None = None,
        rows_read: int | None = None,
        rows_written: int | None = None,
    ) -> None:
        """The window's write is committed: record where."""
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'applied', iceberg_snapshot_id = %s, pg_deploy_id = %s, "
                    "rows_read = %s, rows_written = %s, applied_at = clock_timestamp(), "
                    "updated_at = clock_timestamp(), error = NULL WHERE id = %s"
                ).format(_T),
                (iceberg_snapshot_id, pg_deploy_id, rows_read, rows_written, row.id),
            )

    def mark_staged(self, row: WindowRow, *, iceberg_snapshot_id: int | None) -> None:
        """The window's write is on its run's audit branch; applied only at the publish."""
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'staged', iceberg_snapshot_id = %s, "
                    "updated_at = clock_timestamp(), error = NULL WHERE id = %s"
                ).format(_T),
                (iceberg_snapshot_id, row.id),
            )

    def publish_staged(
        self,
        window_id: int,
        attempts: int,
        *,
        iceberg_snapshot_id: int | None,
        pg_deploy_id: int | None = None,
        rows_read: int | None = None,
        rows_written: int | None = None,
    ) -> bool:
        """A staged window's audit published: applied. False (nothing changed) when the window
        is no longer staged by that attempt (another run re-attempted it)."""
        with self._connect() as conn:
            cur = conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'applied', iceberg_snapshot_id = %s, pg_deploy_id = %s, "
                    "rows_read = %s, rows_written = %s, applied_at = clock_timestamp(), "
                    "updated_at = clock_timestamp(), error = NULL "
                    "WHERE id = %s AND attempts = %s AND state = 'staged'"
                ).format(_T),
                (iceberg_snapshot_id, pg_deploy_id, rows_read, rows_written, window_id, attempts),
            )
            return cur.rowcount == 1

    def is_staged(self, window_id: int, attempts: int) -> bool:
        """Whether the window is still staged by that attempt."""
        query = sql.SQL("SELECT 1 FROM {} WHERE id = %s AND attempts = %s AND state = 'staged'")
        with self._connect() as conn:
            return conn.execute(query.format(_T), (window_id, attempts)).fetchone() is not None

    def fail_staged(self, window_id: int, attempts: int, *, error: str) -> None:
        """A staged window's audit did not publish: failed (the sensor re-requests it)."""
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'failed', error = %s, updated_at = clock_timestamp() "
                    "WHERE id = %s AND attempts = %s AND state = 'staged'"
                ).format(_T),
                (error[:2000], window_id, attempts),
            )

    def reset_to_planned(
        self,
        dataset: str,
        *,
        snapshot_ids: set[int],
        applied_after: datetime | None,
        reason: str,
        conn: psycopg.Connection[Any] | None = None,
    ) -> int:
        """Applied windows whose snapshot is in `snapshot_ids` (rolled back off main), or that
        committed nothing after `applied_after`, go back to `planned`; returns how many."""
        query = sql.SQL(
            "UPDATE {} SET state = 'planned', iceberg_snapshot_id = NULL, pg_deploy_id = NULL, "
            "applied_at = NULL, error = %s, updated_at = clock_timestamp() "
            "WHERE dataset = %s AND state = 'applied' AND (iceberg_snapshot_id = ANY(%s) OR "
            "(iceberg_snapshot_id IS NULL AND %s::timestamptz IS NOT NULL AND applied_at > %s))"
        ).format(_T)
        params = (reason[:2000], dataset, list(snapshot_ids), applied_after, applied_after)
        if conn is not None:
            return conn.execute(query, params).rowcount
        with self._connect() as own:
            return own.execute(query, params).rowcount

    def mark_failed(self, row: WindowRow, *, error: str) -> None:
        """The attempt failed before committing anything."""
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'failed', error = %s, updated_at = clock_timestamp() "
                    "WHERE id = %s"
                ).format(_T),
                (error[:2000], row.id),
            )


__all__ = ["Action", "State", "Ticket", "WindowLedger", "WindowRow"]
