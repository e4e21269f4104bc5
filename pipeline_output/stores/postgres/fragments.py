"""SQL fragments of the legacy arm: the canonical key, typed values of a document, a window."""

from __future__ import annotations

from psycopg import sql

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
) -> sql.Composable:
    """`low < watermark <= high` on a document's typed watermark (nulls are never inside)."""
    value = typed_value(doc, column, pg_type)
    if pg_type in (sql.SQL("timestamptz"), sql.SQL("timestamp")):
        # the bound's zone follows the column's, never the session's TimeZone
        window = window.aligned(aware=pg_type == sql.SQL("timestamptz"))
    high = sql.SQL("{} <= {}").format(value, sql.Literal(window.high))
    if window.low is None:
        return high
    return sql.SQL("({} > {} AND {})").format(value, sql.Literal(window.low), high)
