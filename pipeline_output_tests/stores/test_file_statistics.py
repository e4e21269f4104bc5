"""`file_statistics.FooterStatistics`: a written Parquet file's Iceberg statistics from its footer
are pyiceberg's own (`data_file_statistics_from_parquet_metadata(...).to_serialized_dict()`),
value for value and byte for byte — bounds of every primitive type (strings and binaries
truncated, an upper bound that cannot be truncated dropped, dates, times, decimals, timestamps
with and without zone), null and value counts, column sizes, split offsets — whatever writer wrote
the file (polars, pyarrow, several row groups) and whatever metrics modes the table sets; and the
files a compaction writes carry them (`test_compaction.py` reads such a table back)."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from pipeline_output.stores.iceberg.snapshot import file_statistics, files
from pipeline_output.stores.iceberg.snapshot.file_statistics import FooterStatistics

FLAT = Schema(
    NestedField(1, "b", BooleanType(), required=False),
    NestedField(2, "i", IntegerType(), required=False),
    NestedField(3, "l", LongType(), required=True),
    NestedField(4, "f", FloatType(), required=False),
    NestedField(5, "d", DoubleType(), required=False),
    NestedField(6, "dec_small", DecimalType(9, 2), required=False),
    NestedField(7, "dec_big", DecimalType(38, 10), required=False),
    NestedField(8, "day", DateType(), required=False),
    NestedField(9, "t", TimeType(), required=False),
    NestedField(10, "ts", TimestampType(), required=False),
    NestedField(11, "tstz", TimestamptzType(), required=False),
    NestedField(12, "s", StringType(), required=False),
    NestedField(13, "bin", BinaryType(), required=False),
    NestedField(14, "nothing", StringType(), required=False),  # every value null
)
NESTED = Schema(
    NestedField(1, "l", LongType(), required=True),
    NestedField(2, "xs", ListType(3, LongType(), element_required=False), required=False),
    NestedField(
        4, "st", StructType(NestedField(5, "a", StringType(), required=False)), required=False
    ),
)
TOP = "\U0010ffff"  # the largest code point: an upper bound made of it cannot be truncated


def flat_rows(n: int = 240) -> pa.Table:
    def some(i: int, value: Any) -> Any:
        return None if i % 11 == 5 else value

    data = {
        "b": [some(i, i % 3 == 0) for i in range(n)],
        "i": [some(i, (i * 37) % 1000 - 500) for i in range(n)],
        "l": [i * 1_000_000_007 - 10**11 for i in range(n)],
        "f": [
            some(i, float("nan") if i % 17 == 0 else (-0.0 if i % 13 == 0 else i / 7))
            for i in range(n)
        ],
        "d": [some(i, float("nan") if i % 19 == 0 else (i - 120) / 3) for i in range(n)],
        "dec_small": [some(i, Decimal(i * 3 - 300) / 100) for i in range(n)],
        "dec_big": [some(i, Decimal(i) * Decimal("12345678.0123456789")) for i in range(n)],
        "day": [some(i, date(2020, 1, 1 + i % 28)) for i in range(n)],
        "t": [some(i, time(i % 24, i % 60, i % 60, i)) for i in range(n)],
        "ts": [some(i, datetime(2021, 3, 1 + i % 28, i % 24, 5, 6, i * 7)) for i in range(n)],
        "tstz": [some(i, datetime(2022, 5, 1 + i % 28, 1, 2, 3, i, tzinfo=UTC)) for i in range(n)],
        "s": [
            some(i, TOP * 20 if i == 7 else f"string number {i:05d} padded past sixteen ünïcödé")
            for i in range(n)
        ],
        "bin": [
            some(i, b"\xff" * 20 if i == 9 else bytes([i % 256]) * (i % 30 + 1)) for i in range(n)
        ],
        "nothing": [None] * n,
    }
    return pa.Table.from_pydict(data, schema=schema_to_pyarrow(FLAT, include_field_ids=True))


def nested_rows(n: int = 100) -> pa.Table:
    data = {
        "l": list(range(n)),
        "xs": [None if i % 7 == 0 else list(range(i % 4)) for i in range(n)],
        "st": [None if i % 5 == 0 else {"a": f"a{i}"} for i in range(n)],
    }
    return pa.Table.from_pydict(data, schema=schema_to_pyarrow(NESTED, include_field_ids=True))


def pyarrow_file(table: pa.Table, **options: Any) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def polars_file(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    frame.write_parquet(buffer, compression="zstd", statistics=True, arrow_schema=table.schema)
    return buffer.getvalue()


MODES = {
    "default": {},
    "full": {"write.metadata.metrics.default": "full"},
    "counts": {"write.metadata.metrics.default": "counts"},
    "none": {"write.metadata.metrics.default": "none"},
    "truncate(3)": {"write.metadata.metrics.default": "truncate(3)"},
    "per column": {
        "write.metadata.metrics.column.s": "truncate(1)",
        "write.metadata.metrics.column.bin": "full",
        "write.metadata.metrics.column.d": "none",
        "write.metadata.metrics.column.day": "counts",
    },
}
FILES = {
    "polars": lambda: polars_file(flat_rows()),
    "polars, maxima that round up": lambda: polars_file(flat_rows().slice(10)),
    "pyarrow, row groups of 50": lambda: pyarrow_file(flat_rows(), row_group_size=50),
    "pyarrow, dictionary pages": lambda: pyarrow_file(flat_rows(), use_dictionary=True),
    "pyarrow, no statistics on s": lambda: pyarrow_file(flat_rows(), write_statistics=["l", "i"]),
}


def pyiceberg_statistics(schema: Schema, properties: dict[str, str], data: bytes) -> dict[str, Any]:
    return data_file_statistics_from_parquet_metadata(
        parquet_metadata=pq.read_metadata(pa.BufferReader(data)),
        stats_columns=compute_statistics_plan(schema, properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    ).to_serialized_dict()


def ours(schema: Schema, properties: dict[str, str]) -> FooterStatistics:
    return FooterStatistics(
        compute_statistics_plan(schema, properties), parquet_path_to_id_mapping(schema)
    )


@pytest.fixture
def pyiceberg_never_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The statistics are computed without falling back to pyiceberg's function."""

    def refuse(**_: Any) -> Any:
        raise AssertionError("fell back to pyiceberg's statistics")

    monkeypatch.setattr(file_statistics, "data_file_statistics_from_parquet_metadata", refuse)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("written_by", list(FILES))
