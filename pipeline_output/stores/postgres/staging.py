"""Staging and applying a batch on the legacy arm, inside the write's transaction: COPY into a
typed temp table, documents with `to_jsonb`, then each write mode as set-based SQL — its handler
in `WRITE_HANDLERS`, declared in the arm's capabilities (`LEGACY_CAPABILITIES`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

import polars as pl
import psycopg
from psycopg import sql

from pipeline_output.contract.checked_input import MAX_EXAMPLES, duplicate_target_keys
from pipeline_output.contract.plan import WritePlan
from pipeline_output.contract.spec import DatasetSpec, WriteMode
from pipeline_output.contract.store_protocol import KEY_TYPES, Capabilities
from pipeline_output.errors import (
    BadInput,
)
from pipeline_output.stores.postgres.fragments import (
    BATCH_TABLE,
    CSV_SLICE,
    IN_TABLE,
    ORD_COLUMN,
    ROWS,
    Bound,
    pk_expr,
    slice_condition,
    window_condition,
)
from pipeline_output.stores.postgres.pending import LegacyCounts
from pipeline_output.stores.postgres.types import (
    MAX_COLUMNS,
    MAX_IDENTIFIER_BYTES,
    SCALAR_TYPES,
    csv_ready,
)


def rekey(conn: psycopg.Connection[Any], spec: DatasetSpec) -> None:
    """The spec's primary key changed: recompute every stored row's canonical key text."""
    conn.execute(
        sql.SQL("UPDATE {} AS r SET pk = {} WHERE r.dataset_id = %s").format(
            ROWS, pk_expr(spec, sql.SQL("r.data"))
        ),
        (spec.name,),
    )


def stage(
    conn: psycopg.Connection[Any],
    spec: DatasetSpec,
    frame: pl.DataFrame,
    types: dict[str, sql.Composable],
) -> None:
    """COPY the batch into `_po_in` (typed), then build `_po_batch (ord, pk, data jsonb)`."""
    columns = [*types, ORD_COLUMN]
    column_defs = sql.SQL(", ").join(
        [sql.SQL("{} {}").format(sql.Identifier(n), t) for n, t in types.items()]
        + [sql.SQL("{} bigint").format(sql.Identifier(ORD_COLUMN))]
    )
    conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(IN_TABLE, column_defs))
    staged = csv_ready(frame).with_row_index(ORD_COLUMN).select(columns)
    copy = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        IN_TABLE, sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    with conn.cursor().copy(copy) as cp:
        for offset in range(0, staged.height, CSV_SLICE):
            chunk = staged.slice(offset, CSV_SLICE)
            cp.write(chunk.write_csv(include_header=False, quote_style="non_numeric"))
    doc = sql.SQL("(to_jsonb(src.*) - {})").format(sql.Literal(ORD_COLUMN))
    conn.execute(
        sql.SQL(
            "CREATE TEMP TABLE {batch} ON COMMIT DROP AS"
            " SELECT s.ord, {pk} AS pk, s.data FROM"
            " (SELECT src.{ord} AS ord, {doc} AS data FROM {src} AS src) AS s"
        ).format(
            batch=BATCH_TABLE,
            pk=pk_expr(spec, sql.SQL("s.data")),
            ord=sql.Identifier(ORD_COLUMN),
            doc=doc,
            src=IN_TABLE,
        )
    )
    if spec.primary_key:
        conn.execute(sql.SQL("CREATE INDEX ON {} (pk)").format(BATCH_TABLE))
    conn.execute(sql.SQL("ANALYZE {}").format(BATCH_TABLE))


def apply_plan(
    conn: psycopg.Connection[Any],
    spec: DatasetSpec,
    plan: WritePlan,
    n_in: int,
    total_before: int,
    types: dict[str, sql.Composable],
) -> LegacyCounts:
    """Execute the plan's write mode with set-based SQL over `_po_batch`: its handler in
    `WRITE_HANDLERS` (a mode without one: `UnsupportedWrite`, nothing written)."""
    LEGACY_CAPABILITIES.check_plan(spec, plan)
    name = spec.name
    window_cond: Bound | None = None  # its values are placeholders: `name` is bound first
    if plan.window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
        wm = spec.watermark
        if wm is None or wm not in types:
            raise BadInput(
                f"dataset {name!r}: a windowed write needs the watermark column {wm!r} in "
                "the dataset"
            )
        window_cond = window_condition(sql.SQL("r.data"), wm, types[wm], plan.window)
    elif plan.partition is not None and plan.delete_scope in ("slice", "absent_keys_in_slice"):
        window_cond = slice_condition(sql.SQL("r.data"), plan.partition, types)
    batch = Batch(conn, spec, plan, window_cond, n_in, total_before)
    return WRITE_HANDLERS[plan.write_mode](batch)


class Batch(NamedTuple):
    """What a write mode's handler applies: the staged batch (`_po_batch`) of `spec`."""

    conn: psycopg.Connection[Any]
    spec: DatasetSpec
    plan: WritePlan
    window_cond: Bound | None  # the window's or slice's condition when the deletes are scoped
    n_in: int  # the batch's rows
    total_before: int  # the dataset's rows before the write


