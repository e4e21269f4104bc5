"""Sources: existing tables that datasets read — Postgres tables and Iceberg tables.

Owns `SourceSpec` and reading a source as a polars LazyFrame with projection pushed down to the
database (only the columns the compute uses are fetched) and the delta window pushed down as a SQL
`WHERE` / Iceberg row filter. Postgres is read with ADBC (`adbc-driver-postgresql`): it streams
`COPY ... BINARY` straight into Arrow buffers — no per-row Python objects — which is the fastest
Arrow-native reader with a plain pip install (connectorx needs its own URL dialect and has no
unix-socket support). Pure core: no Dagster.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl
import psycopg
from psycopg import sql

from pipeline_output.contract.spec import check_identifier
from pipeline_output.contract.windows import Window
from pipeline_output.errors import BadInput, InvalidSpec
from pipeline_output.infra import pgsession
from pipeline_output.services.reads import projected_source

SourceKind = Literal["postgres", "iceberg"]


@dataclass(frozen=True)
class SourceSpec:
    """A table a dataset reads: `postgres` (schema.table at `url`) or `iceberg` (identifier)."""

    name: str
    kind: SourceKind
    table: str | None = None
    schema: str = "public"
    url: str | None = None  # None: the control-plane Postgres from settings
    identifier: str | None = None
    watermark: str | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        check_identifier(self.name, what="source name")
        if self.kind == "postgres":
            check_identifier(self.table, what="source table", dataset=self.name)
            check_identifier(self.schema, what="source schema", dataset=self.name)
        elif self.kind == "iceberg":
            if not self.identifier or not all(
                part.replace("_", "a").isalnum() for part in self.identifier.split(".")
            ):
                raise InvalidSpec(
                    f"source {self.name!r}: identifier must be 'namespace.table', got "
                    f"{self.identifier!r}"
                )
        else:
            raise InvalidSpec(f"source {self.name!r}: unknown kind {self.kind!r}")
        if self.watermark is not None:
            check_identifier(self.watermark, what="watermark column", dataset=self.name)

    @property
    def display(self) -> str:
        """`schema.table` or the Iceberg identifier."""
        return f"{self.schema}.{self.table}" if self.kind == "postgres" else str(self.identifier)


# -- Postgres ------------------------------------------------------------------------------------


def _qualified(source: SourceSpec) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(source.schema), sql.Identifier(str(source.table)))


def _window_clause(column: str, window: Window | None) -> tuple[sql.Composable, list[Any]]:
    if window is None:
        return sql.SQL(""), []
    if window.low is None:
        return sql.SQL(" WHERE {} <= %s").format(sql.Identifier(column)), [window.high]
    return (
        sql.SQL(" WHERE {col} > %s AND {col} <= %s").format(col=sql.Identifier(column)),
        [window.low, window.high],
    )


def aligned_to_pg_type(window: Window, pg_type: str) -> Window:
    """The window with bounds zoned like a Postgres column (`timestamptz` aware, `timestamp`
    naive), so the comparison never depends on the session's TimeZone."""
    if pg_type.startswith("timestamp with time zone"):
        return window.aligned(aware=True)
    if pg_type.startswith("timestamp"):
        return window.aligned(aware=False)
    return window


def postgres_columns(source: SourceSpec, url: str) -> dict[str, str]:
    """Column name -> Postgres type of the source table; raises BadInput when it does not exist."""
    query = sql.SQL(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum"
    )
    regclass = psycopg.sql.Identifier(source.schema, str(source.table))
    with pgsession.connect(url) as conn:
        name = regclass.as_string(conn)
        rows = conn.execute(query, (name,)).fetchall()
    if not rows:
        raise BadInput(
            f"source {source.name!r}: table {source.display} does not exist in the source database"
        )
    return {str(r[0]): str(r[1]) for r in rows}


def read_postgres(
    source: SourceSpec,
    url: str,
    *,
    columns: Sequence[str] | None = None,
    window: Window | None = None,
    known: dict[str, str] | None = None,
) -> pl.DataFrame:
    """Read the source (only `columns`, only `window`) through ADBC into polars."""

    available = known if known is not None else postgres_columns(source, url)
    if columns is not None:
        unknown = [c for c in columns if c not in available]
        if unknown:
            raise BadInput(f"source {source.name!r}: no column(s) {unknown} in {source.display}")
    cols = list(columns) if columns is not None else list(available)
    if window is not None and source.watermark is None:
        raise BadInput(f"source {source.name!r}: a window read needs a watermark column")
    if window is not None:
        window = aligned_to_pg_type(window, available[str(source.watermark)])
    where, params = _window_clause(str(source.watermark), window)
    select = sql.SQL("SELECT {} FROM {}{} ORDER BY {}").format(
        sql.SQL(", ").join(_select_expr(c, available[c]) for c in cols)
        if cols
        else sql.SQL("1 AS _"),
        _qualified(source),
        where,
        sql.SQL(", ").join(sql.SQL(str(i + 1)) for i in range(max(len(cols), 1))),
    )
    with pgsession.connect(url) as conn:
        # Render composed SQL + parameters client-side (psycopg does the quoting), then hand the
        # final statement to ADBC, which streams the result as Arrow.
        text = psycopg.ClientCursor(conn).mogrify(select, params)
    with pgsession.adbc_connect(url) as aconn, aconn.cursor() as cur:
        cur.execute(text)
        table = cur.fetch_arrow_table()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    if not cols:
        return frame.select([])
    casts = [
        pl.col(c).cast(dtype) for c in cols if (dtype := _numeric_dtype(available[c])) is not None
    ]
    return frame.with_columns(casts) if casts else frame


_NUMERIC = re.compile(r"^numeric(?:\((\d+),(\d+)\))?$")


