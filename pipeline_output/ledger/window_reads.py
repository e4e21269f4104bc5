"""Reading the watermark ledger: `WindowRow` and every query that reads windows.

Each query reads only the rows it returns, through the table's indexes (`(dataset, seq)`,
`(dataset, state)`), so what the window sensor reads on every tick — the last window, the windows
that need a run, the windows planned since its last tick — costs the same with 100 windows in the
ledger as with 100,000. `windows()` (every window of a dataset) is for listings and audits, never
for a tick. The apply protocol that writes the ledger is `window_ledger.WindowLedger`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pipeline_output.contract.windows import Window
from pipeline_output.infra import pgsession

State = Literal["planned", "applying", "staged", "applied", "failed"]
NEEDS_RUN: tuple[State, ...] = ("planned", "failed")  # what the sensor requests runs for


@dataclass(frozen=True)
class WindowRow:
    """One ledger row."""

    id: int
    dataset: str
    seq: int
    window: Window
    partition_key: str
    state: State
    attempts: int
    run_id: str | None
    iceberg_snapshot_id: int | None
    pg_deploy_id: int | None
    rows_read: int | None
    rows_written: int | None
    error: str | None
    started_at: datetime | None
    applied_at: datetime | None

    @property
    def marker(self) -> str:
        """The attempt marker of the current attempt (written into the snapshot summary)."""
        return f"{self.id}:{self.attempts}"


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


def _select(where: str, tail: str = " ORDER BY seq") -> sql.Composed:
    """`SELECT <window columns> WHERE dataset = %s<where><tail>` (both fixed SQL text)."""
    return sql.SQL("SELECT {} FROM {} WHERE dataset = %s{}{}").format(
        WINDOW_COLUMNS, WINDOWS_TABLE, sql.SQL(where), sql.SQL(tail)
    )


class WindowReads:
    """Read-only queries over the windows of delta datasets (the control-plane Postgres)."""

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
        attempt markers may be what a repair looks for, so snapshot expiry keeps it."""
        query = sql.SQL("SELECT id FROM {} WHERE dataset = %s AND state <> 'applied'")
        with self._connect() as conn:
            rows = conn.execute(query.format(WINDOWS_TABLE), (dataset,)).fetchall()
        return {int(r["id"]) for r in rows}
