"""The Iceberg statistics of a written Parquet file, from its footer, as pyiceberg computes them.

Owns `FooterStatistics`: for one table schema and its metrics modes (`write.metadata.metrics.*`),
the `DataFile` fields pyiceberg's `data_file_statistics_from_parquet_metadata(...)
.to_serialized_dict()` gives — record count, column sizes, value and null counts, lower and upper
bounds (truncated as its metrics modes say), split offsets — the same values and the same bytes,
without its per-column set-up on every file: pyiceberg compares pydantic metrics modes, builds a
`StatsAggregator` (a schema visitor) and a truncate transform for each column of each file,
~0.2 ms a file of 7 columns; a compaction of 200 partitions writes 200 files. What is decided per
column once (its field id, metrics mode, how its bounds are serialized and truncated) is decided
when the writer is made; per file only the footer's values are read. Anything unusual — a column
the plan does not know, a physical type pyiceberg refuses, a truncation it would refuse —
is left to pyiceberg itself, so its errors stay its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    StatisticsCollector,
    StatsAggregator,
    data_file_statistics_from_parquet_metadata,
)
from pyiceberg.transforms import TruncateTransform
from pyiceberg.types import BinaryType, DecimalType, PrimitiveType, StringType
from pyiceberg.utils.decimal import unscaled_to_decimal
from pyiceberg.utils.truncate import (
    truncate_upper_bound_binary_string,
    truncate_upper_bound_text_string,
)

from pipeline_output.errors import UncomputedFileStatistics

Bound = Callable[[Any], bytes | None]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Column:
    """What is known of one Parquet column (by its path) before any file is read."""

    field_id: int
    counts: bool  # value counts and null counts kept (metrics mode not `none`)
    bounds: bool  # lower and upper bounds kept (mode `truncate(n)` or `full`)
    iceberg_type: PrimitiveType
    scale: int | None  # a decimal's: its bounds read as unscaled integers unless fixed bytes
    lower: Bound
    upper: Bound


def _lower(iceberg_type: PrimitiveType, trunc: int | None) -> Bound:
    """What pyiceberg's `StatsAggregator` `min_as_bytes` gives, the truncation decided once."""
    if trunc is None:
        return lambda value: to_bytes(iceberg_type, value)
    if not isinstance(iceberg_type, (StringType, BinaryType)):
        raise UncomputedFileStatistics  # (pyiceberg's plan truncates strings and binaries only)
    cut = TruncateTransform(width=trunc).transform(iceberg_type)

    def truncated(value: Any) -> bytes | None:
        short = cut(value)
        return to_bytes(iceberg_type, short) if short is not None else None

    return truncated


def _upper(iceberg_type: PrimitiveType, trunc: int | None) -> Bound:
    """What pyiceberg's `StatsAggregator` `max_as_bytes` gives, the truncation decided once."""
    if isinstance(iceberg_type, StringType):

        def text(value: Any) -> bytes | None:
            if not isinstance(value, str):
                raise UncomputedFileStatistics
            cut = truncate_upper_bound_text_string(value, trunc)
            return to_bytes(iceberg_type, cut) if cut is not None else None

        return text
    if isinstance(iceberg_type, BinaryType):

        def binary(value: Any) -> bytes | None:
            if not isinstance(value, bytes):
                raise UncomputedFileStatistics
            cut = truncate_upper_bound_binary_string(value, trunc)
            return to_bytes(iceberg_type, cut) if cut is not None else None

        return binary
    if trunc is not None:
        raise UncomputedFileStatistics
    return lambda value: to_bytes(iceberg_type, value)


