"""The legacy arm's store: `PostgresStore` keeps a dataset's rows as jsonb documents in `dataset_rows`.

Table `pipeline_output.dataset_rows (dataset_id, row_index, pk, data jsonb)` (created by the ledger's
migrations) holds one document per row. Every write mode of the native arm is implemented here with
the same semantics and counters (`WriteResult`, `arm="pg"`), each as ONE Postgres transaction:

1. take a transaction-level advisory lock keyed by the dataset (same-dataset writers serialize);
2. the freshness oracle: does the ledger hold a succeeded `pg` deploy of the dataset? (never a row
   count) — then `plan_write` decides the write mode, exactly as for the native arm;
3. reconcile the compute's schema with the registered one, using the native arm's own type rules
   (Iceberg types: new columns are added, ints/floats/decimals widen, anything else is a
   `SchemaMismatch`), and register the result in the ledger's dataset registry;
4. COPY the batch (CSV) into a typed temp table, turn it into documents with `to_jsonb`, and apply
   the write mode with set-based SQL (no per-row round trips);
5. record the deploy in the ledger, in the same transaction; its id is the result's `snapshot_id`.
   A write that changes nothing (not a first deploy) records nothing and returns `snapshot_id=None`.

`begin_write` stops before the commit and hands back a `PendingWrite` (the Dagster layer's `dual`
mode commits Postgres last, after the Iceberg commit); `write` is `begin_write(...).commit()`.

The JSON encoding of a row (what makes `read` an exact, typed round trip) is `types.py`'s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Unpack

import polars as pl
import psycopg
import pyarrow as pa
from psycopg import sql

from pipeline_output.contract.checked_input import (
    CheckedInput,
    check_in_window,
    checked_input,
    from_arrow,
)
from pipeline_output.contract.plan import TargetState, WritePlan, WriteResult, plan_write
from pipeline_output.contract.slices import check_in_partition
from pipeline_output.contract.spec import Arm, DatasetSpec, check_identifier, window_column
from pipeline_output.contract.store_protocol import (
    Capabilities,
    ReadOptions,
    WriteOptions,
    WriteScope,
    options_of,
)
from pipeline_output.errors import (
    BadInput,
    DatasetNotWritten,
    EmptyComputeRefused,
    InvalidArgument,
)
from pipeline_output.infra import locks, pgsession
from pipeline_output.ledger import Ledger
from pipeline_output.ledger.migrations import SCHEMA
from pipeline_output.stores.postgres.fragments import (
    ROWS,
    ROWS_TABLE,
    typed_value,
    window_condition,
)
from pipeline_output.stores.postgres.pending import PendingWrite, rows_as_frame
from pipeline_output.stores.postgres.staging import LEGACY_CAPABILITIES, apply_plan, rekey, stage
from pipeline_output.stores.postgres.types import (
    align_to_types,
    check_text,
    evolve_schema,
    legacy_polars_schema,
    raise_if_key_too_long,
    staged_type,
)

# -- the store --------------------------------------------------------------------------------


class PostgresStore:
    """Writes and reads datasets in the legacy row store `pipeline_output.dataset_rows`.

    The rows live in the control-plane database: the ledger (default `Ledger(url)`) must be on the
    same database, because each write records its deploy in the same transaction as its rows.
    """

    arm: Arm = "pg"
    capabilities: Capabilities = LEGACY_CAPABILITIES

    def __init__(
        self, url: str, *, ledger: Ledger | None = None, lock_timeout_s: float | None = None
    ) -> None:
        self.url = url
        self.ledger = ledger if ledger is not None else Ledger(url)
        self.lock_timeout_s = lock_timeout_s
        self._migrated = False

    # -- plumbing ------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Apply the control-plane migrations once per store instance."""
        if not self._migrated:
            self.ledger.migrate()
            self._migrated = True

    def table_name(self, spec: DatasetSpec | str) -> str:
        """Where the rows live, for display and metadata."""
        return f"{SCHEMA}.{ROWS_TABLE}"

    def _lock(self, conn: psycopg.Connection[Any], dataset: str) -> float:
        """Take the dataset's transaction-level advisory lock; returns the seconds waited."""
        return locks.acquire(
            conn,
            locks.legacy_dataset(dataset),
            transaction=True,
            timeout_s=self.lock_timeout_s,
            what=f"the legacy-arm lock on {dataset!r}",
        )

    @contextmanager
    def _transaction(
        self, conn: psycopg.Connection[Any] | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection in an open transaction (UTC session), or `conn`'s continued; committed
        by the caller, rolled back and closed on an error."""
        self.ensure_schema()
        if conn is None:
            conn = pgsession.connect(self.url)
            conn.execute("SET LOCAL TimeZone = 'UTC'")
        try:
            yield conn
        except BaseException:
            conn.rollback()
            conn.close()
            raise

    # -- the freshness oracle and counts -------------------------------------------------------

    def _state(self, conn: psycopg.Connection[Any], dataset: str) -> TargetState:
        last = self.ledger.deploy_log.last_deploy(dataset, "pg", status="succeeded", conn=conn)
        registered = self.ledger.registry.registered(dataset, conn=conn) is not None
        return TargetState(
            exists=last is not None or registered,
            has_snapshot=last is not None,
            snapshot_id=last.id if last is not None else None,
            total_rows=self._count(conn, dataset),
        )

    def target_state(self, spec: DatasetSpec | str) -> TargetState:
        """The freshness oracle: has the ledger a succeeded `pg` deploy of the dataset?"""
        name = spec if isinstance(spec, str) else spec.name
        self.ensure_schema()
        with pgsession.connect(self.url) as conn:
            return self._state(conn, name)

    def plan(self, spec: DatasetSpec, **scope: Unpack[WriteScope]) -> WritePlan:
        """The write plan a write would follow now (dry run)."""
        return plan_write(spec, self.target_state(spec), **scope)

    @staticmethod
    def _count(conn: psycopg.Connection[Any], dataset: str) -> int:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE dataset_id = %s").format(ROWS), (dataset,)
        ).fetchone()
        return int(row[0]) if row else 0

    def count(self, dataset: DatasetSpec | str) -> int:
        """How many legacy rows the dataset has."""
        name = dataset if isinstance(dataset, str) else dataset.name
        self.ensure_schema()
        with pgsession.connect(self.url) as conn:
            return self._count(conn, name)

    def drain(self, dataset: DatasetSpec | str) -> int:
        """Delete the dataset's legacy rows (the deploy history stays); returns rows deleted.

        The refusal rules (flipped to iceberg, last parity passed) belong to the caller.
        """
        name = dataset if isinstance(dataset, str) else dataset.name
        with self._transaction() as conn:
            self._lock(conn, name)
            cur = conn.execute(
                sql.SQL("DELETE FROM {} WHERE dataset_id = %s").format(ROWS), (name,)
            )
            deleted = cur.rowcount
            conn.commit()
            conn.close()
        return deleted

    # -- writing -------------------------------------------------------------------------------

    def prepare(self, spec: DatasetSpec, data: Any, **scope: Unpack[WriteScope]) -> CheckedInput:
        """Convert and check `data` (keys, text values, a partition's rows) before any
        transaction or lock."""
        LEGACY_CAPABILITIES.check_spec(spec)
        checked = checked_input(spec, data)
        LEGACY_CAPABILITIES.check_frame(spec, checked.frame)
        check_text(spec, checked.frame)
        partition = scope.get("partition")
        if partition is not None:
            check_in_partition(spec, checked.frame, partition)
        return checked

    def write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        prepared: CheckedInput | None = None,
        **options: Unpack[WriteOptions],
    ) -> WriteResult:
        """Probe, plan and write `data` for `spec` in one committed transaction
        (`begin_write(...).commit()`)."""
        return self.begin_write(spec, data, prepared=prepared, **options).commit()

    def find_marker(self, spec: DatasetSpec | str, marker: str) -> int | None:
        """The deploy id of the committed write carrying the window attempt `marker`, if any:
        recorded with the rows in one transaction, so it is there iff the rows are."""
        name = spec if isinstance(spec, str) else spec.name
        self.ensure_schema()
        record = self.ledger.deploy_log.find_marker(name, "pg", marker)
        return int(record.id) if record is not None else None

    def begin_write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        prepared: CheckedInput | None = None,
        after: PendingWrite | None = None,
        **options: Unpack[WriteOptions],
    ) -> PendingWrite:
        """Do the whole write but leave its transaction open; commit or roll back the result.

        `summary` carries the attempt's properties (a window attempt's marker is recorded on the
        deploy); `prepared` (from `prepare`) is the already checked input, used instead of `data`.
        `after` continues that pending write's transaction (it hands its connection over): a
        publish replays several writes and commits them together.
        """
        started = time.perf_counter()
        started_at = datetime.now(UTC)
        window, run_id, summary = options_of(options)
        partition = options.get("partition")
        # to_polars refuses the reserved `__po_` prefix (both arms share that check)
        frame = (
            prepared if prepared is not None else self.prepare(spec, data, partition=partition)
        ).frame
        with self._transaction(after.handover() if after is not None else None) as conn:
            lock_wait = self._lock(conn, spec.name)
            state = self._state(conn, spec.name)
            plan = plan_write(spec, state, window, partition=partition)
            self.capabilities.check_plan(spec, plan)  # a write mode without a handler
            if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
                check_in_window(spec, frame, window)
            entry = self.ledger.registry.registered(spec.name, conn=conn)
            registered = entry.arrow_schema if entry is not None else None
            arrow = evolve_schema(spec, registered, frame)
            target = legacy_polars_schema(arrow)
            types = {name: staged_type(spec.name, name, dtype) for name, dtype in target.items()}
            key_changed = entry is not None and entry.primary_key != spec.primary_key
            if registered is None or key_changed or not arrow.equals(registered):
                self.ledger.registry.register_dataset(
                    spec.name, primary_key=spec.primary_key, arrow_schema=arrow, conn=conn
                )
            if key_changed:
                rekey(conn, spec)
            frame = align_to_types(spec, frame, target)
            total_before = state.total_rows or 0
            try:
                stage(conn, spec, frame, types)
            except (psycopg.errors.TooManyColumns, psycopg.errors.ProgramLimitExceeded) as exc:
                raise_if_key_too_long(spec, frame, exc)
                raise BadInput(
                    f"dataset {spec.name!r}: the legacy Postgres arm cannot stage {frame.width} "
                    f"columns ({exc.diag.message_primary}); keep it on the iceberg arm "
                    "(nothing was written)"
                ) from exc
            try:
                counts = apply_plan(conn, spec, plan, frame.height, total_before, types)
            except psycopg.errors.ProgramLimitExceeded as exc:
                raise_if_key_too_long(spec, frame, exc)
                raise
            if frame.height == 0 and counts.deleted and not spec.allow_empty:
                raise EmptyComputeRefused(
                    f"dataset {spec.name!r}: the compute returned no rows and a {plan.write_mode} "
                    f"would delete {counts.deleted} target row(s); set allow_empty=True to allow "
                    "it (nothing was written)"
                )
            result = WriteResult.of(
                plan,
                counts,
                rows_in=frame.height,
                total_before=total_before,
                arm="pg",
                lock_wait_s=lock_wait,
                table=self.table_name(spec),
            )
            record = self.ledger.deploy_log.record_write(
                spec,
                result,
                window=window,
                run_id=run_id,
                summary=summary,
                started_at=started_at,
                conn=conn,
            )
            if record is not None:
                result = replace(result, snapshot_id=record.id)
            result = replace(result, duration_s=time.perf_counter() - started)
            return PendingWrite(conn, result)

    def schema(self, spec: DatasetSpec | str) -> pa.Schema | None:
        """The registered Arrow schema of the dataset (None when never written)."""
        name = spec if isinstance(spec, str) else spec.name
        self.ensure_schema()
        return self.ledger.registry.dataset_schema(name)

    def read(self, spec: DatasetSpec | str, **options: Unpack[ReadOptions]) -> pl.DataFrame:
        """The dataset's rows in `row_index` order, typed by its registered schema."""
        name = spec if isinstance(spec, str) else spec.name
        query, params, target, wanted = self._read_query(spec, self.schema(name), options)
        with pgsession.connect(self.url) as conn:  # values quoted by psycopg, never SQL text
            text = psycopg.ClientCursor(conn).mogrify(query, params)
        table = self._fetch_arrow(text)
        frame = from_arrow(table.replace_schema_metadata(None))
        if not wanted:
            return frame.select([])
        return frame.select([pl.col(c).cast(target[c]) for c in wanted])

    def read_pending(self, pending: PendingWrite, spec: DatasetSpec | str) -> pl.DataFrame:
        """The dataset's rows as the still-open transaction of `pending` sees them (its own
        uncommitted write included): what a commit would make every reader see."""
        name = spec if isinstance(spec, str) else spec.name
        conn = pending.connection
        arrow = self.ledger.registry.dataset_schema(name, conn=conn)
        query, params, target, wanted = self._read_query(spec, arrow, {})
        return rows_as_frame(conn, query, {c: target[c] for c in wanted}, params=params)

    def _read_query(
        self, spec: DatasetSpec | str, arrow: pa.Schema | None, options: ReadOptions
    ) -> tuple[sql.Composed, tuple[Any, ...], dict[str, pl.DataType], list[str]]:
        """The SELECT of `read` (typed values, decimals as text) and the values of its `%s`
        placeholders, the registered polars schema and the columns selected."""
        window, columns = options.get("window"), options.get("columns")
        name = spec if isinstance(spec, str) else spec.name
        if arrow is None:
            raise DatasetNotWritten(f"dataset {name!r} has no rows in the legacy Postgres arm yet")
        target = legacy_polars_schema(arrow)
        wanted = list(columns) if columns is not None else list(target)
        for col in wanted:
            check_identifier(col, what="column", dataset=name)
            if col not in target:
                raise InvalidArgument(
                    f"dataset {name!r} has no column {col!r} (columns: {list(target)})"
                )
        types = {c: staged_type(name, c, target[c]) for c in target}
        doc = sql.SQL("r.data")
        selects = []
        for col in wanted:
            value = typed_value(doc, col, types[col])
            if isinstance(target[col], pl.Decimal):
                value = sql.SQL("{}::text").format(value)  # exact digits, cast in polars
            selects.append(sql.SQL("{} AS {}").format(value, sql.Identifier(col)))
        where: sql.Composable = sql.SQL("r.dataset_id = %s")
        params: tuple[Any, ...] = (name,)
        if window is not None:
            wm = window_column(spec, options.get("watermark"))
            if wm not in target:
                raise InvalidArgument(f"reading a window of {name!r} needs its watermark column")
            inside = window_condition(doc, wm, types[wm], window)
            where, params = sql.SQL("{} AND {}").format(where, inside.sql), (name, *inside.params)
        query = sql.SQL("SELECT {} FROM {} AS r WHERE {} ORDER BY r.row_index").format(
            sql.SQL(", ").join(selects) if selects else sql.SQL("1 AS __po_none__"), ROWS, where
        )
        return query, params, dict(target), wanted

    def _fetch_arrow(self, query: str) -> pa.Table:
        """Run a read-only query and stream its result as Arrow (ADBC's COPY BINARY reader)."""

        with pgsession.adbc_connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            cur.execute(query)
            table: pa.Table = cur.fetch_arrow_table()
        fields = [f.remove_metadata() for f in table.schema]
        return table.cast(pa.schema(fields)) if fields else table


__all__ = ["PendingWrite", "PostgresStore", "evolve_schema"]
