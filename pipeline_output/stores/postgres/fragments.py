"""SQL fragments of the legacy arm: the canonical key, typed values of a document, a window, a
Dagster partition's slice.

A condition on values (a window's bounds, a partition's key) is a `Bound`: SQL with `%s`
placeholders and the values they stand for, in order. Values never become SQL text: a partition
key such as `100%_` or `%s` stays a value whatever else the statement binds."""

from __future__ import annotations

from typing import Any, NamedTuple

import polars as pl
from psycopg import sql

from pipeline_output.contract.slices import OneOf, PartitionSlice, TimeRange
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.ledger.migrations import SCHEMA

ROWS_TABLE = "dataset_rows"
ROWS = sql.Identifier(SCHEMA, ROWS_TABLE)
IN_TABLE = sql.Identifier("_po_in")
BATCH_TABLE = sql.Identifier("_po_batch")
ORD_COLUMN = "__po_ord__"
CSV_SLICE = 200_000
BTREE_MAX_BYTES = 2704  # Postgres' btree limit on one index entry (8 kB pages, btree version 4)


# -- SQL fragments ----------------------------------------------------------------------------


class Bound(NamedTuple):
    """SQL with `%s` placeholders, and the values they stand for in the order they appear."""

    sql: sql.Composable
    params: tuple[Any, ...]


VALUE = sql.Placeholder()  # `%s`


def pk_expr(spec: DatasetSpec, doc: sql.Composable) -> sql.Composable:
    """The canonical key text of a document: `doc->>'k'`, or a JSON array for composite keys."""
    pk = spec.primary_key
    if not pk:
        return sql.SQL("NULL::text")
    if len(pk) == 1:
        return sql.SQL("({} ->> {})").format(doc, sql.Literal(pk[0]))
    return sql.SQL("jsonb_build_array({})::text").format(
        sql.SQL(", ").join(sql.SQL("{} -> {}").format(doc, sql.Literal(k)) for k in pk)
    )


def typed_value(doc: sql.Composable, column: str, pg_type: sql.Composable) -> sql.Composable:
    return sql.SQL("(({} ->> {})::{})").format(doc, sql.Literal(column), pg_type)


def window_condition(
    doc: sql.Composable, column: str, pg_type: sql.Composable, window: Window
) -> Bound:
    """`low < watermark <= high` on a document's typed watermark (nulls are never inside)."""
    value = typed_value(doc, column, pg_type)
    if pg_type in (sql.SQL("timestamptz"), sql.SQL("timestamp")):
        # the bound's zone follows the column's, never the session's TimeZone
        window = window.aligned(aware=pg_type == sql.SQL("timestamptz"))
    high = sql.SQL("{} <= {}").format(value, VALUE)
    if window.low is None:
        return Bound(high, (window.high,))
    return Bound(sql.SQL("({} > {} AND {})").format(value, VALUE, high), (window.low, window.high))


# the polars type whose values a staged Postgres type compares with (a slice's bounds)
_BOUND_TYPES: dict[str, Any] = {
    "date": pl.Date(),
    "timestamptz": pl.Datetime("us", "UTC"),
    "timestamp": pl.Datetime("us"),
    "text": pl.String(),
    "integer": pl.Int32(),
    "bigint": pl.Int64(),
}


def slice_condition(
    doc: sql.Composable, partition: PartitionSlice, types: dict[str, sql.Composable]
) -> Bound:
    """The rows of a Dagster partition: every term on a document's typed value (nulls, and
    documents without the column, are never inside)."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    for term in partition.terms:
        pg_type = types.get(term.column)
        if pg_type is None:
            return Bound(sql.SQL("FALSE"), ())  # the dataset never had the column: none inside
        dtype = next((t for n, t in _BOUND_TYPES.items() if pg_type == sql.SQL(n)), None)
        value = typed_value(doc, term.column, pg_type)
        if isinstance(term, TimeRange):
            parts.append(sql.SQL("({} >= {} AND {} < {})").format(value, VALUE, value, VALUE))
            params.extend(term.bounds(dtype))
        elif isinstance(term, OneOf):
            parts.append(sql.SQL("{} = ANY({})").format(value, VALUE))
            params.append(list(term.values))
        else:
            parts.append(sql.SQL("{} = {}").format(value, VALUE))
            params.append(term.typed(dtype))
    return Bound(sql.SQL("({})").format(sql.SQL(" AND ").join(parts)), tuple(params))
