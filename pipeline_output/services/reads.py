"""Lazy reads: a dataset (on either arm) or an Iceberg table as a polars LazyFrame that reads only
what the query needs.

Owns the LazyFrames downstream computes receive (`Publisher.scan`, the Dagster IO manager's
inputs, the window reads of a delta dataset over another dataset, Iceberg sources) and the
rendering of pushed predicates as the two arms' filters. When a frame is collected polars
pushes the projected columns and the query's predicate into its source:

- **Iceberg** (`scan_table`, `scan_iceberg_dataset`): not an IO source but polars' own native
  Iceberg scan (`native_scan.snapshot_scan`), pinned to the snapshot that was current when the
  LazyFrame was built (every collect reads that snapshot, whatever was committed since): polars
  pushes the projection and predicate into it, plans the files with `scan_planning` (pruned by
  partitions and column statistics) and reads only the projected column chunks, filtering row
  groups by their statistics;
  a collect after expiry removed that snapshot fails planning it: `SnapshotExpired`. (A frame
  already collected once reuses its plan: collected again after expiry, polars reports the
  missing file itself);
- **legacy Postgres** (`scan_postgres_dataset`), a polars IO source (`register_io_source`,
  `io_source`): one `SELECT` of only the projected columns (each
  a typed value of the row's jsonb document, named with `psycopg.sql` identifiers) whose `WHERE`
  carries the translated predicate as SQL parameters (`%s`, rendered by psycopg). Postgres has no
  snapshots to pin across statements: a collect reads the rows committed at that moment.

Which predicates are pushed is `lazy_predicates`' business; the full predicate is always
re-applied in polars to what was read, so a pushed filter only has to keep every row the
predicate keeps.

A window (`within`) is such a predicate — `low < watermark <= high`, aligned to the column's type —
so a delta window over a dataset is pushed like any other filter. Pure core: no Dagster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Unpack

import polars as pl
import pyarrow as pa
from psycopg import sql

from pipeline_output.contract.checked_input import from_arrow, polars_schema
from pipeline_output.contract.predicates import (
    AnyOf,
    Compare,
    InList,
    Nullness,
    Term,
    pushable_terms,
)
from pipeline_output.contract.spec import DatasetSpec, window_column
from pipeline_output.contract.store_protocol import WindowRead
from pipeline_output.contract.windows import Window
from pipeline_output.errors import DatasetNotWritten, InvalidArgument

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from pipeline_output.stores.iceberg import IcebergStore
    from pipeline_output.stores.postgres import PostgresStore


# -- Iceberg --------------------------------------------------------------------------------------


def iceberg_filter(terms: Sequence[Term], schema: Schema) -> BooleanExpression:
    """The pyiceberg row filter of `terms` (terms pyiceberg cannot bind to `schema` are left out)."""
    from pyiceberg.expressions import AlwaysTrue, And
    from pyiceberg.expressions.visitors import bind

    kept = []
    for term in terms:
        expr = _iceberg_term(term)
        try:
            bind(schema, expr, case_sensitive=True)
        except Exception:  # e.g. a literal the field's type refuses: polars filters instead
            continue
        kept.append(expr)
    if not kept:
        return AlwaysTrue()
    return functools.reduce(And, kept)


def _iceberg_value(value: Any) -> Any:
    # datetimes and dates as ISO strings, zoned like the field (`+00:00` for timestamptz only)
    return value.isoformat() if isinstance(value, (datetime, date)) else value


def _iceberg_term(term: Term) -> BooleanExpression:
    from pyiceberg import expressions

    ex: Any = expressions  # pydantic models: their constructors do not type-check positionally
    out: BooleanExpression
    if isinstance(term, Compare):
        kind = {
            "==": ex.EqualTo,
            "!=": ex.NotEqualTo,
            "<": ex.LessThan,
            "<=": ex.LessThanOrEqual,
            ">": ex.GreaterThan,
            ">=": ex.GreaterThanOrEqual,
        }[term.op]
        out = kind(term.column, _iceberg_value(term.value))
    elif isinstance(term, InList):
        values = {_iceberg_value(v) for v in term.values}
        out = ex.In(term.column, values) if values else ex.AlwaysFalse()
    elif isinstance(term, Nullness):
        out = ex.NotNull(term.column) if term.negated else ex.IsNull(term.column)
    else:
        disjuncts = [functools.reduce(ex.And, [_iceberg_term(t) for t in p]) for p in term.parts]
        out = functools.reduce(ex.Or, disjuncts)
    return out


def scan_table(
    table: Table,
    *,
    name: str | None = None,
    snapshot_id: int | None = None,
    dataset: str | None = None,
) -> pl.LazyFrame:
    """`table` as a LazyFrame pinned to its current snapshot, or to `snapshot_id`: polars' native
    Iceberg scan itself (`native_scan`, planned by `scan_planning`), so polars pushes the
    projection, predicate and row limit into it; columns whose native type differs from the
    project's (`target_schema`) are cast. Collected after expiry removed that snapshot:
    `SnapshotExpired` naming `dataset` (or the table, `name`) and the snapshot, raised when the
    collect plans the scan."""
    from pipeline_output.stores.iceberg.table.native_scan import (
        silence_planner_note,
        snapshot_scan,
        snapshot_schema,
        target_schema,
        typed,
    )

    if snapshot_id is None and (current := table.current_snapshot()) is not None:
        snapshot_id = current.snapshot_id
    target = target_schema(snapshot_schema(table, snapshot_id))
    if snapshot_id is None:  # no committed snapshot: empty, and stays so for this frame
        return pl.LazyFrame(schema=target)
    silence_planner_note()
    frame = snapshot_scan(table, snapshot_id, dataset=dataset or name)
    return typed(frame, target)


def scan_iceberg_dataset(
    store: IcebergStore,
    spec: DatasetSpec | str,
    *,
    as_of: int | datetime | None = None,
    **rows: Unpack[WindowRead],
) -> pl.LazyFrame:
    """A dataset's Iceberg table as a LazyFrame pinned to its current snapshot, or to the one
    `as_of` names (a snapshot id, or the snapshot main pointed at at an aware time)."""
    table = store.load(spec)
    if table is None:
        raise DatasetNotWritten(f"dataset {store.table_name(spec)!r} has no Iceberg table yet")
    snapshot_id = store.snapshot_as_of(spec, as_of, table=table) if as_of is not None else None
    name = spec if isinstance(spec, str) else spec.name
    frame = scan_table(table, name=store.table_name(spec), snapshot_id=snapshot_id, dataset=name)
    return _in_window(frame, spec, rows)


# -- the legacy Postgres arm ----------------------------------------------------------------------


def postgres_where(
    terms: Sequence[Term], value_of: Callable[[str], sql.Composable], dtypes: pl.Schema
) -> tuple[list[sql.Composable], list[Any]]:
    """SQL conditions (with `%s` placeholders) and their parameters for `terms`.

    `value_of(column)` is the SQL expression of a column's typed value; string columns compare
    under `COLLATE "C"` (byte order, as polars and Iceberg compare strings).
    """
    params: list[Any] = []

    def render(term: Term) -> sql.Composable:
        if isinstance(term, AnyOf):
            return sql.SQL("({})").format(
                sql.SQL(" OR ").join(
                    sql.SQL("({})").format(sql.SQL(" AND ").join(render(t) for t in part))
                    for part in term.parts
                )
            )
        value = value_of(term.column)
        if isinstance(dtypes.get(term.column), pl.String):
            value = sql.SQL('({} COLLATE "C")').format(value)
        if isinstance(term, Nullness):
            return sql.SQL("{} IS NOT NULL" if term.negated else "{} IS NULL").format(value)
        if isinstance(term, InList):
            if not term.values:
                return sql.SQL("FALSE")
            params.append(list(term.values))
            return sql.SQL("{} = ANY(%s)").format(value)
        params.append(term.value)
        op = "<>" if term.op == "!=" else ("=" if term.op == "==" else term.op)
        return sql.SQL("{} {} %s").format(value, sql.SQL(op))  # op: from a closed set

    return [render(t) for t in terms], params


def scan_postgres_dataset(
    store: PostgresStore, spec: DatasetSpec | str, **rows: Unpack[WindowRead]
) -> pl.LazyFrame:
    """A dataset's legacy-arm rows as a LazyFrame: one SELECT of the projected columns, the
    translated predicate (the window included) as SQL parameters, in `row_index` order."""
    from pipeline_output.ledger.migrations import SCHEMA
    from pipeline_output.stores.postgres import ROWS_TABLE, staged_type

    name = spec if isinstance(spec, str) else spec.name
    arrow = store.schema(name)
    if arrow is None:
        raise DatasetNotWritten(f"dataset {name!r} has no rows in the legacy Postgres arm yet")
    target = polars_schema(arrow)
    # the store's own type mapping, so the read stays its exact, typed round trip
    types = {c: staged_type(name, c, t) for c, t in target.items()}
    url = store.url

    def value_of(column: str) -> sql.Composable:
        return sql.SQL("((r.data ->> {})::{})").format(sql.Literal(column), types[column])

    def read(
        columns: list[str], needed: list[str], predicate: pl.Expr | None, n_rows: int | None
    ) -> Iterable[pl.DataFrame]:
        conditions, params = postgres_where(pushable_terms(predicate, target), value_of, target)
        selects = []
        for col in needed:
            value = value_of(col)
            if isinstance(target[col], pl.Decimal):
                value = sql.SQL("{}::text").format(value)  # exact digits, cast in polars
            selects.append(sql.SQL("{} AS {}").format(value, sql.Identifier(col)))
        limit: sql.Composable = sql.SQL("")
        if predicate is None and n_rows is not None:
            limit = sql.SQL(" LIMIT {}").format(sql.Literal(int(n_rows)))
        query = sql.SQL("SELECT {} FROM {} AS r WHERE {} ORDER BY r.row_index{}").format(
            sql.SQL(", ").join(selects) if selects else sql.SQL("1 AS __po_none__"),
            sql.Identifier(SCHEMA, ROWS_TABLE),
            sql.SQL(" AND ").join([sql.SQL("r.dataset_id = %s"), *conditions]),
            limit,
        )
        table = _fetch_postgres(url, query, [name, *params])
        frame = from_arrow(table)
        if not needed:
            return [pl.DataFrame(height=frame.height)]
        return [frame.select([pl.col(c).cast(target[c]) for c in needed])]

    frame = io_source(read, target, explain=f"postgres:{name}")
    return _in_window(frame, spec, rows)


def _fetch_postgres(url: str, query: sql.Composed, params: list[Any]) -> pa.Table:
    """Render `query` with `params` (psycopg quotes them) and stream the result as Arrow (ADBC)."""
    import psycopg

    from pipeline_output.infra import pgsession

    with pgsession.connect(url) as conn:
        text = psycopg.ClientCursor(conn).mogrify(query, params)
    with pgsession.adbc_connect(url) as aconn, aconn.cursor() as cur:
        cur.execute(text)
        table: pa.Table = cur.fetch_arrow_table()
    fields = [f.remove_metadata() for f in table.schema]
    table = table.replace_schema_metadata(None)
    return table.cast(pa.schema(fields)) if fields else table


# -- shared ---------------------------------------------------------------------------------------


def within(frame: pl.LazyFrame, window: Window, watermark: str) -> pl.LazyFrame:
    """`frame` limited to `low < watermark <= high`, the bounds aligned to the column's type (a
    predicate the scans above push down)."""
    schema = frame.collect_schema()
    if watermark not in schema:
        raise InvalidArgument(
            f"reading window {window} needs the watermark column {watermark!r} "
            f"(columns: {list(schema)})"
        )
    dtype = schema[watermark]
    return frame.filter(window.aligned_to(dtype).contains(watermark, dtype))


def _in_window(frame: pl.LazyFrame, spec: DatasetSpec | str, rows: WindowRead) -> pl.LazyFrame:
    window = rows.get("window")
    if window is None:
        return frame
    return within(frame, window, window_column(spec, rows.get("watermark")))


def io_source(
    read: Callable[[list[str], list[str], pl.Expr | None, int | None], Iterable[pl.DataFrame]],
    schema: pl.Schema,
    *,
    explain: str,
    exact: bool = False,
) -> pl.LazyFrame:
    """A LazyFrame over `read(columns, needed, predicate, n_rows)`.

    `columns` are the projected columns (every column when polars projects none), `needed` those
    plus the predicate's; `read` pushes down what it can and yields frames of at least `needed`.
    Here the whole predicate is applied to them, the projection and the row limit too: polars
    trusts an IO source to have done all three. An `exact` read did all three itself (it yields
    `columns` only, filtered and limited): only the types are aligned to `schema`.
    """
    from polars.io.plugins import register_io_source

    def io_source(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        columns = list(schema) if with_columns is None else list(with_columns)
        needed = list(columns)
        if predicate is not None:
            needed += [c for c in predicate.meta.root_names() if c in schema and c not in needed]
        remaining = n_rows
        emitted = False
        for raw in read(columns, needed, predicate, n_rows):
            if remaining is not None and remaining <= 0:
                break
            part = raw
            casts = [
                pl.col(c).cast(schema[c])
                for c, dtype in part.schema.items()
                if c in schema and dtype != schema[c]
            ]
            if casts:
                part = part.with_columns(casts)
            if predicate is not None and not exact:
                part = part.filter(predicate)
            if not exact:
                part = part.select(columns) if columns else pl.DataFrame(height=part.height)
            if remaining is not None:
                part = part.head(remaining)
                remaining -= part.height
            emitted = True
            yield part
        if not emitted:
            yield pl.DataFrame(schema={c: schema[c] for c in columns})

    return register_io_source(io_source, schema=schema, explain_name=explain)


def projected_source(
    read: Callable[[list[str]], pl.DataFrame], *, schema: pl.Schema, name: str
) -> pl.LazyFrame:
    """A LazyFrame whose projection (plus the predicate's columns) is passed to `read(columns)`;
    the predicate and row limit are applied to the frame it returns (`io_source`)."""
    return io_source(
        lambda columns, needed, predicate, n_rows: [read(needed)], schema, explain=name
    )


__all__ = [
    "AnyOf",
    "Compare",
    "InList",
    "Nullness",
    "Term",
    "iceberg_filter",
    "io_source",
    "postgres_where",
    "projected_source",
    "pushable_terms",
    "scan_iceberg_dataset",
    "scan_postgres_dataset",
    "scan_table",
    "within",
]
