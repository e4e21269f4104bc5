"""A legacy write stopped before its commit (`PendingWrite`), reading rows inside its transaction
(`rows_as_frame`), and the counters a write collects."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import polars as pl
import psycopg

from pipeline_output.contract.plan import RowCounts, WriteResult
from pipeline_output.errors import (
    LockLost,
    WriteAlreadyFinished,
)

# -- pending writes ---------------------------------------------------------------------------


class PendingWrite:
    """A legacy-arm write whose transaction is still open: `commit()` or `rollback()` it.

    `result` is final (counters, deploy id) but nothing is visible to other sessions until
    `commit()`. Used as a context manager, leaving the block without `commit()` rolls back.
    """

    def __init__(self, conn: psycopg.Connection[Any], result: WriteResult) -> None:
        self._conn: psycopg.Connection[Any] | None = conn
        self.result = result

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The open transaction's connection (to read what a commit would make visible)."""
        if self._conn is None:
            raise WriteAlreadyFinished(f"the write of {self.result.dataset!r} was already finished")
        return self._conn

    def handover(self) -> psycopg.Connection[Any]:
        """Give the open transaction to the next write of a chain (this one is then finished:
        only the last write of the chain commits or rolls back)."""
        return self._take()

    @property
    def open(self) -> bool:
        """Whether the transaction is still open."""
        return self._conn is not None

    def commit(self) -> WriteResult:
        """Commit the transaction (rows and deploy record together); returns the result."""
        conn = self._take()
        try:
            try:
                conn.execute("SELECT 1")  # the transaction (and its xact lock) is still alive
            except psycopg.OperationalError as exc:
                raise LockLost(
                    f"dataset {self.result.dataset!r}: the legacy-arm transaction's Postgres "
                    f"session ended before its commit ({type(exc).__name__}); the server rolled "
                    "back its rows and released its lock, nothing was committed — run it again"
                ) from exc
            conn.commit()
        finally:
            conn.close()
        return self.result

    def rollback(self) -> None:
        """Roll the transaction back: the arm and the ledger are left as they were."""
        if self._conn is None:
            return
        conn = self._take()
        try:
            conn.rollback()
        finally:
            conn.close()

    def _take(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise WriteAlreadyFinished(f"the write of {self.result.dataset!r} was already finished")
        conn, self._conn = self._conn, None
        return conn

    def __enter__(self) -> PendingWrite:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.rollback()


def rows_as_frame(
    conn: psycopg.Connection[Any],
    query: Any,
    target: dict[str, pl.DataType],
    *,
    params: tuple[Any, ...] = (),
) -> pl.DataFrame:
    """Run `query` with `params` on `conn` (inside its transaction) and type its rows by `target`
    — the same casts `PostgresStore.read` applies to its Arrow result."""
    cur = conn.execute(query, params)
    names = [d.name for d in cur.description or []]
    rows = cur.fetchall()
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    series = []
    for name, values in zip(names, columns, strict=True):
        dtype = target.get(name)
        raw = pl.Series(
            name, list(values), dtype=pl.String if _as_text(dtype) else None, strict=False
        )
        series.append(raw)
    frame = pl.DataFrame(series) if series else pl.DataFrame()
    return frame.select([pl.col(c).cast(t) for c, t in target.items()])


def _as_text(dtype: pl.DataType | None) -> bool:
    """Decimals arrive as text (exact digits), cast by polars like the Arrow read does."""
    return isinstance(dtype, pl.Decimal)


LegacyCounts = RowCounts  # the legacy write's counters, filled by `staging.apply_plan`