def test_a_files_statistics_are_pyiceberg_s_byte_for_byte(written_by: str, mode: str) -> None:
    data = FILES[written_by]()
    expected = pyiceberg_statistics(FLAT, MODES[mode], data)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(file_statistics, "data_file_statistics_from_parquet_metadata", None)
        got = ours(FLAT, MODES[mode]).of_bytes(data)

    assert got == expected
    for key in ("lower_bounds", "upper_bounds", "column_sizes", "value_counts"):
        assert list(got[key].items()) == list(expected[key].items())  # the same order too
    if mode == "default" and written_by in ("polars", "pyarrow, row groups of 50"):  # the bounds
        s, bin_ = 12, 13
        assert len(expected["lower_bounds"][s].decode()) == 16  # truncate(16)
        assert s not in expected["upper_bounds"]  # TOP * 20 cannot be rounded up
        assert bin_ not in expected["upper_bounds"]  # nor can b"\xff" * 20
        assert 14 not in expected["lower_bounds"] and expected["null_value_counts"][14] == 240
    if mode == "default" and written_by.endswith("round up"):  # truncated, last one bumped
        top = max(v for v in flat_rows().slice(10)["s"].to_pylist() if v is not None)
        assert expected["upper_bounds"][12].decode() == top[:15] + chr(ord(top[15]) + 1)
    if written_by.endswith("on s"):  # no statistics: no bounds, no null counts
        assert 12 not in expected["lower_bounds"] and 12 not in expected["null_value_counts"]


def test_the_same_writer_gives_each_file_its_own_statistics(pyiceberg_never_asked: None) -> None:
    """One `FooterStatistics` for many files (what a writer keeps): no file's values leak
    into the next one's."""
    stats = ours(FLAT, {})
    whole = flat_rows()
    for start, length in ((0, 240), (100, 20), (7, 3), (239, 1), (9, 1)):
        data = polars_file(whole.slice(start, length))
        assert stats.of_bytes(data) == pyiceberg_statistics(FLAT, {}, data)


def test_nested_columns_get_pyiceberg_s_counts_and_no_bounds(pyiceberg_never_asked: None) -> None:
    data = pyarrow_file(nested_rows(), row_group_size=30)

    got = ours(NESTED, {}).of_bytes(data)

    assert got == pyiceberg_statistics(NESTED, {}, data)
    assert set(got["lower_bounds"]) == {1}


def test_decimals_stored_as_integers_get_pyiceberg_s_bounds(pyiceberg_never_asked: None) -> None:
    data = pyarrow_file(flat_rows(), store_decimal_as_integer=True)

    assert ours(FLAT, {}).of_bytes(data) == pyiceberg_statistics(FLAT, {}, data)


def test_a_physical_type_pyiceberg_refuses_fails_as_pyiceberg_fails() -> None:
    """A column whose Parquet type does not fit its Iceberg type: pyiceberg's own error."""
    table = pa.table({"l": pa.array(["not", "a", "long"])})
    data = pyarrow_file(table)
    schema = Schema(NestedField(1, "l", LongType(), required=False))

    with pytest.raises(ValueError, match="Unexpected physical type"):
        pyiceberg_statistics(schema, {}, data)
    with pytest.raises(ValueError, match="Unexpected physical type"):
        ours(schema, {}).of_bytes(data)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_flat_tables_statistics_plan_is_pyiceberg_s_read_from_its_fields(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data file writer of a table of top-level primitive columns plans its statistics (each
    column's metrics mode, type, name) as pyiceberg's `compute_statistics_plan` does, without its
    schema visitor (~0.7 ms of a fresh process's first file: issue 44); its files' statistics are
    pyiceberg's byte for byte. A schema with nested columns is left to pyiceberg."""
    assert files.flat_statistics_plan(FLAT, MODES[mode]) == compute_statistics_plan(
        FLAT, MODES[mode]
    )
    assert files.flat_statistics_plan(NESTED, MODES[mode]) is None

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("pyiceberg's schema visitor was asked")

    monkeypatch.setattr(files, "compute_statistics_plan", refuse)
    monkeypatch.setattr(files, "parquet_path_to_id_mapping", refuse)
    metadata = new_table_metadata(
        FLAT, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///unused", MODES[mode]
    )
    written: list[bytes] = []

    class Memory(FileIO):
        def new_input(self, location: str) -> Any:
            raise NotImplementedError

        def new_output(self, location: str) -> Any:
            raise NotImplementedError

        def delete(self, location: Any) -> None:
            raise NotImplementedError

    monkeypatch.setattr(files, "write_whole", lambda _io, _path, data: written.append(data))
    writer = files.DataFileWriter(metadata, Memory(), write_id=uuid.uuid4())
    frame = pl.from_arrow(flat_rows())
    assert isinstance(frame, pl.DataFrame)
    (data_file,) = writer.write(frame)
    expected = pyiceberg_statistics(metadata.schema(), MODES[mode], written[0])
    for key in ("lower_bounds", "upper_bounds", "value_counts", "null_value_counts"):
        assert getattr(data_file, key) == expected[key], key
