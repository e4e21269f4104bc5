"""The flip log: a dataset's persisted mode and its history (`FlipRecord`, tables `mode_flips`
and `dataset_modes`) — `pipeline-output flip`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pipeline_output.contract.spec import MODES, check_identifier
from pipeline_output.errors import InvalidArgument, UnknownMode
from pipeline_output.infra import locks
from pipeline_output.ledger.connection import RecordLog
from pipeline_output.ledger.sql_names import column_list, columns_of, ledger_table


@dataclass(frozen=True)
class FlipRecord:
    """One mode flip: who moved the dataset from which mode to which, when and why."""

    id: int
    dataset: str
    from_mode: str | None
    to_mode: str
    who: str
    at: datetime
    reason: str | None


FLIP_COLUMNS = columns_of(FlipRecord)


class FlipLog(RecordLog):
    """Mode flips (see the module docstring)."""

    def flip(self, dataset: str, mode: str, *, who: str, reason: str | None = None) -> FlipRecord:
        """Persist `dataset`'s mode (pg | iceberg | dual) with history; returns the history row."""
        if mode not in MODES:
            raise UnknownMode(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        check_identifier(dataset, what="dataset name")
        if not who:
            raise InvalidArgument("a flip needs `who` (the person or process flipping)")
        with self.tx(None) as c:
            locks.acquire(c, locks.mode_flip(dataset), transaction=True)
            current = self.current_flip(dataset, conn=c)
            row = c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, from_mode, to_mode, who, reason)"
                    " VALUES (%s, %s, %s, %s, %s) RETURNING {}"
                ).format(ledger_table("mode_flips"), column_list(FLIP_COLUMNS)),
                (dataset, current, mode, who, reason),
            ).fetchone()
            assert row is not None
            record = FlipRecord(*row)
            c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, mode, flip_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT (dataset) DO UPDATE SET mode = EXCLUDED.mode,"
                    " flip_id = EXCLUDED.flip_id, updated_at = clock_timestamp()"
                ).format(ledger_table("dataset_modes")),
                (dataset, mode, record.id),
            )
        return record

    def current_flip(
        self, dataset: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> str | None:
        """The persisted mode of `dataset`, or None when it was never flipped."""
        rows = self.select(
            "dataset_modes", ["mode"], where={"dataset": dataset}, order="dataset", conn=conn
        )
        return str(rows[0][0]) if rows else None

    def flips(self) -> dict[str, str]:
        """Every persisted flip: dataset -> mode."""
        query = sql.SQL("SELECT dataset, mode FROM {} ORDER BY dataset").format(
            ledger_table("dataset_modes")
        )
        with self.tx(None) as c:
            return {str(d): str(m) for d, m in c.execute(query).fetchall()}

    def flip_history(self, dataset: str) -> list[FlipRecord]:
        """Every flip of `dataset`, oldest first."""
        rows = self.select("mode_flips", FLIP_COLUMNS, where={"dataset": dataset})
        return [FlipRecord(*r) for r in rows]
