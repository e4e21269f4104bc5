"""The drain log: when the legacy arm of a dataset was drained at the end of its migration (table
`drains`) — `pipeline-output drain`."""

from __future__ import annotations

from datetime import datetime

from psycopg import sql

from pipeline_output.ledger.connection import RecordLog
from pipeline_output.ledger.sql_names import ledger_table


class DrainLog(RecordLog):
    """Drains of the legacy arm (see the module docstring)."""

    def record_drain(self, dataset: str, *, rows: int) -> None:
        """Record that the legacy rows of `dataset` were deleted."""
        with self.tx(None) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} (dataset, rows) VALUES (%s, %s)").format(
                    ledger_table("drains")
                ),
                (dataset, rows),
            )

    def last_drain(self, dataset: str) -> datetime | None:
        """When the legacy rows of `dataset` were last drained (None: never, since 020)."""
        with self.tx(None) as conn:
            row = conn.execute(
                sql.SQL("SELECT max(at) FROM {} WHERE dataset = %s").format(ledger_table("drains")),
                (dataset,),
            ).fetchone()
        return row[0] if row else None
