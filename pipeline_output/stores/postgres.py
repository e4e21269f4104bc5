"""The legacy arm: `PostgresStore` keeps a dataset's rows as jsonb documents in `dataset_rows`.

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

The JSON encoding (what makes `read` an exact, typed round trip):

- each document has one key per registered column (missing key == null; older rows may lack a
  column added later); SQL NULL is JSON `null`;
- integers and decimals are JSON numbers (jsonb stores them as exact `numeric`; decimals keep
  their scale, e.g. `1.50`);
- finite floats are JSON numbers in shortest round-trip form; NaN, +inf and -inf are the strings
  `"NaN"`, `"Infinity"`, `"-Infinity"` (Postgres' own jsonb rendering of float8 specials). `-0.0`
  reads back as `0.0` (jsonb numerics have no negative zero);
- timestamps are ISO-8601 strings: naive ones without offset (`2024-01-01T12:00:00.123456`),
  tz-aware ones in UTC with `+00:00` (tz-aware columns are UTC, as in the native arm); dates are
  `YYYY-MM-DD`; booleans are JSON booleans; strings are JSON strings; binary is `"\\x<hex>"`.

`read` restores the registered Arrow schema: each value is cast in SQL from its JSON text to the
column's Postgres type and streamed back as Arrow (ADBC), then cast to the registered polars type.
The primary key is stored canonically in `pk`: the key's text for one key column
(`data->>'id'`), the JSON array of the key values for a composite key (`["a", 2]`), NULL when the
dataset has no key. Key matching compares `pk`; "unchanged" compares documents with nulls stripped,
so NaN equals NaN and null equals null (or a missing key), as in the native arm. Nested column
types (lists, structs) are not stored by this arm yet (`BadInput`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import polars as pl
import psycopg
import pyarrow as pa
from psycopg import sql
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import NestedField

from pipeline_output import pgsession
from pipeline_output.errors import (
    BadInput,
    DatasetNotWritten,
    EmptyComputeRefused,
    InvalidArgument,
    LockLost,
    LockUnavailable,
    SchemaMismatch,
    WriteAlreadyFinished,
)
from pipeline_output.frames import check_in_window, check_keys, to_polars
from pipeline_output.ledger import Ledger
from pipeline_output.ledger.migrations import SCHEMA
from pipeline_output.locks import lock_key
from pipeline_output.plan import TargetState, WritePlan, plan_write
from pipeline_output.result import WriteResult
from pipeline_output.spec import DatasetSpec, check_identifier
from pipeline_output.stores.iceberg_schema import arrow_schema_of, plan_evolution
from pipeline_output.windows import Window

ROWS_TABLE = "dataset_rows"
_ROWS = sql.Identifier(SCHEMA, ROWS_TABLE)
_IN = sql.Identifier("_po_in")
_BATCH = sql.Identifier("_po_batch")
_ORD = "__po_ord__"
_CSV_SLICE = 200_000
_BTREE_MAX_BYTES = 2704  # Postgres' btree limit on one index entry (8 kB pages, btree version 4)


# -- types ------------------------------------------------------------------------------------


def _pg_type(spec_name: str, column: str, dtype: pl.DataType) -> sql.Composable:
    """The Postgres column type a polars dtype is staged as (and cast back from on read)."""
    simple: dict[type[pl.DataType], str] = {
        pl.Int32: "integer",
        pl.Int64: "bigint",
        pl.Float32: "real",
        pl.Float64: "double precision",
        pl.Boolean: "boolean",
        pl.String: "text",
        pl.Binary: "bytea",
        pl.Date: "date",
    }
    for kind, name in simple.items():
        if isinstance(dtype, kind):
            return sql.SQL(name)  # type: ignore[arg-type,unused-ignore]  # closed set of names
    if isinstance(dtype, pl.Datetime):
        return sql.SQL("timestamptz" if dtype.time_zone else "timestamp")
    if isinstance(dtype, pl.Decimal):
        if dtype.precision is None:
            return sql.SQL("numeric")
        return sql.SQL("numeric({}, {})").format(
            sql.Literal(int(dtype.precision)), sql.Literal(int(dtype.scale))
        )
    raise BadInput(
        f"dataset {spec_name!r}: column {column!r} has type {dtype}, which the legacy Postgres arm "
        "does not store (supported: integers, floats, decimals, booleans, strings, binary, dates, "
        "timestamps)"
    )


def _to_polars(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _polars_schema(arrow: pa.Schema) -> dict[str, pl.DataType]:
    return dict(_to_polars(arrow.empty_table()).schema)


def _iceberg_arrow(schema: Schema) -> pa.Schema:
    """The Arrow schema the native arm reads a table of `schema` back as (ids stripped)."""
    arrow: pa.Schema = schema.as_arrow()
    return pa.schema([f.remove_metadata() for f in arrow])


def evolve_schema(
    spec: DatasetSpec, registered: pa.Schema | None, frame: pl.DataFrame
) -> pa.Schema:
    """The dataset's schema after this write, by the native arm's rules (Iceberg types)."""
    try:
        if registered is None:
            # a typeless (all-null) column is created as a string column, as in the native arm
            nulls = [c for c, t in frame.schema.items() if t == pl.Null]
            typed = (
                frame.with_columns([pl.col(c).cast(pl.String) for c in nulls]) if nulls else frame
            )
            fresh = assign_fresh_schema_ids(
                Catalog._convert_schema_if_needed(arrow_schema_of(typed))
            )
            return _iceberg_arrow(fresh)
        current = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(registered))
        evolution = plan_evolution(spec, current, frame)
        if evolution.empty:
            return registered
        widen = dict(evolution.widen)
        fields = [
            NestedField(f.field_id, f.name, widen.get(f.name, f.field_type), required=False)
            for f in current.fields
        ]
        next_id = current.highest_field_id + 1
        for offset, (name, new_type) in enumerate(evolution.add):
            fields.append(NestedField(next_id + offset, name, new_type, required=False))
        return _iceberg_arrow(assign_fresh_schema_ids(Schema(*fields)))
    except SchemaMismatch:
        raise
    except (TypeError, ValueError) as exc:  # pyiceberg: unsupported type (time, non-UTC tz)
        raise SchemaMismatch(f"dataset {spec.name!r}: {exc} (nothing was written)") from exc


def _align(spec: DatasetSpec, frame: pl.DataFrame, target: dict[str, pl.DataType]) -> pl.DataFrame:
    """`frame` with exactly the registered columns, in order, cast to their types (missing: null)."""
    exprs = []
    for name, dtype in target.items():
        if name in frame.columns:
            col = pl.col(name)
            exprs.append(col if frame.schema[name] == dtype else col.cast(dtype, strict=True))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    try:
        return frame.select(exprs)
    except pl.exceptions.PolarsError as exc:
        raise SchemaMismatch(
            f"dataset {spec.name!r}: cannot cast the compute to the registered schema: {exc}"
        ) from exc


def _csv_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """Binary columns as Postgres bytea hex text (`\\x...`); everything else as polars writes it."""
    binary = [n for n, t in frame.schema.items() if isinstance(t, pl.Binary)]
    if not binary:
        return frame
    return frame.with_columns(
        [pl.concat_str(pl.lit("\\x"), pl.col(n).bin.encode("hex")).alias(n) for n in binary]
    )


def _check_text(spec: DatasetSpec, frame: pl.DataFrame) -> None:
    """Refuse NUL characters in string columns: Postgres text (and jsonb) cannot hold U+0000."""
    strings = [n for n, t in frame.schema.items() if isinstance(t, pl.String)]
    if not strings or not frame.height:
        return
    has_nul = frame.select([pl.col(n).str.contains("\x00", literal=True).any() for n in strings])
    bad = [n for n, flag in zip(strings, has_nul.row(0), strict=True) if flag]
    if bad:
        raise BadInput(
            f"dataset {spec.name!r}: string column(s) {', '.join(map(repr, bad))} contain NUL "
            "characters (\\x00), which Postgres text cannot store; strip them in the compute or "
            "keep the dataset on the iceberg arm (nothing was written)"
        )


def _raise_if_key_too_long(spec: DatasetSpec, frame: pl.DataFrame, exc: psycopg.Error) -> None:
    """An index-entry limit hit while writing the key index is the key's length: say so."""
    message = exc.diag.message_primary or ""
    if not spec.primary_key or "index row" not in message:
        return
    sizes = [
        pl.col(c).str.len_bytes() if isinstance(t, pl.String) else pl.col(c).bin.size()
        for c, t in frame.schema.items()
        if c in spec.primary_key and isinstance(t, (pl.String, pl.Binary))
    ]
    longest = ""
    if sizes and frame.height:
        size = frame.select(pl.max_horizontal(sizes).max()).item()
        longest = f"; the longest key value here is {size} bytes"
    raise BadInput(
        f"dataset {spec.name!r}: a value of primary-key column(s) "
        f"{', '.join(map(repr, spec.primary_key))} is too long for the legacy Postgres arm's key "
        f"index (Postgres btree entries are limited to {_BTREE_MAX_BYTES} bytes after "
        f"compression{longest}; {message}); shorten or hash the key, or keep the dataset on the "
        "iceberg arm (nothing was written)"
    ) from exc


