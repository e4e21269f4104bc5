"""pyiceberg expressions of the native arm: a window as a row filter, aligned to the
watermark field's type, and file-level relations from column bounds — of a delta window
(`window_relation`) and of a Dagster partition's slice (`slice_relation`).
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import polars as pl
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    GreaterThan,
    LessThanOrEqual,
)
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from pipeline_output.contract.slices import Equals, PartitionSlice, Term
from pipeline_output.contract.windows import Window


def physical(series: pl.Series, iceberg_type: PrimitiveType) -> pl.Series:
    """Key values in the representation Iceberg bounds decode to (micros, days, ...)."""
    if isinstance(iceberg_type, (TimestampType, TimestamptzType)):
        return series.dt.epoch("us")
    if isinstance(iceberg_type, DateType):
        return series.cast(pl.Int32)
    return series


def _bound_value(value: Any, iceberg_type: PrimitiveType) -> Any:
    if isinstance(iceberg_type, (TimestampType, TimestamptzType)) and isinstance(value, datetime):
        return pl.Series([value]).dt.epoch("us")[0]
    if isinstance(iceberg_type, DateType) and isinstance(value, date):
        return pl.Series([value]).cast(pl.Int32)[0]
    return value


def window_relation(task: FileScanTask, schema: Schema, wm: str, window: Window) -> str:
    """`inside`, `outside` or `straddles`: where a file's watermark range lies against a window."""
    field = schema.find_field(wm)
    ftype = field.field_type
    lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
    hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
    nulls = (task.file.null_value_counts or {}).get(field.field_id, 0)
    if lo_b is None or hi_b is None or not isinstance(ftype, PrimitiveType):
        return "straddles"
    lo, hi = from_bytes(ftype, lo_b), from_bytes(ftype, hi_b)
    w_high = _bound_value(window.high, ftype)
    w_low = _bound_value(window.low, ftype) if window.low is not None else None
    if lo > w_high or (w_low is not None and hi <= w_low):
        return "outside"
    if hi <= w_high and (w_low is None or lo > w_low) and not nulls:
        return "inside"
    return "straddles"


# the polars type whose values a slice term compares with, per Iceberg field type
_SLICE_TYPES: dict[type[PrimitiveType], Any] = {
    DateType: pl.Date(),
    TimestampType: pl.Datetime("us"),
    TimestamptzType: pl.Datetime("us", "UTC"),
    StringType: pl.String(),
    IntegerType: pl.Int32(),
    LongType: pl.Int64(),
}


def slice_relation(task: FileScanTask, schema: Schema, partition: PartitionSlice) -> str:
    """`inside`, `outside` or `straddles`: where a file's rows lie against a partition's slice,
    from its column bounds (a file of a table partitioned like the Dagster partitions lies
    wholly inside or outside). A column the schema lacks holds no row of the slice."""
    relations = [_term_relation(task, schema, term) for term in partition.terms]
    if "outside" in relations:
        return "outside"
    return "inside" if all(r == "inside" for r in relations) else "straddles"


def _term_relation(task: FileScanTask, schema: Schema, term: Term) -> str:
    try:
        field = schema.find_field(term.column)
    except ValueError:
        return "outside"
    ftype = field.field_type
    dtype = _SLICE_TYPES.get(type(ftype)) if isinstance(ftype, PrimitiveType) else None
    lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
    hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
    if dtype is None or lo_b is None or hi_b is None:
        return "straddles"
    assert isinstance(ftype, PrimitiveType)
    nulls = (task.file.null_value_counts or {}).get(field.field_id, 0)
    lo, hi = from_bytes(ftype, lo_b), from_bytes(ftype, hi_b)
    if isinstance(term, Equals):
        value = _bound_value(term.typed(dtype), ftype)
        if value < lo or value > hi:
            return "outside"
        return "inside" if lo == hi == value and not nulls else "straddles"
    low, high = (_bound_value(b, ftype) for b in term.bounds(dtype))
    if hi < low or lo >= high:
        return "outside"
    return "inside" if lo >= low and hi < high and not nulls else "straddles"


def window_filter(
    watermark: str, window: Window, *, schema: Schema | None = None
) -> BooleanExpression:
    """An Iceberg row filter for `low < watermark <= high`.

    With the table's `schema`, datetime bounds are zoned like the watermark field (`timestamptz`
    literals carry `+00:00`, `timestamp` literals none): pyiceberg refuses the other way round.
    """
    if schema is not None:
        window = aligned_to_field(window, schema, watermark)
    high: BooleanExpression = LessThanOrEqual(watermark, _literal(window.high))  # type: ignore[call-arg,arg-type]
    if window.low is None:
        return high
    low: BooleanExpression = GreaterThan(watermark, _literal(window.low))  # type: ignore[call-arg,arg-type]
    return And(low, high)


def aligned_to_field(window: Window, schema: Schema, watermark: str) -> Window:
    """The window with bounds zoned like the table's watermark field (unchanged otherwise)."""
    try:
        field = schema.find_field(watermark)
    except ValueError:
        return window
    if isinstance(field.field_type, TimestamptzType):
        return window.aligned(aware=True)
    if isinstance(field.field_type, TimestampType):
        return window.aligned(aware=False)
    return window


def _literal(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value
