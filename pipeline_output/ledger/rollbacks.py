"""The rollback log: each rollback of a dataset's native table (`RollbackRecord`, table
`rollbacks`). `services/time_travel.py` decides, this module only records."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pipeline_output.ledger.connection import RecordLog
from pipeline_output.ledger.sql_names import column_list, ledger_table


@dataclass(frozen=True)
class RollbackRecord:
    """One rollback of a dataset's native table."""

    id: int
    dataset: str
    from_snapshot_id: int | None
    to_snapshot_id: int
    who: str
    run_id: str | None
    reason: str | None
    windows_reset: int
    at: datetime


_ROLLBACK_COLUMNS = [
    "id",
    "dataset",
    "from_snapshot_id",
    "to_snapshot_id",
    "who",
    "run_id",
    "reason",
    "windows_reset",
    "at",
]


class RollbackLog(RecordLog):
    """Rollbacks (see the module docstring)."""

    def record_rollback(
        self,
        dataset: str,
        *,
        from_snapshot_id: int | None,
        to_snapshot_id: int,
        who: str,
        run_id: str | None,
        reason: str | None,
        windows_reset: int,
        conn: psycopg.Connection[Any] | None = None,
    ) -> RollbackRecord:
        """Record a rollback (who, when, why, from, to, windows reset)."""
        with self.tx(conn) as c:
            row = c.execute(
                sql.SQL(
                    "INSERT INTO {} (dataset, from_snapshot_id, to_snapshot_id, who, run_id, "
                    "reason, windows_reset) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {}"
                ).format(ledger_table("rollbacks"), column_list(_ROLLBACK_COLUMNS)),
                (dataset, from_snapshot_id, to_snapshot_id, who, run_id, reason, windows_reset),
            ).fetchone()
        assert row is not None
        return RollbackRecord(*row)

    def rollbacks(self, dataset: str) -> list[RollbackRecord]:
        """A dataset's rollbacks, oldest first."""
        rows = self.select("rollbacks", _ROLLBACK_COLUMNS, where={"dataset": dataset})
        return [RollbackRecord(*r) for r in rows]
