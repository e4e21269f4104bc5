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

Each read (`last`, `pending`, `after`, ...) reads only the rows it returns, through the table's
indexes (`(dataset, seq)`, `(dataset, state)`), so what the window sensor reads on every tick — the
last window, the windows that need a run, the windows planned since its last tick — costs the same
with 100 windows in the ledger as with 100,000. `windows()` (every window of a dataset) is for
listings and audits, never for a tick. The row type (`WindowRow`) and the protocol the services
type the ledger by (`WindowLog`) are the contract's (`contract/windows.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Unpack

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pipeline_output.contract.windows import NEEDS_RUN, Landed, Ticket, Window, WindowRow
from pipeline_output.errors import WindowLedgerError
from pipeline_output.infra import locks, pgsession

WINDOW_COLUMNS = sql.SQL(", ").join(
    sql.Identifier(c)
    for c in (
        "id",
        "dataset",
        "seq",
        "low_key",
        "high_key",
        "partition_key",
        "state",
        "attempts",
        "run_id",
        "iceberg_snapshot_id",
        "pg_deploy_id",
        "rows_read",
        "rows_written",
        "error",
        "started_at",
        "applied_at",
    )
)
WINDOWS_TABLE = sql.SQL("pipeline_output.windows")


def window_row(rec: dict[str, Any]) -> WindowRow:
    """A `WindowRow` from a row selected with `WINDOW_COLUMNS`."""
    return WindowRow(
        id=rec["id"],
        dataset=rec["dataset"],
        seq=rec["seq"],
        window=Window.from_key(rec["partition_key"]),
        partition_key=rec["partition_key"],
        state=rec["state"],
        attempts=rec["attempts"],
        run_id=rec["run_id"],
        iceberg_snapshot_id=rec["iceberg_snapshot_id"],
        pg_deploy_id=rec["pg_deploy_id"],
        rows_read=rec["rows_read"],
        rows_written=rec["rows_written"],
        error=rec["error"],
        started_at=rec["started_at"],
        applied_at=rec["applied_at"],
    )


# an applied window: where its write landed (`_landed`, in this order) and when
_APPLIED = sql.SQL(
    "state = 'applied', iceberg_snapshot_id = %s, pg_deploy_id = %s, rows_read = %s, "
    "rows_written = %s, applied_at = clock_timestamp(), updated_at = clock_timestamp(), "
    "error = NULL"
)


def _landed(landed: Landed) -> tuple[int | None, ...]:
    """The values of `_APPLIED`'s placeholders."""
    return (
        landed.get("iceberg_snapshot_id"),
        landed.get("pg_deploy_id"),
        landed.get("rows_read"),
        landed.get("rows_written"),
    )


def _select(where: str, tail: str = " ORDER BY seq") -> sql.Composed:
    """`SELECT <window columns> WHERE dataset = %s<where><tail>` (both fixed SQL text)."""
    return sql.SQL("SELECT {} FROM {} WHERE dataset = %s{}{}").format(
        WINDOW_COLUMNS, WINDOWS_TABLE, sql.SQL(where), sql.SQL(tail)
    )