def _replace(batch: Batch) -> LegacyCounts:
    conn, spec, plan, window_cond, _, total_before = batch
    name, counts = spec.name, LegacyCounts()
    if plan.delete_scope in ("window", "slice") and window_cond is not None:
        # Rows inside the window (or the partition's slice) are replaced. For a keyed dataset a
        # computed key whose stored row lies outside the window (its watermark moved) is
        # replaced too: keys stay unique, as on the native arm.
        moved = (
            sql.SQL(" OR EXISTS (SELECT 1 FROM {} AS b WHERE b.pk = r.pk)").format(BATCH_TABLE)
            if spec.primary_key
            else sql.SQL("")
        )
        counts.deleted = conn.execute(
            sql.SQL("DELETE FROM {} AS r WHERE r.dataset_id = %s AND ({}{})").format(
                ROWS, window_cond.sql, moved
            ),
            (name, *window_cond.params),
        ).rowcount
        counts.preserved = total_before - counts.deleted
        counts.inserted = _insert(conn, name, base=_next_index(conn, name))
    else:
        counts.deleted = conn.execute(
            sql.SQL("DELETE FROM {} WHERE dataset_id = %s").format(ROWS), (name,)
        ).rowcount
        counts.inserted = _insert(conn, name, base=0)
    return counts


def _append(batch: Batch) -> LegacyCounts:
    conn, name, counts = batch.conn, batch.spec.name, LegacyCounts()
    counts.inserted = _insert(conn, name, base=_next_index(conn, name))
    counts.preserved = batch.total_before
    return counts


def _append_new(batch: Batch) -> LegacyCounts:
    conn, name, counts = batch.conn, batch.spec.name, LegacyCounts()
    counts.inserted = _insert(conn, name, base=_next_index(conn, name), only_new=True)
    counts.skipped = batch.n_in - counts.inserted
    counts.preserved = batch.total_before - counts.skipped
    return counts


def _upsert_or_sync(batch: Batch) -> LegacyCounts:
    conn, spec, plan, window_cond, _, total_before = batch
    name, mode, counts = spec.name, plan.write_mode, LegacyCounts()
    base = _next_index(conn, name)
    row = conn.execute(
        sql.SQL(
            "SELECT count(*), count(DISTINCT r.pk) FROM {} AS r JOIN {} AS b ON r.pk = b.pk"
            " WHERE r.dataset_id = %s"
        ).format(ROWS, BATCH_TABLE),
        (name,),
    ).fetchone()
    matched = int(row[0]) if row else 0
    if row and matched != int(row[1]):
        _refuse_duplicate_matches(conn, spec)
    # a matched row changed: the Iceberg arm's `frame_rows.values_differ` over documents (null
    # or an absent key == null, "NaN" == "NaN", -0.0 stored as 0, exact strings and numerics),
    # pinned to it by pipeline_output_tests/stores/both_arms/test_changed_rows.py
    counts.updated = conn.execute(
        sql.SQL(
            "UPDATE {} AS r SET data = b.data FROM {} AS b"
            " WHERE r.dataset_id = %s AND r.pk = b.pk"
            " AND jsonb_strip_nulls(r.data) IS DISTINCT FROM jsonb_strip_nulls(b.data)"
        ).format(ROWS, BATCH_TABLE),
        (name,),
    ).rowcount
    counts.unchanged = matched - counts.updated
    if mode == "sync":
        scope = window_cond or Bound(sql.SQL("TRUE"), ())
        counts.deleted = conn.execute(
            sql.SQL(
                "DELETE FROM {} AS r WHERE r.dataset_id = %s"
                " AND NOT EXISTS (SELECT 1 FROM {} AS b WHERE b.pk = r.pk) AND {}"
            ).format(ROWS, BATCH_TABLE, scope.sql),
            (name, *scope.params),
        ).rowcount
    counts.inserted = _insert(conn, name, base=base, only_new=True)
    counts.preserved = total_before - matched - counts.deleted
    return counts


