"""Partition slices: the rows of one Dagster partition, as a predicate on the partition columns.

A dataset partitioned the way Dagster partitions assets (by day, by region, by both) maps each
partition key to a `PartitionSlice`: one term per dimension, all of which a row must satisfy.

- `TimeRange(column, start, end)`: `start <= column < end` — Dagster's time windows are half-open
  at the top, `[start, end)` (delta windows are `(low, high]`; the two never mix). `start` and
  `end` are zone-aware datetimes in the partitions definition's time zone. A `Date` column holds
  the dates whose midnight (in that zone) lies in the window: `[ceil(start), ceil(end))` in dates,
  i.e. the window's days for daily, weekly or monthly partitions. A zone-aware `Datetime` column is
  compared as instants; a naive one as UTC wall-clock time (the project's one convention for naive
  timestamps, as for delta windows).
- `Equals(column, value)`: `column == value` — a static or dynamic partition key on a string
  column, or on an integer column when the key is an integer's text.
- `OneOf(column, values)`: `column` is one of `values` — not a Dagster partition but the keys an
  incremental downstream recomputes (`services/incremental.py`): its write is a sync scoped to
  them, so a key it returns no row for is deleted.

Any other column type cannot hold a partition and is refused (`BadInput`) with the column named.
Pure core: no I/O, no Dagster (the Dagster layer builds slices: `dagster_layer/partitioned.py`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import reduce
from itertools import pairwise
from typing import Any

import polars as pl

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import BadInput, InvalidSpec, MissingKeyColumn, RowsOutsideWindow

MAX_EXAMPLES = 5


@dataclass(frozen=True)
class TimeRange:
    """`start <= column < end` (Dagster's `[start, end)` time window); both bounds zone-aware."""

    column: str
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise InvalidSpec(f"partition window of {self.column!r} needs zone-aware bounds")
        if not self.start < self.end:
            raise InvalidSpec(
                f"partition window of {self.column!r} must have start < end, got "
                f"[{self.start.isoformat()}, {self.end.isoformat()})"
            )

    def __str__(self) -> str:
        return f"{self.start.isoformat()} <= {self.column} < {self.end.isoformat()}"

    def bounds(self, dtype: Any) -> tuple[Any, Any]:
        """`[low, high)` in the column's own kind of value: dates for a `Date` column, aware UTC
        datetimes for a zoned `Datetime`, naive UTC datetimes for a naive one."""
        if isinstance(dtype, pl.Date):
            return _ceil_date(self.start), _ceil_date(self.end)
        if isinstance(dtype, pl.Datetime):
            low, high = self.start.astimezone(UTC), self.end.astimezone(UTC)
            if dtype.time_zone is None:
                return low.replace(tzinfo=None), high.replace(tzinfo=None)
            return low, high
        raise BadInput(
            f"partition column {self.column!r} has type {dtype}; a time-window partition needs "
            "a Date or Datetime column (nothing was written)"
        )

    def expr(self, dtype: Any) -> pl.Expr:
        low, high = self.bounds(dtype)
        col = pl.col(self.column)
        if isinstance(dtype, pl.Datetime) and dtype.time_zone not in (None, "UTC"):
            zone = dtype.time_zone
            lit_low = pl.lit(low).dt.convert_time_zone(zone)
            lit_high = pl.lit(high).dt.convert_time_zone(zone)
            return (col >= lit_low) & (col < lit_high)
        # plain literals (dates, UTC or naive datetimes): a lazy read pushes them down
        return (col >= pl.lit(low)) & (col < pl.lit(high))


@dataclass(frozen=True)
class Equals:
    """`column == value`: one static (or dynamic) partition key."""

    column: str
    value: str

    def __str__(self) -> str:
        return f"{self.column} = {self.value!r}"

    def typed(self, dtype: Any) -> Any:
        """The key as a value of the column's type (the text itself, or an integer)."""
        if isinstance(dtype, (pl.String, pl.Categorical, pl.Enum)):
            return self.value
        if dtype is not None and dtype.is_integer():
            try:
                return int(self.value)
            except ValueError:
                raise BadInput(
                    f"partition key {self.value!r} cannot match the integer column "
                    f"{self.column!r} (nothing was written)"
                ) from None
        raise BadInput(
            f"partition column {self.column!r} has type {dtype}; a static partition needs a "
            "string or integer column (nothing was written)"
        )

    def expr(self, dtype: Any) -> pl.Expr:
        value = self.typed(dtype)
        if isinstance(value, int):
            return pl.col(self.column) == pl.lit(value, dtype=dtype)
        return pl.col(self.column) == pl.lit(value)


@dataclass(frozen=True)
class OneOf:
    """`column` is one of `values` (values of the column's own type; nulls are never inside)."""

    column: str
    values: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.column} in {len(self.values)} key(s)"

    def expr(self, dtype: Any) -> pl.Expr:
        return pl.col(self.column).is_in(pl.Series(self.values, dtype=dtype).implode())


Term = TimeRange | Equals | OneOf


@dataclass(frozen=True)
class PartitionSlice:
    """The rows of one partition: every term holds (a multi-partition has one term per
    dimension). `key` is the Dagster partition key it came from."""

    key: str
    terms: tuple[Term, ...]

    def __post_init__(self) -> None:
        if not self.terms:
            raise InvalidSpec(f"partition {self.key!r} has no partition column")

    def __str__(self) -> str:
        return f"partition {self.key} ({' and '.join(str(t) for t in self.terms)})"

    @property
    def columns(self) -> tuple[str, ...]:
        """The partition columns, one per dimension."""
        return tuple(t.column for t in self.terms)

    def contains(self, schema: pl.Schema | dict[str, Any]) -> pl.Expr:
        """A polars predicate true for the rows of this slice (null partition values: false).

        A column missing from `schema` holds no value of the slice (the whole predicate is
        false): target rows written before the column existed belong to no partition."""
        if any(t.column not in schema for t in self.terms):
            return pl.lit(False)
        expr = pl.lit(True)
        for term in self.terms:
            expr = expr & term.expr(schema[term.column])
        return expr.fill_null(False)