class WindowLedger:
    """Windows of delta datasets in the control-plane Postgres: the reads, and the planning and
    apply protocol that write them (implements `contract.windows.WindowLog`)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        return pgsession.connect(self.url, row_factory=dict_row)

    def _rows(self, query: sql.Composed, params: Sequence[Any]) -> list[WindowRow]:
        with self._connect() as conn:
            return [window_row(r) for r in conn.execute(query, params).fetchall()]

    def windows(self, dataset: str) -> list[WindowRow]:
        """Every window of `dataset`, in order (a listing: its cost grows with the ledger)."""
        return self._rows(_select(""), (dataset,))

    def get(self, dataset: str, partition_key: str) -> WindowRow | None:
        """One window by its partition key."""
        rows = self._rows(_select(" AND partition_key = %s", ""), (dataset, partition_key))
        return rows[0] if rows else None

    def last(self, dataset: str) -> WindowRow | None:
        """The newest window of `dataset` (one row, by the `(dataset, seq)` index)."""
        rows = self._rows(_select("", " ORDER BY seq DESC LIMIT 1"), (dataset,))
        return rows[0] if rows else None

    def recent(self, dataset: str, *, limit: int) -> list[WindowRow]:
        """The newest `limit` windows, oldest first."""
        rows = self._rows(_select("", " ORDER BY seq DESC LIMIT %s"), (dataset, limit))
        return rows[::-1]

    def after(self, dataset: str, seq: int) -> list[WindowRow]:
        """The windows planned after window `seq`, in order."""
        return self._rows(_select(" AND seq > %s"), (dataset, seq))

    def around(self, dataset: str, keys: Sequence[str], *, before: int) -> list[WindowRow]:
        """The windows from `before` windows ahead of the first of `keys` to the last of them
        (what a run over `keys` with `Delta.lookback=before` reads), in order."""
        query = sql.SQL(
            "SELECT {cols} FROM {t} WHERE dataset = %s AND seq BETWEEN "
            "(SELECT min(seq) - %s FROM {t} WHERE dataset = %s AND partition_key = ANY(%s)) AND "
            "(SELECT max(seq) FROM {t} WHERE dataset = %s AND partition_key = ANY(%s)) "
            "ORDER BY seq"
        ).format(cols=WINDOW_COLUMNS, t=WINDOWS_TABLE)
        wanted = list(keys)
        return self._rows(query, (dataset, before, dataset, wanted, dataset, wanted))

    def pending(self, dataset: str) -> list[WindowRow]:
        """Windows that need a run: planned or failed (by the `(dataset, state)` index)."""
        return self._rows(_select(" AND state = ANY(%s)"), (dataset, list(NEEDS_RUN)))

    def applied_windows(self, dataset: str) -> list[WindowRow]:
        """Applied windows in order (the model node reads a delta source this way)."""
        return self._rows(_select(" AND state = 'applied'"), (dataset,))

    def state_counts(self, dataset: str) -> dict[str, int]:
        """How many windows of `dataset` are in each state."""
        query = sql.SQL("SELECT state, count(*) AS n FROM {} WHERE dataset = %s GROUP BY state")
        with self._connect() as conn:
            rows = conn.execute(query.format(WINDOWS_TABLE), (dataset,)).fetchall()
        return {str(r["state"]): int(r["n"]) for r in rows}

    def applied_through(self, dataset: str) -> tuple[Window | None, bool]:
        """(the last window of the unbroken stretch of applied windows from the first, whether
        every window is applied): every source row up to that window's high has been written.
        None when the first window is not applied, or there is none."""
        gap_q = sql.SQL("SELECT min(seq) AS gap FROM {} WHERE dataset = %s AND state <> 'applied'")
        key_q = sql.SQL(
            "SELECT partition_key FROM {} WHERE dataset = %s AND (seq = %s OR %s::int IS NULL) "
            "ORDER BY seq DESC LIMIT 1"
        )
        with self._connect() as conn:
            gap = conn.execute(gap_q.format(WINDOWS_TABLE), (dataset,)).fetchone()
            first_gap = gap["gap"] if gap else None
            before = None if first_gap is None else first_gap - 1
            rec = conn.execute(key_q.format(WINDOWS_TABLE), (dataset, before, before)).fetchone()
        window = Window.from_key(rec["partition_key"]) if rec else None
        return window, first_gap is None

    def unapplied_ids(self, dataset: str) -> set[int]:
        """Ids of the dataset's windows not applied (yet): a snapshot carrying one of their
        attempt markers may be what a repair looks for, so snapshot expiry keeps it. One
        statement on a session of the process's pool (`pgsession.pooled`): expiry asks it under
        its locks, right after the consumers' positions on such a session — no connection of
        its own, no transaction around it."""
        query = sql.SQL("SELECT id FROM {} WHERE dataset = %s AND state <> 'applied'")
        with pgsession.pooled(self.url) as conn:
            rows = conn.execute(query.format(WINDOWS_TABLE), (dataset,)).fetchall()
        return {int(r[0]) for r in rows}

    def plan(self, dataset: str, windows: Sequence[Window]) -> list[WindowRow]:
        """Append `windows` to the chain (in one transaction); they must continue it exactly."""
        if not windows:
            return []
        with self._connect() as conn, conn.transaction():
            locks.acquire(conn, locks.window_plan(dataset), transaction=True)
            last = conn.execute(
                sql.SQL(
                    "SELECT seq, high_key FROM {} WHERE dataset = %s ORDER BY seq DESC LIMIT 1"
                ).format(WINDOWS_TABLE),
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
                    ).format(WINDOWS_TABLE, WINDOW_COLUMNS),
                    (dataset, seq, low_key, key.split("..", 1)[1], prev, key),
                ).fetchone()
                assert rec is not None
                out.append(window_row(rec))
                prev = key.split("..", 1)[1]
            return out

    @contextmanager
    def apply_lock(self, dataset: str) -> Iterator[None]:
        """Serialize window application of one dataset (held by the applying process)."""
        with locks.held(self.url, locks.window_apply(dataset)):
            yield

    def begin(
        self, dataset: str, partition_key: str, *, run_id: str | None, restate: bool = False
    ) -> Ticket:
        """Decide and record the next step for a window (call under `apply_lock`)."""
        row = self.get(dataset, partition_key)
        if row is None:
            raise WindowLedgerError(
                f"dataset {dataset!r}: window {partition_key!r} is not in the ledger; windows are "
                "planned by the dataset's sensor (or `pipeline-output materialize`)"
            )
        if row.state == "applied" and not restate:
            return Ticket("skip", row)
        if row.state == "staged" and row.run_id == run_id and run_id is not None:
            return Ticket("skip", row)  # already on this run's audit branch
        if row.state in ("applying", "staged"):
            return Ticket("repair", row)
        rec = self._start_attempt(row, run_id=run_id, from_state=None)
        assert rec is not None
        return Ticket("apply", window_row(rec))

    def retry_after_lost_attempt(self, row: WindowRow, *, run_id: str | None) -> WindowRow:
        """A crashed attempt left no write: start the next attempt."""
        rec = self._start_attempt(row, run_id=run_id, from_state=row.state)
        if rec is None:
            raise WindowLedgerError(f"window {row.partition_key!r} changed state concurrently")
        return window_row(rec)

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
                ).format(WINDOWS_TABLE, guard, WINDOW_COLUMNS),
                params,
            ).fetchone()

    def mark_applied(self, row: WindowRow, **landed: Unpack[Landed]) -> None:
        """The window's write is committed: record where."""
        query = sql.SQL("UPDATE {} SET {} WHERE id = %s").format(WINDOWS_TABLE, _APPLIED)
        with self._connect() as conn:
            conn.execute(query, (*_landed(landed), row.id))

    def mark_staged(self, row: WindowRow, *, iceberg_snapshot_id: int | None) -> None:
        """The window's write is on its run's audit branch; applied only at the publish."""
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'staged', iceberg_snapshot_id = %s, "
                    "updated_at = clock_timestamp(), error = NULL WHERE id = %s"
                ).format(WINDOWS_TABLE),
                (iceberg_snapshot_id, row.id),
            )

    def publish_staged(self, window_id: int, attempts: int, **landed: Unpack[Landed]) -> bool:
        """A staged window's audit published: applied. False (nothing changed) when the window
        is no longer staged by that attempt (another run re-attempted it)."""
        query = sql.SQL(
            "UPDATE {} SET {} WHERE id = %s AND attempts = %s AND state = 'staged'"
        ).format(WINDOWS_TABLE, _APPLIED)
        with self._connect() as conn:
            cur = conn.execute(query, (*_landed(landed), window_id, attempts))
            return cur.rowcount == 1

    def is_staged(self, window_id: int, attempts: int) -> bool:
        """Whether the window is still staged by that attempt."""
        query = sql.SQL("SELECT 1 FROM {} WHERE id = %s AND attempts = %s AND state = 'staged'")
        with self._connect() as conn:
            return (
                conn.execute(query.format(WINDOWS_TABLE), (window_id, attempts)).fetchone()
                is not None
            )

    def fail_staged(self, window_id: int, attempts: int, *, error: str) -> None:
        """A staged window's audit did not publish: failed (the sensor re-requests it)."""
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = 'failed', error = %s, updated_at = clock_timestamp() "
                    "WHERE id = %s AND attempts = %s AND state = 'staged'"
                ).format(WINDOWS_TABLE),
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
        ).format(WINDOWS_TABLE)
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
                ).format(WINDOWS_TABLE),
                (error[:2000], row.id),
            )
