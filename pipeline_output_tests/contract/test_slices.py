"""Dagster partitions as slices (`contract/slices.py`) and their column of the decision table
(issue 34). Pure: no I/O, no Dagster."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import polars as pl
import pytest

from pipeline_output import DatasetSpec, Delta, TargetState, Window, plan_write
from pipeline_output.contract.slices import (
    Equals,
    PartitionSlice,
    TimeRange,
    check_in_partition,
    covering,
    split_by_slices,
)
from pipeline_output.errors import BadInput, MissingKeyColumn, RowsOutsideWindow, UnsupportedWrite
from pipeline_output_tests.oracle import DECISIONS

WRITTEN = TargetState(exists=True, has_snapshot=True)
PARIS = ZoneInfo("Europe/Paris")


def day(d: date, column: str = "day", zone=UTC) -> PartitionSlice:
    start = datetime(d.year, d.month, d.day, tzinfo=zone)
    return PartitionSlice(d.isoformat(), (TimeRange(column, start, start + timedelta(days=1)),))


def rows_in(part: PartitionSlice, frame: pl.DataFrame) -> list:
    return frame.filter(part.contains(frame.schema)).to_series().to_list()


def test_a_daily_slice_of_a_date_column_is_its_day_and_nulls_are_outside():
    frame = pl.DataFrame({"day": [date(2024, 1, 1), date(2024, 1, 2), None, date(2024, 1, 3)]})
    assert rows_in(day(date(2024, 1, 2)), frame) == [date(2024, 1, 2)]


def test_a_time_window_is_half_open_at_the_top_on_a_timestamp_column():
    at = [datetime(2024, 1, 2, 0, tzinfo=UTC), datetime(2024, 1, 2, 23, 59, tzinfo=UTC)]
    at.append(datetime(2024, 1, 3, 0, tzinfo=UTC))  # the next day's first instant
    frame = pl.DataFrame({"at": pl.Series(at, dtype=pl.Datetime("us", "UTC"))})
    assert rows_in(day(date(2024, 1, 2), "at"), frame) == at[:2]


def test_a_zoned_window_compares_instants_and_a_naive_column_is_utc_wall_clock():
    paris_day = day(date(2024, 1, 2), "at", PARIS)  # [Jan 1 23:00 UTC, Jan 2 23:00 UTC)
    aware = [datetime(2024, 1, 1, 22, 59, tzinfo=UTC), datetime(2024, 1, 1, 23, 0, tzinfo=UTC)]
    zoned = pl.DataFrame({"at": pl.Series(aware, dtype=pl.Datetime("us", "Asia/Tokyo"))})
    assert len(rows_in(paris_day, zoned)) == 1
    naive = pl.DataFrame({"at": [datetime(2024, 1, 1, 23, 0), datetime(2024, 1, 2, 23, 0)]})
    assert rows_in(paris_day, naive) == [datetime(2024, 1, 1, 23, 0)]


def test_an_hourly_window_holds_a_date_only_at_its_midnight():
    start = datetime(2024, 1, 2, 0, tzinfo=UTC)
    midnight = PartitionSlice("h0", (TimeRange("day", start, start + timedelta(hours=1)),))
    later = PartitionSlice(
        "h5", (TimeRange("day", start + timedelta(hours=5), start + timedelta(hours=6)),)
    )
    frame = pl.DataFrame({"day": [date(2024, 1, 2)]})
    assert rows_in(midnight, frame) == [date(2024, 1, 2)] and rows_in(later, frame) == []


def test_static_keys_match_strings_and_integers_and_refuse_other_types():
    eu = PartitionSlice("eu", (Equals("region", "eu"),))
    assert rows_in(eu, pl.DataFrame({"region": ["eu", "us", None]})) == ["eu"]
    seven = PartitionSlice("7", (Equals("shard", "7"),))
    assert rows_in(seven, pl.DataFrame({"shard": [7, 8]})) == [7]
    with pytest.raises(BadInput, match="partition column 'region' has type Float64"):
        pl.DataFrame({"region": [1.5]}).filter(eu.contains({"region": pl.Float64()}))


def test_a_multi_partition_slice_needs_every_dimension():
    (term,) = day(date(2024, 1, 2)).terms
    part = PartitionSlice("2024-01-02|eu", (term, Equals("region", "eu")))
    frame = pl.DataFrame(
        {
            "day": [date(2024, 1, 2), date(2024, 1, 2), date(2024, 1, 3)],
            "region": ["eu", "us", "eu"],
        }
    )
    assert frame.filter(part.contains(frame.schema)).height == 1


def test_rows_outside_or_a_missing_column_are_refused_naming_the_partition():
    spec = DatasetSpec(name="daily", strategy="replace")
    part = day(date(2024, 1, 2))
    with pytest.raises(RowsOutsideWindow, match=r"1 row\(s\) lie outside partition 2024-01-02"):
        check_in_partition(spec, pl.DataFrame({"day": [date(2024, 1, 2), date(2024, 1, 9)]}), part)
    with pytest.raises(MissingKeyColumn, match=r"partition column\(s\) \['day'\]"):
        check_in_partition(spec, pl.DataFrame({"x": [1]}), part)
    check_in_partition(spec, pl.DataFrame({"day": []}, schema={"day": pl.Date}), part)


@pytest.mark.parametrize(
    "strategy", ["snapshot_replace", "append_always", "append_new", "replace", "sync"]
)
def test_a_partition_write_follows_the_decision_tables_partition_column(strategy):
    spec = DatasetSpec(name="d", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    part = day(date(2024, 1, 2))
    plan = plan_write(spec, WRITTEN, partition=part)
    assert plan.write_mode == DECISIONS[(strategy, "partition")]
    assert plan.partition == part and plan.reason == "partition 2024-01-02"
    assert "2024-01-02" in plan.describe()
    first = plan_write(spec, TargetState(exists=False, has_snapshot=False), partition=part)
    assert (first.write_mode, first.delete_scope) == ("replace", "all")


def test_a_delta_dataset_is_not_written_by_dagster_partition():
    spec = DatasetSpec(name="d", primary_key=("id",), delta=Delta(source="s", watermark="seq"))
    with pytest.raises(UnsupportedWrite, match="written by window, not by Dagster partition"):
        plan_write(spec, WRITTEN, Window(low=1, high=2), partition=day(date(2024, 1, 2)))


@pytest.mark.parametrize(
    "column",
    [
        pl.Series([date(2024, 1, 30) + timedelta(days=n % 6) for n in range(30)] + [None]),
        pl.Series([datetime(2024, 1, 30, n % 24) + timedelta(days=n % 6) for n in range(30)]),
        pl.Series(
            [datetime(2024, 1, 30, n % 24, tzinfo=UTC) + timedelta(days=n % 6) for n in range(30)]
        ),
    ],
    ids=["date", "naive", "utc"],
)
def test_a_frame_splits_by_consecutive_days_as_filtering_each_day_would(column):
    """The vectorised split of a range run's frame and the one range covering its days agree with
    a filter per day (the oracle), rows outside every day (and nulls) counted, across a month."""
    frame = pl.DataFrame({"day": column, "n": range(len(column))})
    days = [day(date(2024, 1, 31) + timedelta(days=n)) for n in range(4)]  # Jan 31 .. Feb 3
    parts, outside = split_by_slices(frame, days)
    expected = [frame.filter(d.contains(frame.schema)) for d in days]
    assert [p.sort("n").rows() for p in parts] == [e.sort("n").rows() for e in expected]
    assert outside == frame.height - sum(e.height for e in expected) > 0
    within = frame.filter(covering(days, frame.schema))
    assert sorted(within["n"]) == sorted(pl.concat(expected)["n"])
