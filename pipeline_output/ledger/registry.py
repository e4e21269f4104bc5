"""The dataset registry: each dataset's key and the Arrow schema the legacy arm restores types
from (`RegisteredDataset`, table `datasets`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.types.json import Jsonb

from pipeline_output.contract.spec import check_identifier
from pipeline_output.ledger.connection import RecordLog
from pipeline_output.ledger.sql_names import ledger_table


@dataclass(frozen=True)
class RegisteredDataset:
    """A dataset in the registry: its key and the Arrow schema the legacy arm restores types from."""

    name: str
    primary_key: tuple[str, ...]
    arrow_schema: pa.Schema | None
    created_at: datetime
    updated_at: datetime


class Registry(RecordLog):
    """The registry (see the module docstring)."""

    def register_dataset(
        self,
        name: str,
        *,
        primary_key: Sequence[str],
        arrow_schema: pa.Schema | None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> None:
        """Insert or update a dataset's registry entry (key and serialized Arrow schema)."""
        check_identifier(name, what="dataset name")
        blob = arrow_schema.serialize().to_pybytes() if arrow_schema is not None else None
        readable = (
            Jsonb({f.name: str(f.type) for f in arrow_schema}) if arrow_schema is not None else None
        )
        query = sql.SQL(
            "INSERT INTO {} AS d (name, primary_key, arrow_schema, schema_text)"
            " VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET primary_key = EXCLUDED.primary_key,"
            " arrow_schema = coalesce(EXCLUDED.arrow_schema, d.arrow_schema),"
            " schema_text = coalesce(EXCLUDED.schema_text, d.schema_text),"
            " updated_at = clock_timestamp()"
        ).format(ledger_table("datasets"))
        with self.tx(conn) as c:
            c.execute(query, (name, list(primary_key), blob, readable))

    def registered(
        self, name: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> RegisteredDataset | None:
        """The registry entry of `name`, or None."""
        query = sql.SQL(
            "SELECT name, primary_key, arrow_schema, created_at, updated_at FROM {} WHERE name = %s"
        ).format(ledger_table("datasets"))
        with self.tx(conn) as c:
            row = c.execute(query, (name,)).fetchone()
        if row is None:
            return None
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(row[2]))) if row[2] is not None else None
        return RegisteredDataset(row[0], tuple(row[1]), schema, row[3], row[4])

    def dataset_schema(
        self, name: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> pa.Schema | None:
        """The registered Arrow schema of `name`, or None."""
        entry = self.registered(name, conn=conn)
        return entry.arrow_schema if entry is not None else None
