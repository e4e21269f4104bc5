"""Which data files a merge must look at: partition values and column statistics decide, before
any file is opened, which files can hold a row the compute's keys match, and which of the
compute's rows each file can match.

Owns `manifest_admission` (manifests whose partition summaries admit a key of the compute: the
others are never read), `prune_by_keys` (files whose partition and every key column's bounds
admit a key of the compute) and `KeySlices` (the compute's rows a file's bounds of the first key column admit: each
file is joined with its slice, not the whole batch).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

import polars as pl
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import ManifestFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import (
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.table.expressions import physical
from pipeline_output.stores.iceberg.table.partitions import key_partition_values


def prune_by_keys(
    table: Table, spec: DatasetSpec, frame: pl.DataFrame, tasks: list[FileScanTask]
) -> list[FileScanTask]:
    """Files whose partition (when the table is partitioned by a key column) and key
    statistics admit at least one of the compute's keys: a matching row has every key
    column inside the file's bounds, so each key column prunes (composite keys too)."""
    if not tasks or frame.height == 0:
        return []
    tasks = _prune_by_partition(table, spec, frame, tasks)
    schema = table.schema()
    columns = []
    for name in spec.primary_key:
        field = schema.find_field(name)
        if isinstance(field.field_type, PrimitiveType):
            values = physical(frame.get_column(name), field.field_type)
            columns.append((field, values.unique().sort()))
    admitted = [True] * len(tasks)
    for field, keys in columns:
        admitted = [a and b for a, b in zip(admitted, _admits_all(tasks, field, keys), strict=True)]
    return [t for t, ok in zip(tasks, admitted, strict=True) if ok]


def manifest_admission(
    metadata: TableMetadata, spec: DatasetSpec, frame: pl.DataFrame
) -> Callable[[ManifestFile], bool] | None:
    """Which data manifests can hold a row with one of the compute's keys, from the manifest
    list's partition summaries alone (no manifest is opened): a manifest of the current spec
    whose range of a key-sourced partition field holds none of the batch's partition values of
    that field holds no candidate. None: nothing to prune by (an unpartitioned table, or no
    partition field sourced from a key column)."""
    wanted = key_partition_values(spec, metadata, frame)
    if wanted is None:
        return None
    current = metadata.spec()
    schema = metadata.schema()
    fields = []
    for i, values in wanted.items():
        pfield = current.fields[i]
        result_type = pfield.transform.result_type(schema.find_field(pfield.source_id).field_type)
        if not isinstance(result_type, PrimitiveType):
            continue
        present: list[Any] = sorted(v for v in values if v is not None)
        fields.append((i, result_type, present, None in values))

    def admits(manifest: ManifestFile) -> bool:
        summaries = manifest.partitions
        if manifest.partition_spec_id != current.spec_id or not summaries:
            return True
        for i, result_type, present, null_wanted in fields:
            if i >= len(summaries):
                return True
            summary = summaries[i]
            if null_wanted and summary.contains_null:
                continue
            if summary.lower_bound is None or summary.upper_bound is None:
                # only nulls in this field and no null wanted: no candidate; no bounds: read it
                return not (summary.contains_null and summary.lower_bound is None)
            try:
                lo = from_bytes(result_type, summary.lower_bound)
                hi = from_bytes(result_type, summary.upper_bound)
                at = bisect_left(present, lo)
                if at == len(present) or present[at] > hi:
                    return False
            except (TypeError, ValueError):
                return True  # bounds not comparable with the values: read it
        return True

    return admits


def _prune_by_partition(
    table: Table, spec: DatasetSpec, frame: pl.DataFrame, tasks: list[FileScanTask]
) -> list[FileScanTask]:
    """Drop files of the current spec whose partition no key of the compute falls in."""
    metadata = table.metadata
    wanted = key_partition_values(spec, metadata, frame)
    if wanted is None:
        return tasks
    current = metadata.default_spec_id
    return [
        t
        for t in tasks
        if t.file.spec_id != current
        or all(t.file.partition[i] in values for i, values in wanted.items())
    ]


def _decoded_bounds(task: FileScanTask, field: NestedField) -> tuple[Any, Any] | None:
    """The file's (lower, upper) bounds of `field`, decoded; None when it has none."""
    lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
    hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
    if lo_b is None or hi_b is None:
        return None
    return (
        from_bytes(field.field_type, lo_b),  # type: ignore[arg-type]
        from_bytes(field.field_type, hi_b),  # type: ignore[arg-type]
    )


# Iceberg's single-value serialisation of these types, as polars reads the bytes back
_LITTLE_ENDIAN: dict[type, type[pl.DataType]] = {
    IntegerType: pl.Int32,
    DateType: pl.Int32,
    LongType: pl.Int64,
    TimestampType: pl.Int64,
    TimestamptzType: pl.Int64,
    FloatType: pl.Float32,
    DoubleType: pl.Float64,
}