class FooterStatistics:
    """The statistics of Parquet files of one table schema (module docstring)."""

    def __init__(
        self, stats_columns: dict[int, StatisticsCollector], column_mapping: dict[str, int]
    ) -> None:
        self._plan = stats_columns
        self._mapping = column_mapping
        self._columns: dict[str, _Column | None] = {}
        self._physical_ok: dict[tuple[int, str], bool] = {}

    def of_bytes(self, data: bytes) -> dict[str, Any]:
        """The statistics of the Parquet file `data` (`of_footer`)."""
        return self.of_footer(pq.read_metadata(pa.BufferReader(data)))

    def of_footer(self, footer: pq.FileMetaData) -> dict[str, Any]:
        """`DataFile` fields of the file with this footer, as pyiceberg's
        `data_file_statistics_from_parquet_metadata(...).to_serialized_dict()` gives them
        (`nan_value_counts` empty: Parquet footers hold none)."""
        try:
            return self._compute(footer)
        except UncomputedFileStatistics:
            return data_file_statistics_from_parquet_metadata(
                parquet_metadata=footer,
                stats_columns=self._plan,
                parquet_column_mapping=self._mapping,
            ).to_serialized_dict()

    def _column(self, path: str) -> _Column:
        if path in self._columns:
            known = self._columns[path]
            if known is None:
                raise UncomputedFileStatistics
            return known
        column: _Column | None = None
        try:
            field_id = self._mapping[path]
            collector = self._plan[field_id]
            mode = collector.mode
            kind = mode.type
            trunc = mode.length if kind == MetricModeTypes.TRUNCATE else None
            iceberg_type = collector.iceberg_type
            bounds = kind in (MetricModeTypes.TRUNCATE, MetricModeTypes.FULL)
            column = _Column(
                field_id=field_id,
                counts=kind != MetricModeTypes.NONE,
                bounds=bounds,
                iceberg_type=iceberg_type,
                scale=iceberg_type.scale if isinstance(iceberg_type, DecimalType) else None,
                lower=_lower(iceberg_type, trunc) if bounds else _never,
                upper=_upper(iceberg_type, trunc) if bounds else _never,
            )
        except (KeyError, UncomputedFileStatistics):
            column = None
        self._columns[path] = column
        if column is None:
            raise UncomputedFileStatistics
        return column

    def _physical(self, column: _Column, physical_type: str) -> None:
        """pyiceberg's check that the column's physical type fits its Iceberg type (the
        `StatsAggregator` it would build raises otherwise: pyiceberg raises it then)."""
        key = (column.field_id, physical_type)
        ok = self._physical_ok.get(key)
        if ok is None:
            try:
                StatsAggregator(column.iceberg_type, physical_type)
                ok = True
            except ValueError:
                ok = False
            self._physical_ok[key] = ok
        if not ok:
            raise UncomputedFileStatistics

    def _compute(self, footer: pq.FileMetaData) -> dict[str, Any]:
        column_sizes: dict[int, int] = {}
        value_counts: dict[int, int] = {}
        null_counts: dict[int, int] = {}
        split_offsets: list[int] = []
        lows: dict[int, Any] = {}
        highs: dict[int, Any] = {}
        invalid: set[int] = set()
        bounded: dict[int, _Column] = {}
        known = self._columns
        for r in range(footer.num_row_groups):
            group = footer.row_group(r)
            first = group.column(0)
            data_offset = first.data_page_offset
            dictionary_offset = first.dictionary_page_offset
            if first.has_dictionary_page and dictionary_offset < data_offset:
                split_offsets.append(dictionary_offset)
            else:
                split_offsets.append(data_offset)
            for pos in range(footer.num_columns):
                chunk = group.column(pos)
                path = chunk.path_in_schema
                column = known.get(path) or self._column(path)
                field_id = column.field_id
                column_sizes[field_id] = column_sizes.get(field_id, 0) + chunk.total_compressed_size
                if not column.counts:
                    continue
                value_counts[field_id] = value_counts.get(field_id, 0) + chunk.num_values
                if not chunk.is_stats_set:
                    invalid.add(field_id)
                    logger.warning(
                        "PyArrow statistics missing for column %d when writing file", pos
                    )
                    continue
                try:
                    stats = chunk.statistics
                    if stats.has_null_count:
                        null_counts[field_id] = null_counts.get(field_id, 0) + stats.null_count
                    if not column.bounds:
                        continue
                    self._physical(column, stats.physical_type)
                    bounded[field_id] = column
                    if column.scale is not None and stats.physical_type != "FIXED_LEN_BYTE_ARRAY":
                        low, high = stats.min_raw, stats.max_raw  # (unscaled, as pyiceberg)
                        if low is not None:
                            low = unscaled_to_decimal(low, column.scale)
                        if high is not None:
                            high = unscaled_to_decimal(high, column.scale)
                    else:
                        low, high = stats.min, stats.max
                except pa.lib.ArrowNotImplementedError as exc:
                    invalid.add(field_id)
                    logger.warning(exc)
                    continue
                if low is not None:
                    was = lows.get(field_id)
                    lows[field_id] = low if was is None else min(low, was)
                if high is not None:
                    was = highs.get(field_id)
                    highs[field_id] = high if was is None else max(high, was)
        split_offsets.sort()
        for field_id in invalid:
            bounded.pop(field_id, None)
            null_counts.pop(field_id, None)
        lower_bounds: dict[int, bytes] = {}
        upper_bounds: dict[int, bytes] = {}
        for field_id, column in bounded.items():
            low = lows.get(field_id)
            if low is not None:
                encoded = column.lower(low)
                if encoded is not None:
                    lower_bounds[field_id] = encoded
            high = highs.get(field_id)
            if high is not None:
                encoded = column.upper(high)
                if encoded is not None:
                    upper_bounds[field_id] = encoded
        return {
            "record_count": footer.num_rows,
            "column_sizes": column_sizes,
            "value_counts": value_counts,
            "null_value_counts": null_counts,
            "nan_value_counts": {},
            "lower_bounds": lower_bounds,
            "upper_bounds": upper_bounds,
            "split_offsets": split_offsets,
        }


def _never(_value: Any) -> bytes | None:
    return None
