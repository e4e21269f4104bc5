"""Dagster-partitioned datasets in the model-based suite (issue 34), drawn beside delta datasets.

A Dagster-partitioned dataset has no `Delta`; its rows carry partition columns derived from the
row's id (and whether it moved, so a moved key changes partition): `day` (a date, ten ids a day),
`at` (a `timestamptz`, one id an hour, across Europe's DST change) and `region` (`eu`/`us`/`apac`).
It is partitioned by a real Dagster definition — daily, hourly in Europe/Berlin, static, or daily by
region — and a drawn partition key becomes the store's slice through `slice_for` (what `@dataset`
does). The model selects the same rows with a polars filter written here from Dagster's own time
window and key, never from `contract/slices.py`.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.dagster_layer.partitioned import slice_for

KINDS = ["daily", "hourly", "static", "multi"]
REGIONS = ["eu", "us", "apac"]
FIRST_DAY = date(2026, 3, 28)
FIRST_HOUR = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)  # Berlin leaves CET 27 hours later
MOVE = 7  # as the model's: a moved row's position is 7 later

_DAILY = dg.DailyPartitionsDefinition(start_date="2026-03-28", end_date="2026-04-02")
_REGIONS = dg.StaticPartitionsDefinition(REGIONS)
DEFINITIONS: dict[str, Any] = {
    "daily": _DAILY,
    "hourly": dg.HourlyPartitionsDefinition(
        start_date="2026-03-28-23:00", end_date="2026-03-30-14:00", timezone="Europe/Berlin"
    ),
    "static": _REGIONS,
    "multi": dg.MultiPartitionsDefinition({"date": _DAILY, "region": _REGIONS}),
}
COLUMNS: dict[str, dict[str, str]] = {
    "daily": {"": "day"},
    "hourly": {"": "at"},
    "static": {"": "region"},
    "multi": {"date": "day", "region": "region"},
}
# an Iceberg partition spec matching the Dagster partitions (its replaces drop whole files)
MATCHING_SPEC: dict[str, tuple[str, ...]] = {
    "daily": ("day(day)",),
    "hourly": ("hour(at)",),
    "static": ("region",),
    "multi": ("day(day)", "region"),
}


def partition_values(rows: list[Any]) -> dict[str, pl.Series]:
    """The partition columns of the model's rows (`Row.id`, `Row.moved`)."""
    at = [r.id + (MOVE if r.moved else 0) for r in rows]
    return {
        "day": pl.Series([FIRST_DAY + timedelta(days=p // 10) for p in at], dtype=pl.Date),
        "at": pl.Series(
            [FIRST_HOUR + timedelta(hours=p) for p in at], dtype=pl.Datetime("us", "UTC")
        ),
        "region": pl.Series([REGIONS[p % 3] for p in at], dtype=pl.String),
    }


@cache
def keys(kind: str) -> tuple[str, ...]:
    return tuple(DEFINITIONS[kind].get_partition_keys())


def drawn(kind: str, index: int) -> tuple[PartitionSlice, pl.Expr]:
    """Partition number `index` (modulo) of `kind`: the store's slice, and the model's filter."""
    key = keys(kind)[index % len(keys(kind))]
    definition = DEFINITIONS[kind]
    return slice_for(definition, COLUMNS[kind], key), _model_filter(kind, key)


def _model_filter(kind: str, key: str) -> pl.Expr:
    if kind == "multi":
        day, region = key.split("|")
        return _model_filter("daily", day) & (pl.col("region") == region)
    if kind == "static":
        return pl.col("region") == key
    window = DEFINITIONS[kind].time_window_for_partition_key(key)
    if kind == "daily":  # UTC midnights: the window's dates
        return (pl.col("day") >= window.start.date()) & (pl.col("day") < window.end.date())
    start, end = window.start.astimezone(UTC), window.end.astimezone(UTC)
    return (pl.col("at") >= pl.lit(start)) & (pl.col("at") < pl.lit(end))
