"""Dagster partitions as slices, on both arms (issue 34): writing a partition makes the target's
slice exactly the compute's rows — rows no longer produced deleted, every change counted, the
other partitions untouched, one commit — `append_always` / `append_new` append into the slice,
and a row outside the partition is refused with nothing written.

Expected contents come from plain polars here (the slice written out as a filter), never from
`contract/slices.py`.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, RowsOutsideWindow
from pipeline_output.contract.slices import Equals, PartitionSlice, TimeRange
from pipeline_output_tests.oracle import assert_same_multiset

DAY = [date(2024, 1, d) for d in (1, 2, 3)]


def day_slice(day: date, column: str = "day") -> PartitionSlice:
    """Dagster's daily partition `day` (UTC): `[midnight, next midnight)`."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return PartitionSlice(day.isoformat(), (TimeRange(column, start, start + timedelta(days=1)),))


def rows(day: date, ids: list[int], *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "day": pl.Series([day] * len(ids), dtype=pl.Date),
            "amount": pl.Series([i * 10.0 + version for i in ids], dtype=pl.Float64),
        }
    )


def three_days(h: Any, spec: DatasetSpec) -> pl.DataFrame:
    """Days 1, 2 and 3 written one partition each; returns what the target holds."""
    parts = [rows(DAY[0], [1, 2, 3]), rows(DAY[1], [4, 5, 6, 7]), rows(DAY[2], [8, 9])]
    for day, part in zip(DAY, parts, strict=True):
        h.write(spec, part, partition=day_slice(day), run_id=f"day-{day}")
    return pl.concat(parts)


