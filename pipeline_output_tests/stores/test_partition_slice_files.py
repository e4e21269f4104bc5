"""A Dagster partition's replace on an Iceberg table partitioned the same way (issue 34): the
partition's data files are dropped whole, without being read, and no other file is touched.

"Without being read" is shown without instrumenting anything: the day-2 data file is truncated on
disk before the write, so any read of it would fail — the replace still commits, and only a table
whose files straddle days (unpartitioned) has to read and rewrite one.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.contract.slices import PartitionSlice, TimeRange
from pipeline_output_tests.oracle import assert_same_multiset

DAYS = [date(2024, 1, d) for d in (1, 2, 3)]


def day_slice(day: date) -> PartitionSlice:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return PartitionSlice(day.isoformat(), (TimeRange("day", start, start + timedelta(days=1)),))


def rows(day: date, ids: range, *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(list(ids), dtype=pl.Int64),
            "day": pl.Series([day] * len(ids), dtype=pl.Date),
            "v": [f"{i}-v{version}" for i in ids],
        }
    )


def written_by_day(h, spec: DatasetSpec) -> pl.DataFrame:
    """Days 1..3 written as one first deploy (one file per Iceberg partition, or one file)."""
    frame = pl.concat([rows(d, range(n * 10, n * 10 + 5)) for n, d in enumerate(DAYS)])
    h.store().write(spec, frame)
    return frame


def day2_file(h, spec: DatasetSpec) -> Path:
    """The one data file holding day 2's rows."""
    table = h.table(spec)
    tasks = list(table.scan(row_filter="day = '2024-01-02'").plan_files())
    assert len(tasks) == 1
    return Path(tasks[0].file.file_path.removeprefix("file://"))


def test_a_replace_of_a_day_drops_its_file_without_reading_it_when_the_table_is_partitioned_by_day(
    h,
):
    spec = DatasetSpec(name="daily", strategy="replace", partition_by=("day(day)",))
    frame = written_by_day(h, spec)
    path = day2_file(h, spec)
    path.write_bytes(b"not parquet")  # any read of day 2's file would now fail

    day2 = rows(DAYS[1], range(100, 103), version=1)
    res = h.store().write(spec, day2, partition=day_slice(DAYS[1]))

    table = h.table(spec)
    summary = table.current_snapshot().summary
    assert summary["deleted-data-files"] == "1"  # day 2's file, dropped whole
    assert summary["added-data-files"] == "1"  # the new rows; days 1 and 3 untouched
    assert (res.rows_inserted, res.rows_deleted, res.rows_preserved) == (3, 5, 10)
    expected = pl.concat([frame.filter(pl.col("day") != DAYS[1]), day2])
    assert_same_multiset(h.raw(spec).select(expected.columns), expected)


def test_an_unpartitioned_table_has_to_read_and_rewrite_the_file_holding_the_day(h):
    spec = DatasetSpec(name="mixed", strategy="replace", partition_by=())
    frame = written_by_day(h, spec)  # one file holds all three days
    day2 = rows(DAYS[1], range(100, 103), version=1)
    res = h.store().write(spec, day2, partition=day_slice(DAYS[1]))
    summary = h.table(spec).current_snapshot().summary
    assert summary["deleted-data-files"] == "1"  # read, and its days 1 and 3 rewritten
    assert res.rows_preserved == 10 and res.rows_deleted == 5
    assert_same_multiset(
        h.raw(spec).select(frame.columns),
        pl.concat([frame.filter(pl.col("day") != DAYS[1]), day2]),
    )

    broken = DatasetSpec(name="broken", strategy="replace", partition_by=())
    written_by_day(h, broken)
    day2_file(h, broken).write_bytes(b"not parquet")
    with pytest.raises(pa.ArrowInvalid, match="Parquet magic bytes not found"):
        h.store().write(broken, day2, partition=day_slice(DAYS[1]))  # it reads day 2's file
