"""Frame and row helpers of a native write: reading one data file, aligning a frame to the
table schema, sorting, change detection, evolving the schema inside a transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Transaction

from pipeline_output.contract.checked_input import polars_schema
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.table.properties import NEW_PREFIX, POS_COLUMN
from pipeline_output.stores.schema import Evolution

# -- helpers ---------------------------------------------------------------------------------


def replace_rows(
    rows: pl.DataFrame, changed: pl.DataFrame, value_cols: list[str], pk: list[str]
) -> pl.DataFrame:
    """`rows` with the `changed` rows' new values put in place (rows keep their file order)."""
    if changed.height == 0 or not value_cols:
        return rows
    positions = changed.get_column(POS_COLUMN)
    try:
        return rows.with_columns(
            [
                rows.get_column(c).clone().scatter(positions, changed.get_column(NEW_PREFIX + c))
                for c in value_cols
            ]
        )
    except (pl.exceptions.PolarsError, TypeError):
        # Types scatter cannot take (nested): replace rows by position and restore the order.
        drop = pl.zeros(rows.height, dtype=pl.Boolean, eager=True).scatter(positions, True)
        updated = changed.select(
            [POS_COLUMN, *pk, *[pl.col(NEW_PREFIX + c).alias(c) for c in value_cols]]
        )
        return pl.concat([rows.filter(~drop), updated.select(rows.columns)]).sort(POS_COLUMN)


def read_local(task: FileScanTask, schema: Schema) -> pl.DataFrame | None:
    """Read a local data file straight with polars when that is provably the same as a scan.

    Only for files without delete files whose Parquet field ids name the same columns as the
    table schema (no renames); anything else goes through pyiceberg's `ArrowScan`.
    """
    path = task.file.file_path
    if task.delete_files or not (path.startswith("file://") or path.startswith("/")):
        return None
    local = path.removeprefix("file://")
    try:
        file_schema = pq.read_schema(local)
    except (OSError, pa.ArrowException):
        return None
    ids = {}
    for f in file_schema:
        raw = (f.metadata or {}).get(b"PARQUET:field_id")
        if raw is None:
            return None
        ids[f.name] = int(raw)
    wanted = []
    for f in schema.fields:
        if f.name in ids:
            if ids[f.name] != f.field_id:
                return None
            wanted.append(f.name)
        elif f.field_id in ids.values():
            return None
    return pl.read_parquet(local, columns=wanted)


def apply_evolution(tx: Transaction, evolution: Evolution) -> None:
    """Stage the schema changes in the write's own transaction (one commit with the data)."""
    if evolution.empty:
        return
    with tx.update_schema() as update:
        for name, new_type in evolution.add:
            update.add_column(name, new_type)
        for name, wider in evolution.widen:
            update.update_column(name, field_type=wider)


def schema_names(schema: Schema) -> list[str]:
    return [f.name for f in schema.fields]


def align_to_schema(
    frame: pl.DataFrame, schema: Schema, *, only: Sequence[str] | None = None
) -> pl.DataFrame:
    """`frame` with the schema's columns (missing ones null) cast to the schema's polars types."""
    target = polars_schema(schema.as_arrow())
    names = list(only) if only is not None else list(target)
    exprs = []
    for name in names:
        dtype = target[name]
        if name in frame.columns:
            col = pl.col(name)
            exprs.append(col if frame.schema[name] == dtype else col.cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return frame.select(exprs)


def sorted_for_write(frame: pl.DataFrame, spec: DatasetSpec) -> pl.DataFrame:
    cols = [c for c in spec.sort_columns if c in frame.columns]
    if not cols or frame.height < 2:
        return frame
    if len(cols) == 1 and frame.get_column(cols[0]).is_sorted():
        return frame
    return frame.sort(cols, nulls_last=False, maintain_order=True)


def differs(joined: pl.DataFrame, value_cols: list[str]) -> pl.Expr:
    """Rows whose values differ between the target (`c`) and the compute (`__po_new__c`).

    Nulls equal nulls and NaN equals NaN, so an unchanged row with NaN is never rewritten.
    """
    if not value_cols:
        return pl.lit(False)
    return pl.any_horizontal(
        [
            ~pl.col(c).eq_missing(pl.col(NEW_PREFIX + c))
            for c in value_cols
            if NEW_PREFIX + c in joined.columns
        ]
        or [pl.lit(False)]
    )


def absent_mask(
    rows: pl.DataFrame,
    batch: pl.DataFrame,
    pk: list[str],
    *,
    scope: str,
    inside: pl.Expr | None,
) -> pl.Series | None:
    """Target `rows` a sync deletes: key absent from the compute's keys `batch` (the ones the
    file's bounds admit: no other key can match its rows), and where `inside` (a window's or
    partition slice's predicate over `rows`) is true. None: the write deletes no absent key
    (`scope` none)."""
    if scope == "none":
        return None
    hit = "__po_hit__"
    absent = (
        rows.select(pk)
        .join(
            batch.select(pk).with_columns(pl.lit(True).alias(hit)),
            on=pk,
            how="left",
            nulls_equal=True,
        )[hit]
        .is_null()
    )
    if inside is not None:
        absent = absent & rows.select(inside).to_series()
    return absent
