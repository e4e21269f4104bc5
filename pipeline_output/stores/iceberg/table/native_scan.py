"""A snapshot of a native table read by polars' own Iceberg scan: the reads' fast path.

Owns `snapshot_scan`: `pl.scan_iceberg` pinned to one snapshot, given the table's FileIO
properties (so an object-store warehouse is read with the catalog's endpoint and credentials)
and the table as `scan_planning.planned` makes it: polars plans the files with pyiceberg's
planner (manifest and column-statistics pruning, delete files) over manifests decoded by
fastavro — about half pyiceberg's own planning time, the same plan —, then reads them with its
native multithreaded Parquet reader: only the projected column chunks, the predicate
pushed into the row groups, positional delete files and deletion vectors applied, columns matched
by field id (renames, added columns read as null, widened types cast). polars itself falls back to
pyiceberg's reader for what its native reader cannot do (equality deletes, a positional delete
file shared by several data files, non-Parquet files); the results are the same either way
(`pipeline_output_tests/stores/test_engine_interop.py` compares it with the oracle and other
engines on every kind of table this project writes).

`typed` casts a frame read by it to the polars schema the table's Arrow schema reads back as
(`checked_input.polars_schema`), the types every other read of this project returns.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import polars as pl
from polars.exceptions import PerformanceWarning
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
)

from pipeline_output.contract.checked_input import polars_schema
from pipeline_output.stores.iceberg.table.scan_planning import planned

F = TypeVar("F", pl.DataFrame, pl.LazyFrame)


def snapshot_schema(table: Table, snapshot_id: int | None) -> Schema:
    """The schema of the table as of `snapshot_id` (its current one when None)."""
    schema = table.schema()
    if snapshot_id is None:
        return schema
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.schema_id is None:
        return schema
    return table.schemas().get(snapshot.schema_id, schema)


def snapshot_scan(
    table: Table, snapshot_id: int | None, *, dataset: str | None = None
) -> pl.LazyFrame:
    """The rows of `snapshot_id` (its own schema's columns) as a LazyFrame read by polars' native
    Iceberg scan, planned by `scan_planning`; None: the current snapshot of the loaded `table`
    under its current schema (the table's metadata file is fixed, so this too is pinned).
    Planned (collected) after expiry removed the snapshot: `SnapshotExpired` naming `dataset`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # polars' "unstable" notes: nothing for the user to do
        return pl.scan_iceberg(
            planned(table, dataset=dataset),
            snapshot_id=snapshot_id,
            storage_options=storage(table),
        )


def storage(table: Table) -> dict[str, str]:
    """The table FileIO's storage properties (`s3.endpoint`, ...) polars maps to its own object
    store's: only dotted keys, as the catalog's others (`uri`, `warehouse`) mean nothing there."""
    return {k: v for k, v in table.io.properties.items() if "." in k}


_PLANNER_NOTE = ".*polars_iceberg.*"


@contextmanager
def quiet() -> Iterator[None]:
    """Around a collect of `snapshot_scan`: without polars' note that its optional planning plugin
    (`polars_iceberg`) is not installed and that pyiceberg plans the files instead — here
    `scan_planning` does (the note is a `PerformanceWarning` raised from polars' resolver
    threads)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PLANNER_NOTE)
        yield


def silence_planner_note() -> None:
    """`quiet` for LazyFrames collected by their user (a downstream compute): the note filtered
    process-wide (polars shows it once per process; it is about pyiceberg's planning, which
    these scans do not use). Idempotent: `warnings` keeps one copy of the filter."""
    warnings.filterwarnings("ignore", message=_PLANNER_NOTE, category=PerformanceWarning)


def target_schema(schema: Schema) -> pl.Schema:
    """The polars schema the project's reads return for an Iceberg schema: the one its Arrow
    schema reads back as (`checked_input.polars_schema`). A schema of primitive columns only is
    mapped directly (`_POLARS_TYPES`, the same types), sparing the Arrow schema and its
    conversion (~1 ms, up to ~8 on a process's first); any other goes through Arrow."""
    direct = {}
    for f in schema.fields:
        dtype = _polars_type(f.field_type)
        if dtype is None:
            return polars_schema(schema.as_arrow())
        direct[f.name] = dtype
    return pl.Schema(direct)


_POLARS_TYPES: dict[type[IcebergType], pl.DataType] = {
    BooleanType: pl.Boolean(),
    IntegerType: pl.Int32(),
    LongType: pl.Int64(),
    FloatType: pl.Float32(),
    DoubleType: pl.Float64(),
    DateType: pl.Date(),
    TimeType: pl.Time(),
    TimestampType: pl.Datetime("us"),
    TimestamptzType: pl.Datetime("us", "UTC"),
    TimestampNanoType: pl.Datetime("ns"),
    TimestamptzNanoType: pl.Datetime("ns", "UTC"),
    StringType: pl.String(),
    BinaryType: pl.Binary(),
}


def _polars_type(field_type: IcebergType) -> pl.DataType | None:
    """The polars type of a primitive Iceberg type as `target_schema` reads it (None: another
    kind, left to the Arrow conversion)."""
    if isinstance(field_type, DecimalType):
        return pl.Decimal(field_type.precision, field_type.scale)
    return _POLARS_TYPES.get(type(field_type))


def typed(frame: F, target: pl.Schema, *, schema: pl.Schema | None = None) -> F:
    """`frame` (read or lazy) with every column of `target` it has cast to `target`'s type (when
    it differs). `schema`: `frame`'s, when the caller has it (a lazy scan resolves it again on
    each `collect_schema`, ~1 ms)."""
    if schema is None:
        schema = frame.collect_schema()
    casts = [pl.col(c).cast(t) for c, t in target.items() if c in schema and schema[c] != t]
    return frame.with_columns(casts) if casts else frame