# The legacy arm's handler of each write mode (`spec.WRITE_MODES`): its SQL over the batch.
WRITE_HANDLERS: dict[WriteMode, Callable[[Batch], LegacyCounts]] = {
    "replace": _replace,
    "append": _append,
    "append_new": _append_new,
    "upsert": _upsert_or_sync,
    "sync": _upsert_or_sync,
}

LEGACY_CAPABILITIES = Capabilities(
    arm="pg",
    label="legacy Postgres arm",
    nested_types=False,
    max_identifier_length=MAX_IDENTIFIER_BYTES,
    max_columns=MAX_COLUMNS,
    scalar_types=SCALAR_TYPES,
    key_types=KEY_TYPES,  # the same rule on both arms (contract/store_protocol.py)
    advice="keep this dataset on the iceberg arm (mode='iceberg')",
    write_modes=frozenset(WRITE_HANDLERS),
)


def _refuse_duplicate_matches(conn: psycopg.Connection[Any], spec: DatasetSpec) -> None:
    """Refuse an upsert/sync whose target holds a matched key more than once (nothing written:
    the caller's transaction rolls back)."""
    joined = sql.SQL(
        "FROM {} AS r JOIN {} AS b ON r.pk = b.pk WHERE r.dataset_id = %s GROUP BY r.pk "
        "HAVING count(*) > 1"
    ).format(ROWS, BATCH_TABLE)
    dupes = conn.execute(
        sql.SQL("SELECT r.pk, count(*) OVER () {} ORDER BY r.pk LIMIT %s").format(joined),
        (spec.name, MAX_EXAMPLES),
    ).fetchall()
    if dupes:
        raise duplicate_target_keys(spec, int(dupes[0][1]), [_key_of(spec, pk) for pk, _ in dupes])


def _key_of(spec: DatasetSpec, pk: str) -> Any:
    """A stored `pk` as the user wrote the key: its text (one column) or the JSON array's values."""
    return tuple(json.loads(pk)) if len(spec.primary_key) > 1 else pk


def _next_index(conn: psycopg.Connection[Any], dataset: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT coalesce(max(row_index), -1) + 1 FROM {} WHERE dataset_id = %s").format(
            ROWS
        ),
        (dataset,),
    ).fetchone()
    return int(row[0]) if row else 0


def _insert(
    conn: psycopg.Connection[Any], dataset: str, *, base: int, only_new: bool = False
) -> int:
    """Insert the batch at `base + ord` (only keys absent from the dataset when `only_new`)."""
    where = (
        sql.SQL(
            " WHERE NOT EXISTS (SELECT 1 FROM {} AS r WHERE r.dataset_id = %s AND r.pk = b.pk)"
        ).format(ROWS)
        if only_new
        else sql.SQL("")
    )
    params: tuple[Any, ...] = (dataset, base, dataset) if only_new else (dataset, base)
    return conn.execute(
        sql.SQL(
            "INSERT INTO {} (dataset_id, row_index, pk, data)"
            " SELECT %s, %s + b.ord, b.pk, b.data FROM {} AS b{} ORDER BY b.ord"
        ).format(ROWS, BATCH_TABLE, where),
        params,
    ).rowcount


# -- reading -------------------------------------------------------------------------------
