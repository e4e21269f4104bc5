"""`Ledger`: the Postgres control plane — dataset registry, deploys, mode flips, parity results.

Every method opens its own short transaction, or joins the caller's when given `conn=` (the legacy
arm records its deploy in the same transaction as its rows, so both commit or neither does). All SQL
is composed with `psycopg.sql` and placeholders; no value is ever formatted into a query.

The freshness oracle of the legacy arm is `has_succeeded_deploy(dataset, "pg")`: whether this
ledger holds a succeeded deploy of the dataset to that arm — never a row count.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.types.json import Jsonb

from pipeline_output.contract.spec import MODES, check_identifier
from pipeline_output.contract.windows import Window
from pipeline_output.errors import InvalidArgument
from pipeline_output.errors import UnknownMode as UnknownMode
from pipeline_output.infra import locks, pgsession
from pipeline_output.ledger import migrations
from pipeline_output.ledger.audit_log import AuditLog
from pipeline_output.ledger.deploys import DeployLog
from pipeline_output.ledger.records import (  # re-exported: ARMS, DEPLOY_STATUSES, the records
    FLIP_COLUMNS,
    PARITY_COLUMNS,
    DeployRecord,
    FlipRecord,
    ParityRecord,
    RegisteredDataset,
    column_list,
    ledger_table,
)


class Ledger(DeployLog, AuditLog):
    """The control plane on one Postgres database (`url`); schema `pipeline_output` (deploys:
    `DeployLog`; audits, rollbacks and drains: `AuditLog`)."""

    def __init__(self, url: str) -> None:
        self.url = url

    # -- connections and migrations ------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (not autocommit) to the control-plane database."""
        return pgsession.connect(self.url)

    @contextmanager
    def _tx(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection (its transaction), or a fresh one committed on success."""
        if conn is not None:
            yield conn
            return
        with pgsession.connect(self.url) as own:
            yield own

    def migrate(self) -> list[int]:
        """Apply pending migrations (safe to call from many processes); returns versions applied."""
        with pgsession.connect(self.url) as conn:
            return migrations.migrate(conn)

    def applied_migrations(self) -> list[int]:
        """Versions recorded in `pipeline_output.schema_migrations`."""
        with pgsession.connect(self.url) as conn:
            return migrations.applied(conn)

    # -- dataset registry ----------------------------------------------------------------------

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
        with self._tx(conn) as c:
            c.execute(query, (name, list(primary_key), blob, readable))

    def registered(
        self, name: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> RegisteredDataset | None:
        """The registry entry of `name`, or None."""
        query = sql.SQL(
            "SELECT name, primary_key, arrow_schema, created_at, updated_at FROM {} WHERE name = %s"
        ).format(ledger_table("datasets"))
        with self._tx(conn) as c:
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

    def datasets(self) -> list[str]:
        """Every dataset the control plane knows of (registry, deploys, flips, parity), sorted."""
        query = sql.SQL(
            "SELECT name FROM {} UNION SELECT dataset FROM {} UNION SELECT dataset FROM {}"
            " UNION SELECT dataset FROM {} ORDER BY 1"
        ).format(
            ledger_table("datasets"),
            ledger_table("deploys"),
            ledger_table("mode_flips"),
            ledger_table("parity_results"),
        )
        with self._tx(None) as c:
            return [str(r[0]) for r in c.execute(query).fetchall()]

    # -- deploys (the records themselves: `deploys.DeployLog`) -----------------------------

    def record_divergence(
        self,
        dataset: str,
        *,
        run_id: str | None,
        error: str,
        window: Window | str | None = None,
        snapshot_id: int | None = None,
        strategy: str | None = None,
        write_mode: str | None = None,
        started_at: datetime | None = None,
    ) -> DeployRecord:
        """The Postgres commit failed after the Iceberg commit of a `dual` write: record both a
        `diverged` legacy deploy and a failed parity result (so status and drain see it)."""
        with self._tx(None) as c:
            record = self.record_deploy(
                dataset,
                "pg",
                status="diverged",
                run_id=run_id,
                strategy=strategy,
                write_mode=write_mode,
                window=window,
                snapshot_id=snapshot_id,
                started_at=started_at,
                error=error,
                conn=c,
            )
            self.record_parity(
                dataset,
                passed=False,
                pg_count=None,
                iceberg_count=None,
                run_id=run_id,
                details={
                    "reason": "diverged",
                    "error": error,
                    "deploy_id": record.id,
                    "iceberg_snapshot_id": snapshot_id,
                },
                conn=c,
            )
        return record

    # -- mode flips ----------------------------------------------------------------------------

    def flip(self, dataset: str, mode: str, *, who: str, reason: str | None = None) -> FlipRecord:
        """Persist `dataset`'s mode (pg | iceberg | dual) with history; returns the history row."""
        if mode not in MODES:
            raise UnknownMode(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        check_identifier(dataset, what="dataset name")
        if not who:
            raise InvalidArgument("a flip needs `who` (the person or process flipping)")
        with self._tx(None) as c:
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
        query = sql.SQL("SELECT mode FROM {} WHERE dataset = %s").format(
            ledger_table("dataset_modes")
        )
        with self._tx(conn) as c:
            row = c.execute(query, (dataset,)).fetchone()
        return str(row[0]) if row is not None else None

    def flips(self) -> dict[str, str]:
        """Every persisted flip: dataset -> mode."""
        query = sql.SQL("SELECT dataset, mode FROM {} ORDER BY dataset").format(
            ledger_table("dataset_modes")
        )
        with self._tx(None) as c:
            return {str(d): str(m) for d, m in c.execute(query).fetchall()}

    def flip_history(self, dataset: str) -> list[FlipRecord]:
        """Every flip of `dataset`, oldest first."""
        query = sql.SQL("SELECT {} FROM {} WHERE dataset = %s ORDER BY id").format(
            column_list(FLIP_COLUMNS), ledger_table("mode_flips")
        )
        with self._tx(None) as c:
            return [FlipRecord(*r) for r in c.execute(query, (dataset,)).fetchall()]

    # -- parity --------------------------------------------------------------------------------

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
        with self._tx(conn) as c:
            row = c.execute(query, params).fetchone()
        assert row is not None
        return ParityRecord(*row)

    def last_parity(
        self, dataset: str, *, conn: psycopg.Connection[Any] | None = None
    ) -> ParityRecord | None:
        """The most recent parity result of `dataset`, or None."""
        query = sql.SQL("SELECT {} FROM {} WHERE dataset = %s ORDER BY id DESC LIMIT 1").format(
            column_list(PARITY_COLUMNS), ledger_table("parity_results")
        )
        with self._tx(conn) as c:
            row = c.execute(query, (dataset,)).fetchone()
        return ParityRecord(*row) if row is not None else None