def covering(slices: Sequence[PartitionSlice], schema: pl.Schema | dict[str, Any]) -> pl.Expr:
    """A predicate true for the rows of any of `slices` (in the definition's order): consecutive
    one-term time ranges of one column merge into one range, so a run over days `d1 .. d7` reads
    through a single `d1 <= column < d8` filter pushed into the scan; other slices are OR-ed."""
    merged: list[PartitionSlice] = []
    for part in slices:
        last = merged[-1].terms if merged else ()
        (term,) = part.terms if len(part.terms) == 1 else (None,)
        if (
            len(last) == 1
            and isinstance(last[0], TimeRange)
            and isinstance(term, TimeRange)
            and last[0].column == term.column
            and last[0].end == term.start
        ):
            joined = TimeRange(term.column, last[0].start, term.end)
            merged[-1] = PartitionSlice(merged[-1].key, (joined,))
        else:
            merged.append(part)
    if not merged or any(c not in schema for c in merged[0].columns):
        return pl.lit(False)
    # plain comparisons, no `fill_null`: a filter drops nulls anyway, and the scan pushes these
    ors = [reduce(operator.and_, [t.expr(schema[t.column]) for t in p.terms]) for p in merged]
    return reduce(operator.or_, ors)


def check_in_partition(spec: DatasetSpec, frame: pl.DataFrame, partition: PartitionSlice) -> None:
    """Refuse a frame with a row outside `partition` (`RowsOutsideWindow`), or without its
    columns (`MissingKeyColumn`), before any I/O."""
    missing = [c for c in partition.columns if c not in frame.columns]
    if missing:
        raise MissingKeyColumn(
            f"dataset {spec.name!r}: a write of {partition} needs the partition column(s) "
            f"{missing} in the compute's output (columns: {frame.columns}); nothing was written"
        )
    if not frame.height:
        return
    inside = partition.contains(frame.schema)
    if frame.select(inside.all()).item():  # one pass, nothing gathered when every row fits
        return
    outside = frame.filter(~inside)
    if outside.height:
        sample = outside.select(partition.columns).head(MAX_EXAMPLES).rows()
        shown = ", ".join(repr(r[0] if len(r) == 1 else r) for r in sample)
        raise RowsOutsideWindow(
            f"dataset {spec.name!r}: {outside.height} row(s) lie outside {partition}, e.g. "
            f"{shown}; nothing was written"
        )


def split_by_slices(
    frame: pl.DataFrame, slices: Sequence[PartitionSlice]
) -> tuple[list[pl.DataFrame], int]:
    """`frame`'s rows per slice (in `slices`' order) and how many rows lie in none of them.

    Consecutive one-column time windows (a range run of a daily, hourly... definition) on a
    `Date`, naive or UTC `Datetime` column are split in one vectorised pass: each row's slice is
    found by binary search over the windows' bounds, then one `partition_by`; other slices are
    filtered one by one."""
    merged = _contiguous_range(slices)
    dtype = frame.schema.get(merged.column) if merged is not None else None
    plain = isinstance(dtype, pl.Date) or (
        isinstance(dtype, pl.Datetime) and dtype.time_zone in (None, "UTC")
    )
    if merged is None or dtype is None or not plain:
        parts = [frame.filter(s.contains(frame.schema)) for s in slices]
        return parts, frame.height - sum(p.height for p in parts)
    ranges = [s.terms[0] for s in slices]
    lows = [r.bounds(dtype)[0] for r in ranges if isinstance(r, TimeRange)]
    high = merged.bounds(dtype)[1]
    edges = pl.Series([*lows, high], dtype=dtype)
    column = frame.get_column(merged.column)
    index = edges.search_sorted(column, side="right").cast(pl.Int64) - 1
    valid = column.is_not_null() & (index >= 0) & (index < len(slices))
    bucket = pl.when(valid).then(index).otherwise(-1)
    by_index = frame.with_columns(__po_slice__=bucket).partition_by(
        "__po_slice__", as_dict=True, include_key=False
    )
    empty = frame.clear()
    parts = [by_index.get((n,), empty) for n in range(len(slices))]
    return parts, by_index[(-1,)].height if (-1,) in by_index else 0


def _contiguous_range(slices: Sequence[PartitionSlice]) -> TimeRange | None:
    """The one time window `slices` cover when each is one window of the same column, each
    starting where the previous ends; None otherwise."""
    ranges = [s.terms[0] for s in slices if len(s.terms) == 1]
    if len(ranges) != len(slices) or not ranges:
        return None
    if not all(isinstance(r, TimeRange) and r.column == ranges[0].column for r in ranges):
        return None
    windows = [r for r in ranges if isinstance(r, TimeRange)]
    if any(a.end != b.start for a, b in pairwise(windows)):
        return None
    return TimeRange(windows[0].column, windows[0].start, windows[-1].end)


def _ceil_date(moment: datetime) -> date:
    """The first date whose midnight (in `moment`'s zone) is at or after `moment`."""
    day = moment.date()
    if moment.time() == time(0):
        return day
    return day + timedelta(days=1)


__all__ = [
    "Equals",
    "OneOf",
    "PartitionSlice",
    "Term",
    "TimeRange",
    "check_in_partition",
    "covering",
    "split_by_slices",
]