@pytest.mark.rest_default
@pytest.mark.parametrize("strategy", ["snapshot_replace", "sync"])
def test_a_partition_becomes_exactly_the_computes_rows_with_every_change_counted(h, strategy):
    spec = DatasetSpec(name="daily", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    before = three_days(h, spec)
    commits = h.commits(spec)
    # day 2 again: 4 unchanged, 5 updated, 6 and 7 no longer produced... 7 comes back as new id 10
    day2 = pl.concat([rows(DAY[1], [4]), rows(DAY[1], [5], version=1), rows(DAY[1], [10])])
    res = h.write(spec, day2, partition=day_slice(DAY[1]), run_id="again")

    expected = pl.concat([before.filter(pl.col("day") != DAY[1]), day2])
    assert_same_multiset(h.rows(spec), expected)
    assert (res.rows_inserted, res.rows_updated, res.rows_deleted) == (1, 1, 2)
    assert res.rows_unchanged == 1 and res.rows_total_after == expected.height
    assert res.write_mode == "sync" and res.plan is not None and res.plan.partition is not None
    assert len(h.commits(spec)) == len(commits) + 1  # one commit
    # days 1 and 3, read back alone, are what they were
    for day in (DAY[0], DAY[2]):
        assert_same_multiset(
            h.rows(spec).filter(pl.col("day") == day), before.filter(pl.col("day") == day)
        )

    again = h.write(spec, day2, partition=day_slice(DAY[1]), run_id="same")
    assert again.noop and len(h.commits(spec)) == len(commits) + 1  # nothing changed: no commit


def test_a_key_moved_into_the_partition_leaves_its_old_partition(h):
    spec = DatasetSpec(name="moved", primary_key=("id",))
    before = three_days(h, spec)
    day2 = pl.concat([rows(DAY[1], [4, 5, 6, 7]), rows(DAY[1], [1])])  # id 1 was on day 1
    res = h.write(spec, day2, partition=day_slice(DAY[1]))
    expected = pl.concat([before.filter((pl.col("day") != DAY[1]) & (pl.col("id") != 1)), day2])
    assert_same_multiset(h.rows(spec), expected)
    assert (res.rows_inserted, res.rows_updated, res.rows_deleted) == (0, 1, 0)


def test_replace_drops_the_slice_and_writes_the_computes_rows(h):
    spec = DatasetSpec(name="replaced", strategy="replace")
    before = three_days(h, spec)
    day2 = pl.concat([rows(DAY[1], [4]), rows(DAY[1], [4]), rows(DAY[1], [11])])  # no key
    res = h.write(spec, day2, partition=day_slice(DAY[1]))
    assert_same_multiset(h.rows(spec), pl.concat([before.filter(pl.col("day") != DAY[1]), day2]))
    assert (res.write_mode, res.rows_inserted, res.rows_deleted) == ("replace", 3, 4)


@pytest.mark.parametrize("strategy", ["append_always", "append_new"])
def test_append_strategies_append_into_the_slice(h, strategy):
    spec = DatasetSpec(name="appended", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    before = three_days(h, spec)
    day2 = rows(DAY[1], [4, 12], version=5)  # id 4 exists: appended again, or skipped
    res = h.write(spec, day2, partition=day_slice(DAY[1]))
    added = day2 if strategy == "append_always" else day2.filter(pl.col("id") == 12)
    assert_same_multiset(h.rows(spec), pl.concat([before, added]))
    assert res.rows_inserted == added.height and res.rows_deleted == 0


def test_a_static_partition_is_replaced_and_the_others_kept(h):
    spec = DatasetSpec(name="regions", primary_key=("id",))
    eu = pl.DataFrame({"id": [1, 2], "region": ["eu", "eu"], "v": ["a", "b"]})
    us = pl.DataFrame({"id": [3, 4], "region": ["us", "us"], "v": ["c", "d"]})
    h.write(spec, eu, partition=PartitionSlice("eu", (Equals("region", "eu"),)))
    h.write(spec, us, partition=PartitionSlice("us", (Equals("region", "us"),)))
    eu2 = pl.DataFrame({"id": [2, 5], "region": ["eu", "eu"], "v": ["B", "e"]})
    res = h.write(spec, eu2, partition=PartitionSlice("eu", (Equals("region", "eu"),)))
    assert_same_multiset(h.rows(spec), pl.concat([us, eu2]))
    assert (res.rows_inserted, res.rows_updated, res.rows_deleted) == (1, 1, 1)


def test_a_multi_partition_is_the_intersection_of_its_dimensions(h):
    spec = DatasetSpec(name="by_day_region", primary_key=("id",))
    frame = pl.DataFrame(
        {
            "id": [1, 2, 3, 4],
            "day": [DAY[0], DAY[0], DAY[1], DAY[0]],
            "region": ["eu", "us", "eu", "eu"],
        }
    )

    def part(day: date, region: str) -> PartitionSlice:
        (term,) = day_slice(day).terms
        return PartitionSlice(f"{day}|{region}", (term, Equals("region", region)))

    for (day, region), group in frame.group_by(["day", "region"]):
        h.write(spec, group, partition=part(day, region))  # type: ignore[arg-type]
    new = pl.DataFrame({"id": [9], "day": [DAY[0]], "region": ["eu"]})
    res = h.write(spec, new, partition=part(DAY[0], "eu"))
    in_slice = (pl.col("day") == DAY[0]) & (pl.col("region") == "eu")
    assert_same_multiset(h.rows(spec), pl.concat([frame.filter(~in_slice), new]))
    assert (res.rows_inserted, res.rows_deleted) == (1, 2)


@pytest.mark.parametrize("strategy", ["snapshot_replace", "replace", "append_always"])
def test_a_row_outside_the_partition_is_refused_with_nothing_written(h, strategy):
    spec = DatasetSpec(name="refused", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    three_days(h, spec)
    footprint = h.footprint(spec)
    stray = pl.concat([rows(DAY[1], [4]), rows(DAY[2], [99])])
    with pytest.raises(RowsOutsideWindow, match=r"1 row\(s\) lie outside partition 2024-01-02"):
        h.write(spec, stray, partition=day_slice(DAY[1]))
    assert h.footprint(spec) == footprint


def test_a_timestamp_column_is_sliced_by_instant(h):
    spec = DatasetSpec(name="events", primary_key=("id",))
    at = [datetime(2024, 1, 1, 23, 59, tzinfo=UTC), datetime(2024, 1, 2, 0, 0, tzinfo=UTC)]
    frame = pl.DataFrame({"id": [1, 2], "ts": pl.Series(at, dtype=pl.Datetime("us", "UTC"))})
    h.write(spec, frame.head(1), partition=day_slice(DAY[0], "ts"))
    h.write(spec, frame.tail(1), partition=day_slice(DAY[1], "ts"))  # midnight opens day 2
    new = frame.tail(1).with_columns(id=pl.lit(3, dtype=pl.Int64))
    h.write(spec, new, partition=day_slice(DAY[1], "ts"))
    assert_same_multiset(h.rows(spec), pl.concat([frame.head(1), new]))


PERCENT_KEYS = ("100%_", "%s", "50%%", "%(k)s", "a%b%c")


def test_static_partition_keys_with_percent_signs_are_values(h):
    """A key is a value, never SQL text: `100%_`, `%s`, `%(k)s` are written, replaced and kept
    like any key (issue 42: the Postgres arm crashed on `only '%s', '%b', '%t' are allowed`)."""
    spec = DatasetSpec(name="shares", primary_key=("id",), strategy="sync")
    parts = {
        key: pl.DataFrame({"id": [i * 10, i * 10 + 1], "bucket": [key, key], "v": ["a", "b"]})
        for i, key in enumerate(PERCENT_KEYS)
    }
    for key, part in parts.items():
        h.write(spec, part, partition=PartitionSlice(key, (Equals("bucket", key),)))
    again = pl.DataFrame({"id": [1], "bucket": ["100%_"], "v": ["z"]})  # ids 0 and 1 of 100%_
    res = h.write(spec, again, partition=PartitionSlice("100%_", (Equals("bucket", "100%_"),)))
    kept = [part for key, part in parts.items() if key != "100%_"]
    assert_same_multiset(h.rows(spec), pl.concat([again, *kept]))
    assert (res.rows_inserted, res.rows_updated, res.rows_deleted) == (0, 1, 1)