def _numeric_dtype(pg_type: str) -> pl.DataType | None:
    """Postgres `numeric(p,s)` -> polars Decimal(p, s); unconstrained `numeric` -> Float64."""
    match = _NUMERIC.match(pg_type.replace(" ", ""))
    if match is None:
        return None
    if match.group(1) is None:
        return pl.Float64()
    precision, scale = int(match.group(1)), int(match.group(2))
    return pl.Decimal(precision, scale) if precision <= 38 else pl.Float64()


def _select_expr(column: str, pg_type: str) -> sql.Composable:
    """How a column is selected: `numeric` travels as text (ADBC hands it over as an opaque
    extension type polars cannot compute with) and is cast back to a decimal in polars."""
    if _numeric_dtype(pg_type) is not None:
        return sql.SQL("{col}::text AS {col}").format(col=sql.Identifier(column))
    return sql.Identifier(column)


@dataclass(frozen=True)
class PostgresShape:
    """A source table's columns (Postgres types) and polars schema, looked up once per reader."""

    columns: dict[str, str]
    schema: pl.Schema


def postgres_shape(source: SourceSpec, url: str) -> PostgresShape:
    """Look up the source table's columns and polars schema (two catalog queries)."""
    available = postgres_columns(source, url)
    return PostgresShape(columns=available, schema=_polars_schema(source, url, available))


def scan_postgres(
    source: SourceSpec,
    url: str,
    *,
    window: Window | None = None,
    shape: PostgresShape | None = None,
) -> pl.LazyFrame:
    """A LazyFrame over the source whose column projection is pushed down to Postgres.

    Pass `shape` (from `postgres_shape`) when scanning many windows of one table in one run.
    """
    shape = shape or postgres_shape(source, url)
    available = shape.columns
    return projected_source(
        lambda columns: read_postgres(source, url, columns=columns, window=window, known=available),
        schema=shape.schema,
        name=f"postgres:{source.display}",
    )


def _polars_schema(source: SourceSpec, url: str, available: dict[str, str]) -> pl.Schema:
    """The polars schema of the source, from a zero-row ADBC read (exact Arrow types)."""

    query = sql.SQL("SELECT {} FROM {} LIMIT 0").format(
        sql.SQL(", ").join(_select_expr(c, t) for c, t in available.items()), _qualified(source)
    )
    with pgsession.connect(url) as conn:
        text = query.as_string(conn)
    with pgsession.adbc_connect(url) as aconn, aconn.cursor() as cur:
        cur.execute(text)
        table = cur.fetch_arrow_table()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    casts = [
        pl.col(c).cast(dtype)
        for c, t in available.items()
        if (dtype := _numeric_dtype(t)) is not None
    ]
    return frame.with_columns(casts).schema if casts else frame.schema


def postgres_window_count(
    source: SourceSpec, url: str, window: Window, *, known: dict[str, str] | None = None
) -> int:
    """How many source rows lie in `window` (a plain `count(*)` on a UTC session)."""
    if source.watermark is None:
        raise BadInput(f"source {source.name!r}: a window count needs a watermark column")
    available = known if known is not None else postgres_columns(source, url)
    aligned = aligned_to_pg_type(window, available[source.watermark])
    where, params = _window_clause(source.watermark, aligned)
    query = sql.SQL("SELECT count(*) FROM {}{}").format(_qualified(source), where)
    with pgsession.connect(url) as conn:
        row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def postgres_stats(source: SourceSpec, url: str) -> tuple[int, Any]:
    """(row count, high-water mark of the watermark column or None); a watermark column the
    table lacks is an `InvalidSpec` naming it and the columns the table has."""
    available = postgres_columns(source, url)
    if source.watermark and source.watermark not in available:
        raise InvalidSpec(
            f"{source.display} has no watermark column {source.watermark!r}; its columns: "
            f"{', '.join(available)}"
        )
    if source.watermark:
        query = sql.SQL("SELECT count(*), max({}) FROM {}").format(
            sql.Identifier(source.watermark), _qualified(source)
        )
    else:
        query = sql.SQL("SELECT count(*), NULL FROM {}").format(_qualified(source))
    with pgsession.connect(url) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def postgres_high_water_mark(source: SourceSpec, url: str) -> Any:
    """The source's high-water mark: `max(watermark)` alone — no row count, so with an index on the
    watermark column it reads one index entry (a window sensor's idle tick reads only this).
    None for an empty table, and for a table or column that does not exist (`postgres_stats`
    says which)."""
    if source.watermark is None:
        raise BadInput(f"source {source.name!r}: a high-water mark needs a watermark column")
    query = sql.SQL("SELECT max({}) FROM {}").format(
        sql.Identifier(source.watermark), _qualified(source)
    )
    try:
        with pgsession.connect(url) as conn:
            row = conn.execute(query).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
        return None
    return row[0] if row else None


def postgres_watermark_values(
    source: SourceSpec, url: str, window: Window, *, limit: int, pg_type: str | None = None
) -> pl.Series:
    """The first `limit` watermark values of `window`, ascending (where a plan cuts windows:
    the sort and the limit run in Postgres, so a long backlog is never read whole)."""
    if source.watermark is None:
        raise BadInput(f"source {source.name!r}: window cuts need a watermark column")
    if pg_type is not None:
        window = aligned_to_pg_type(window, pg_type)
    where, params = _window_clause(source.watermark, window)
    query = sql.SQL("SELECT {col} FROM {t}{where} ORDER BY {col} LIMIT %s").format(
        col=sql.Identifier(source.watermark), t=_qualified(source), where=where
    )
    with pgsession.connect(url) as conn:
        rows = conn.execute(query, [*params, limit]).fetchall()
    return pl.Series(source.watermark, [r[0] for r in rows])