# -- SQL fragments ----------------------------------------------------------------------------


def _pk_expr(spec: DatasetSpec, doc: sql.Composable) -> sql.Composable:
    """The canonical key text of a document: `doc->>'k'`, or a JSON array for composite keys."""
    pk = spec.primary_key
    if not pk:
        return sql.SQL("NULL::text")
    if len(pk) == 1:
        return sql.SQL("({} ->> {})").format(doc, sql.Literal(pk[0]))
    return sql.SQL("jsonb_build_array({})::text").format(
        sql.SQL(", ").join(sql.SQL("{} -> {}").format(doc, sql.Literal(k)) for k in pk)
    )


def _typed_value(doc: sql.Composable, column: str, pg_type: sql.Composable) -> sql.Composable:
    return sql.SQL("(({} ->> {})::{})").format(doc, sql.Literal(column), pg_type)


def _window_condition(
    doc: sql.Composable, column: str, pg_type: sql.Composable, window: Window
) -> sql.Composable:
    """`low < watermark <= high` on a document's typed watermark (nulls are never inside)."""
    value = _typed_value(doc, column, pg_type)
    if pg_type in (sql.SQL("timestamptz"), sql.SQL("timestamp")):
        # the bound's zone follows the column's, never the session's TimeZone
        window = window.aligned(aware=pg_type == sql.SQL("timestamptz"))
    high = sql.SQL("{} <= {}").format(value, sql.Literal(window.high))
    if window.low is None:
        return high
    return sql.SQL("({} > {} AND {})").format(value, sql.Literal(window.low), high)


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


