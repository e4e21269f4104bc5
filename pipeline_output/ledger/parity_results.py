"""The parity log: each parity check of a dataset's two arms (`ParityRecord`, table
`parity_results`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pipeline_output.ledger.connection import RecordLog
from pipeline_output.ledger.sql_names import column_list, columns_of, ledger_table


@dataclass(frozen=True)
class ParityRecord:
    """One parity check of a dataset's two arms."""

    id: int
    dataset: str
    at: datetime
    run_id: str | None
    passed: bool
    pg_count: int | None
    iceberg_count: int | None
    differing_keys: dict[str, Any]
    details: dict[str, Any]


PARITY_COLUMNS = columns_of(ParityRecord)


class ParityLog(RecordLog):
    """Parity results (see the module docstring)."""

    def record_parity(
        self,
        dataset: str,
        *,
        passed: bool,
        pg_count: int | None,
        iceberg_count: int | None,
        differing_keys: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        details: Mapping[str, Any] | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> ParityRecord:
        """Record one parity check (`differing_keys`: e.g. {"only_in_pg": [...], ...})."""
        query = sql.SQL(
            "INSERT INTO {} (dataset, run_id, passed, pg_count, iceberg_count, differing_keys,"
            " details) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {}"
        ).format(ledger_table("parity_results"), column_list(PARITY_COLUMNS))
        params = (
            dataset,
            run_id,
            passed,
            pg_count,
            iceberg_count,
            Jsonb(dict(differing_keys or {})),
            Jsonb(dict(details or {})),
        )
        with self.tx(conn) as c:
            row = c.execute(query, params).fetchone()
        assert row is not None
        return ParityRecord(*row)

    def last_parity(
        self, dataset: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> ParityRecord | None:
        """The most recent parity result of `dataset`, or None."""
        rows = self.select(
            "parity_results",
            PARITY_COLUMNS,
            where={"dataset": dataset},
            newest_first=True,
            conn=conn,
        )
        return ParityRecord(*rows[0]) if rows else None