def _bound_series(
    tasks: list[FileScanTask], field: NestedField, dtype: pl.DataType
) -> tuple[pl.Series, pl.Series] | None:
    """Every file's (lower, upper) bounds of `field` decoded in one vectorised pass (null where
    a file has none), as `dtype`; None for a type decoded value by value (`_decoded_bounds`)."""
    kind = type(field.field_type)
    if kind not in _LITTLE_ENDIAN and kind is not StringType:
        return None
    fid = field.field_id
    lows: list[bytes | None] = []
    highs: list[bytes | None] = []
    for task in tasks:
        lower, upper = task.file.lower_bounds, task.file.upper_bounds
        lo, hi = (lower.get(fid) if lower else None), (upper.get(fid) if upper else None)
        present = lo is not None and hi is not None
        lows.append(lo if present else None)
        highs.append(hi if present else None)
    out = []
    for raw in (lows, highs):
        series = pl.Series(raw, dtype=pl.Binary)
        if kind is StringType:
            decoded = series.cast(pl.String)
        else:
            decoded = series.bin.reinterpret(dtype=_LITTLE_ENDIAN[kind], endianness="little")
        out.append(decoded.cast(dtype, strict=True))
    return out[0], out[1]


def _admits_all(tasks: list[FileScanTask], field: NestedField, keys: pl.Series) -> list[bool]:
    """For each file: whether one of the sorted `keys` lies within its bounds of `field` (True when
    the file has no bounds for it, or they cannot be compared). One vectorised search over every
    file's bounds: the cost stays small when the table has thousands of files."""
    try:
        both = _bound_series(tasks, field, keys.dtype)
        if both is None:
            bounds = [_decoded_bounds(task, field) for task in tasks]
            lo = pl.Series([b[0] if b else None for b in bounds], dtype=keys.dtype, strict=True)
            hi = pl.Series([b[1] if b else None for b in bounds], dtype=keys.dtype, strict=True)
        else:
            lo, hi = both
        i = keys.search_sorted(lo, side="left")
        j = keys.search_sorted(hi, side="right")
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return [True] * len(tasks)
    missing = lo.is_null() | hi.is_null()
    return (missing | (j > i)).to_list()


class KeySlices:
    """The compute's rows a file's bounds of the first key column admit (a row of the file can
    only match those): each file is joined with its slice instead of the whole batch, so a merge
    over many files costs about files + batch rows, not files x batch rows. The batch is sorted
    by that column once; a slice is a zero-copy window of it, found by binary search (for many
    files at once with `prepare`)."""

    def __init__(self, frame: pl.DataFrame, column: str, schema: Schema) -> None:
        self.frame = frame
        self.field = schema.find_field(column)
        self.sorted: pl.Series | None = None
        self._cache: dict[str, pl.DataFrame] = {}
        if isinstance(self.field.field_type, PrimitiveType) and frame.height > 1:
            values = physical(frame.get_column(column), self.field.field_type)
            if values.is_sorted() and not values.has_nulls():  # a write's frame is, by its key
                self.sorted, self._by_key = values, frame
            else:
                order = values.arg_sort()
                self.sorted = values.gather(order)
                self._by_key = frame[order]

    def prepare(self, tasks: list[FileScanTask]) -> None:
        """Find the slices of every task in one vectorised search."""
        if self.sorted is None or not tasks:
            return
        dtype = self.sorted.dtype
        if not (dtype.is_integer() or dtype.is_float() or dtype in (pl.String, pl.Date)):
            return  # decoded bounds are not values of this dtype (time: micros): per file
        bounds = [_decoded_bounds(task, self.field) for task in tasks]
        try:
            lo = pl.Series([b[0] if b else None for b in bounds], dtype=self.sorted.dtype)
            hi = pl.Series([b[1] if b else None for b in bounds], dtype=self.sorted.dtype)
            starts = self.sorted.search_sorted(lo, side="left").to_list()
            ends = self.sorted.search_sorted(hi, side="right").to_list()
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            return
        for task, b, i, j in zip(tasks, bounds, starts, ends, strict=True):
            if b is not None:
                self._cache[task.file.file_path] = self._window(int(i), int(j))

    def of(self, task: FileScanTask) -> pl.DataFrame:
        cached = self._cache.get(task.file.file_path)
        if cached is None:
            cached = self._cache[task.file.file_path] = self._slice(task)
        return cached

    def _slice(self, task: FileScanTask) -> pl.DataFrame:
        bounds = _decoded_bounds(task, self.field)
        if self.sorted is None or bounds is None:
            return self.frame
        try:
            i = int(self.sorted.search_sorted(bounds[0], side="left"))
            j = int(self.sorted.search_sorted(bounds[1], side="right"))
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            return self.frame
        return self._window(i, j)

    def _window(self, i: int, j: int) -> pl.DataFrame:
        if i == 0 and j == self.frame.height:
            return self.frame
        return self._by_key.slice(i, max(j - i, 0))