@dataclass
class _Counts:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    preserved: int = 0
    skipped: int = 0


# -- the store --------------------------------------------------------------------------------


class PostgresStore:
    """Writes and reads datasets in the legacy row store `pipeline_output.dataset_rows`.

    The rows live in the control-plane database: the ledger (default `Ledger(url)`) must be on the
    same database, because each write records its deploy in the same transaction as its rows.
    """

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
        started = time.perf_counter()
        if self.lock_timeout_s is not None:
            conn.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                (f"{int(self.lock_timeout_s * 1000)}ms",),
            )
        try:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(f"pg:{dataset}"),))
        except psycopg.errors.LockNotAvailable as exc:
            raise LockUnavailable(
                f"timed out after {self.lock_timeout_s}s waiting for the legacy-arm lock on "
                f"{dataset!r}"
            ) from exc
        if self.lock_timeout_s is not None:
            conn.execute("SELECT set_config('lock_timeout', '0', true)")
        return time.perf_counter() - started

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection in an open transaction (UTC session); committed by the caller."""
        self.ensure_schema()
        conn = pgsession.connect(self.url)
        try:
            conn.execute("SET LOCAL TimeZone = 'UTC'")
            yield conn
        except BaseException:
            conn.rollback()
            conn.close()
            raise

    # -- the freshness oracle and counts -------------------------------------------------------

    def _state(self, conn: psycopg.Connection[Any], dataset: str) -> TargetState:
        last = self.ledger.last_deploy(dataset, "pg", status="succeeded", conn=conn)
        registered = self.ledger.registered(dataset, conn=conn) is not None
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

    def plan(self, spec: DatasetSpec, *, window: Window | None = None) -> WritePlan:
        """The write plan a write would follow now (dry run)."""
        return plan_write(spec, self.target_state(spec), window)

    @staticmethod
    def _count(conn: psycopg.Connection[Any], dataset: str) -> int:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE dataset_id = %s").format(_ROWS), (dataset,)
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
                sql.SQL("DELETE FROM {} WHERE dataset_id = %s").format(_ROWS), (name,)
            )
            deleted = cur.rowcount
            conn.commit()
            conn.close()
        return deleted

    # -- writing -------------------------------------------------------------------------------

    def write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        window: Window | None = None,
        run_id: str | None = None,
    ) -> WriteResult:
        """Probe, plan and write `data` for `spec` in one committed transaction."""
        return self.begin_write(spec, data, window=window, run_id=run_id).commit()

    def begin_write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        window: Window | None = None,
        run_id: str | None = None,
    ) -> PendingWrite:
        """Do the whole write but leave its transaction open; commit or roll back the result."""
        started = time.perf_counter()
        started_at = datetime.now(UTC)
        # to_polars refuses the reserved `__po_` prefix (both arms share that check)
        frame = check_keys(spec, to_polars(spec, data))
        _check_text(spec, frame)
        with self._transaction() as conn:
            lock_wait = self._lock(conn, spec.name)
            state = self._state(conn, spec.name)
            plan = plan_write(spec, state, window)
            if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
                check_in_window(spec, frame, window)
            entry = self.ledger.registered(spec.name, conn=conn)
            registered = entry.arrow_schema if entry is not None else None
            arrow = evolve_schema(spec, registered, frame)
            target = _polars_schema(arrow)
            types = {name: _pg_type(spec.name, name, dtype) for name, dtype in target.items()}
            key_changed = entry is not None and entry.primary_key != spec.primary_key
            if registered is None or key_changed or not arrow.equals(registered):
                self.ledger.register_dataset(
                    spec.name, primary_key=spec.primary_key, arrow_schema=arrow, conn=conn
                )
            if key_changed:
                self._rekey(conn, spec)
            frame = _align(spec, frame, target)
            total_before = state.total_rows or 0
            try:
                self._stage(conn, spec, frame, types)
            except (psycopg.errors.TooManyColumns, psycopg.errors.ProgramLimitExceeded) as exc:
                _raise_if_key_too_long(spec, frame, exc)
                raise BadInput(
                    f"dataset {spec.name!r}: the legacy Postgres arm cannot stage {frame.width} "
                    f"columns ({exc.diag.message_primary}); keep it on the iceberg arm "
                    "(nothing was written)"
                ) from exc
            try:
                counts = self._apply(conn, spec, plan, frame.height, total_before, types)
            except psycopg.errors.ProgramLimitExceeded as exc:
                _raise_if_key_too_long(spec, frame, exc)
                raise
            if frame.height == 0 and counts.deleted and not spec.allow_empty:
                raise EmptyComputeRefused(
                    f"dataset {spec.name!r}: the compute returned no rows and a {plan.write_mode} "
                    f"would delete {counts.deleted} target row(s); set allow_empty=True to allow "
                    "it (nothing was written)"
                )
            result = WriteResult(
                dataset=spec.name,
                write_mode=plan.write_mode,
                first_deploy=plan.first_deploy,
                rows_in=frame.height,
                rows_inserted=counts.inserted,
                rows_updated=counts.updated,
                rows_deleted=counts.deleted,
                rows_unchanged=counts.unchanged,
                rows_preserved=counts.preserved,
                rows_skipped=counts.skipped,
                rows_total_after=total_before + counts.inserted - counts.deleted,
                lock_wait_s=lock_wait,
                table=self.table_name(spec),
                arm="pg",
            )
            changed = counts.inserted or counts.updated or counts.deleted
            if changed or plan.first_deploy:
                record = self.ledger.record_deploy(
                    spec.name,
                    "pg",
                    status="succeeded",
                    run_id=run_id,
                    strategy=spec.strategy,
                    window=window,
                    result=result,
                    started_at=started_at,
                    conn=conn,
                )
                result = replace(result, snapshot_id=record.id)
            result = replace(result, duration_s=time.perf_counter() - started)
            return PendingWrite(conn, result)

    @staticmethod
    def _rekey(conn: psycopg.Connection[Any], spec: DatasetSpec) -> None:
        """The spec's primary key changed: recompute every stored row's canonical key text."""
        conn.execute(
            sql.SQL("UPDATE {} AS r SET pk = {} WHERE r.dataset_id = %s").format(
                _ROWS, _pk_expr(spec, sql.SQL("r.data"))
            ),
            (spec.name,),
        )

    def _stage(
        self,
        conn: psycopg.Connection[Any],
        spec: DatasetSpec,
        frame: pl.DataFrame,
        types: dict[str, sql.Composable],
    ) -> None:
        """COPY the batch into `_po_in` (typed), then build `_po_batch (ord, pk, data jsonb)`."""
        columns = [*types, _ORD]
        column_defs = sql.SQL(", ").join(
            [sql.SQL("{} {}").format(sql.Identifier(n), t) for n, t in types.items()]
            + [sql.SQL("{} bigint").format(sql.Identifier(_ORD))]
        )
        conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(_IN, column_defs))
        staged = _csv_ready(frame).with_row_index(_ORD).select(columns)
        copy = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            _IN, sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        )
        with conn.cursor().copy(copy) as cp:
            for offset in range(0, staged.height, _CSV_SLICE):
                chunk = staged.slice(offset, _CSV_SLICE)
                cp.write(chunk.write_csv(include_header=False, quote_style="non_numeric"))
        doc = sql.SQL("(to_jsonb(src.*) - {})").format(sql.Literal(_ORD))
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE {batch} ON COMMIT DROP AS"
                " SELECT s.ord, {pk} AS pk, s.data FROM"
                " (SELECT src.{ord} AS ord, {doc} AS data FROM {src} AS src) AS s"
            ).format(
                batch=_BATCH,
                pk=_pk_expr(spec, sql.SQL("s.data")),
                ord=sql.Identifier(_ORD),
                doc=doc,
                src=_IN,
            )
        )
        if spec.primary_key:
            conn.execute(sql.SQL("CREATE INDEX ON {} (pk)").format(_BATCH))
        conn.execute(sql.SQL("ANALYZE {}").format(_BATCH))

    def _apply(
        self,
        conn: psycopg.Connection[Any],
        spec: DatasetSpec,
        plan: WritePlan,
        n_in: int,
        total_before: int,
        types: dict[str, sql.Composable],
    ) -> _Counts:
        """Execute the plan's write mode with set-based SQL over `_po_batch`."""
        name = spec.name
        mode = plan.write_mode
        counts = _Counts()
        window_cond: sql.Composable | None = None
        if plan.window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
            wm = spec.watermark
            if wm is None or wm not in types:
                raise BadInput(
                    f"dataset {name!r}: a windowed write needs the watermark column {wm!r} in "
                    "the dataset"
                )
            window_cond = _window_condition(sql.SQL("r.data"), wm, types[wm], plan.window)

        if mode == "replace":
            if plan.delete_scope == "window" and window_cond is not None:
                counts.deleted = conn.execute(
                    sql.SQL("DELETE FROM {} AS r WHERE r.dataset_id = %s AND {}").format(
                        _ROWS, window_cond
                    ),
                    (name,),
                ).rowcount
                counts.preserved = total_before - counts.deleted
                counts.inserted = self._insert(conn, name, base=self._next_index(conn, name))
            else:
                counts.deleted = conn.execute(
                    sql.SQL("DELETE FROM {} WHERE dataset_id = %s").format(_ROWS), (name,)
                ).rowcount
                counts.inserted = self._insert(conn, name, base=0)
            return counts

        if mode == "append":
            counts.inserted = self._insert(conn, name, base=self._next_index(conn, name))
            counts.preserved = total_before
            return counts

        if mode == "append_new":
            counts.inserted = self._insert(
                conn, name, base=self._next_index(conn, name), only_new=True
            )
            counts.skipped = n_in - counts.inserted
            counts.preserved = total_before - counts.skipped
            return counts

        # upsert / sync
        base = self._next_index(conn, name)
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} AS r JOIN {} AS b ON r.pk = b.pk WHERE r.dataset_id = %s"
            ).format(_ROWS, _BATCH),
            (name,),
        ).fetchone()
        matched = int(row[0]) if row else 0
        counts.updated = conn.execute(
            sql.SQL(
                "UPDATE {} AS r SET data = b.data FROM {} AS b"
                " WHERE r.dataset_id = %s AND r.pk = b.pk"
                " AND jsonb_strip_nulls(r.data) IS DISTINCT FROM jsonb_strip_nulls(b.data)"
            ).format(_ROWS, _BATCH),
            (name,),
        ).rowcount
        counts.unchanged = matched - counts.updated
        if mode == "sync":
            scope = (
                sql.SQL(" AND {}").format(window_cond) if window_cond is not None else sql.SQL("")
            )
            counts.deleted = conn.execute(
                sql.SQL(
                    "DELETE FROM {} AS r WHERE r.dataset_id = %s"
                    " AND NOT EXISTS (SELECT 1 FROM {} AS b WHERE b.pk = r.pk){}"
                ).format(_ROWS, _BATCH, scope),
                (name,),
            ).rowcount
        counts.inserted = self._insert(conn, name, base=base, only_new=True)
        counts.preserved = total_before - matched - counts.deleted
        return counts

    @staticmethod
    def _next_index(conn: psycopg.Connection[Any], dataset: str) -> int:
        row = conn.execute(
            sql.SQL("SELECT coalesce(max(row_index), -1) + 1 FROM {} WHERE dataset_id = %s").format(
                _ROWS
            ),
            (dataset,),
        ).fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def _insert(
        conn: psycopg.Connection[Any], dataset: str, *, base: int, only_new: bool = False
    ) -> int:
        """Insert the batch at `base + ord` (only keys absent from the dataset when `only_new`)."""
        where = (
            sql.SQL(
                " WHERE NOT EXISTS (SELECT 1 FROM {} AS r WHERE r.dataset_id = %s AND r.pk = b.pk)"
            ).format(_ROWS)
            if only_new
            else sql.SQL("")
        )
        params: tuple[Any, ...] = (dataset, base, dataset) if only_new else (dataset, base)
        return conn.execute(
            sql.SQL(
                "INSERT INTO {} (dataset_id, row_index, pk, data)"
                " SELECT %s, %s + b.ord, b.pk, b.data FROM {} AS b{} ORDER BY b.ord"
            ).format(_ROWS, _BATCH, where),
            params,
        ).rowcount

    # -- reading -------------------------------------------------------------------------------

    def schema(self, spec: DatasetSpec | str) -> pa.Schema | None:
        """The registered Arrow schema of the dataset (None when never written)."""
        name = spec if isinstance(spec, str) else spec.name
        self.ensure_schema()
        return self.ledger.dataset_schema(name)

    def read(
        self,
        spec: DatasetSpec | str,
        *,
        window: Window | None = None,
        columns: Sequence[str] | None = None,
        watermark: str | None = None,
    ) -> pl.DataFrame:
        """The dataset's rows in `row_index` order, typed by its registered schema."""
        name = spec if isinstance(spec, str) else spec.name
        arrow = self.schema(name)
        if arrow is None:
            raise DatasetNotWritten(f"dataset {name!r} has no rows in the legacy Postgres arm yet")
        target = _polars_schema(arrow)
        wanted = list(columns) if columns is not None else list(target)
        for col in wanted:
            check_identifier(col, what="column", dataset=name)
            if col not in target:
                raise InvalidArgument(
                    f"dataset {name!r} has no column {col!r} (columns: {list(target)})"
                )
        types = {c: _pg_type(name, c, target[c]) for c in target}
        doc = sql.SQL("r.data")
        selects = []
        for col in wanted:
            value = _typed_value(doc, col, types[col])
            if isinstance(target[col], pl.Decimal):
                value = sql.SQL("{}::text").format(value)  # exact digits, cast in polars
            selects.append(sql.SQL("{} AS {}").format(value, sql.Identifier(col)))
        where = sql.SQL("r.dataset_id = {}").format(sql.Literal(name))
        if window is not None:
            wm = watermark or (spec.watermark if isinstance(spec, DatasetSpec) else None)
            if wm is None or wm not in target:
                raise InvalidArgument(f"reading a window of {name!r} needs its watermark column")
            where = sql.SQL("{} AND {}").format(
                where, _window_condition(doc, wm, types[wm], window)
            )
        query = sql.SQL("SELECT {} FROM {} AS r WHERE {} ORDER BY r.row_index").format(
            sql.SQL(", ").join(selects) if selects else sql.SQL("1 AS __po_none__"), _ROWS, where
        )
        table = self._fetch_arrow(query.as_string(None))
        frame = _to_polars(table.replace_schema_metadata(None))
        if not wanted:
            return frame.select([])
        return frame.select([pl.col(c).cast(target[c]) for c in wanted])

    def _fetch_arrow(self, query: str) -> pa.Table:
        """Run a read-only query and stream its result as Arrow (ADBC's COPY BINARY reader)."""

        with pgsession.adbc_connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            cur.execute(query)
            table: pa.Table = cur.fetch_arrow_table()
        fields = [f.remove_metadata() for f in table.schema]
        return table.cast(pa.schema(fields)) if fields else table


__all__ = ["PendingWrite", "PostgresStore", "evolve_schema"]
