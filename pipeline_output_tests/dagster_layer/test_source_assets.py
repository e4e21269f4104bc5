"""What a source asset's observation and a window's row count read of an Iceberg source: its row
count, its high-water mark and the rows inside a window, on a table that carries positional delete
files (as one fed by upserts does) — checked against pyiceberg's own read of the table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from pipeline_output import DatasetSpec, Window
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.dagster_layer.source_assets import iceberg_window_count, source_stats
from pipeline_output.errors import InvalidSpec
from pipeline_output.services.sources import SourceSpec


def rows(first: int, last: int, *, v: str = "v") -> pl.DataFrame:
    seq = pl.int_range(first, last + 1, eager=True)
    return pl.DataFrame(
        {
            "id": seq,
            "v": [f"{v}{s}" for s in seq],
            "seq": seq,
            "at": [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=s) for s in seq],
        }
    )


@pytest.fixture
def upserted(env: str) -> str:
    """`up`: 3 appends of 100 rows (one data file each), then an upsert of every 10th row and 20
    new ones, which the store writes merge-on-read (a delete file per data file). Its identifier."""
    store = get_runtime().iceberg
    plain = DatasetSpec(name="up", strategy="append_always")
    for first in (1, 101, 201):
        store.write(plain, rows(first, first + 99))
    keyed = DatasetSpec(
        name="up",
        primary_key=("id",),
        strategy="snapshot_replace",
        write_strategy_hint="merge-on-read",
    )
    changed = pl.concat([rows(1, 300).filter(pl.col("id") % 10 == 0), rows(301, 320)])
    result = store.write(keyed, changed.with_columns(pl.col("v") + "!"))
    assert result.files_merged_on_read > 0, "the upsert wrote positional delete files"
    return store.table_name("up")


def oracle(identifier: str) -> pl.DataFrame:
    """The table as pyiceberg reads it (its own reader, delete files applied)."""
    frame = pl.from_arrow(get_runtime().catalog.load_table(identifier).scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


@pytest.mark.parametrize("watermark", ["seq", "at", None])
def test_the_row_count_and_high_water_mark_of_an_iceberg_source_count_deleted_rows_once(
    upserted: str, watermark: str | None
) -> None:
    source = SourceSpec(name="up_src", kind="iceberg", identifier=upserted, watermark=watermark)
    expected = oracle(upserted)
    assert expected.height == 320
    hwm = expected[watermark].max() if watermark else None
    assert source_stats(source, runtime=get_runtime()) == (expected.height, hwm)


@pytest.mark.parametrize("window", [Window(None, 50), Window(50, 250), Window(250, 1000)])
def test_a_window_count_of_an_iceberg_source_is_the_rows_inside_it(
    upserted: str, window: Window
) -> None:
    source = SourceSpec(name="up_src", kind="iceberg", identifier=upserted, watermark="seq")
    inside = oracle(upserted).filter(window.contains("seq", pl.Int64))
    assert iceberg_window_count(source, window, runtime=get_runtime()) == inside.height


def test_a_watermark_column_an_iceberg_source_lacks_is_named(upserted: str) -> None:
    source = SourceSpec(name="up_src", kind="iceberg", identifier=upserted, watermark="ts")
    with pytest.raises(InvalidSpec, match=r"no watermark column 'ts'.*seq"):
        source_stats(source, runtime=get_runtime())
