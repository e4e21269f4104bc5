"""What a window sensor cuts windows from (`window_sensor.WindowUpstream`): a source, or another
dataset (a chained delta dataset).

- A **source**: its high-water mark every tick — `max(watermark)` alone on Postgres (one index
  entry when the column is indexed), the current snapshot of an Iceberg table. Only when that
  moved is the source read whole (row count and high-water mark, recorded as an observation) and
  windows planned: an idle tick neither counts a large table's rows nor records an observation.
  The cut values are read with `ORDER BY ... LIMIT` in Postgres; from the watermark column of an
  Iceberg source.
- **Another dataset**: read from its authoritative arm, only after it has a new materialization
  whose run has finished (the version is the materialization's storage id), so an idle tick does
  not read it. When the upstream is itself a delta dataset, windows reach only as far as its
  unbroken stretch of applied windows (rows up to there are all written, whatever order its runs
  finished in); when the two watermark columns differ, only once every upstream window is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.contract.spec import DatasetSpec, WatermarkValue
from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.delta_sources import delta_source, delta_stats
from pipeline_output.dagster_layer.window_sensor import UpstreamRead, WindowUpstream
from pipeline_output.errors import DatasetNotWritten
from pipeline_output.services.reads import within
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import (
    SourceSpec,
    postgres_high_water_mark,
    postgres_watermark_values,
)


def source_upstream(
    spec: DatasetSpec, source: SourceSpec, *, runtime: Callable[[], Runtime]
) -> WindowUpstream:
    """A source asset's table as the upstream of `spec`'s window sensor, cut on the Delta's
    watermark column whatever the source declares (`delta_sources.delta_source`). Each read is
    also recorded as an observation of the source (its row count and high-water mark); its
    version is the high-water mark alone (Postgres) or the current snapshot (Iceberg), so a tick
    reads and records it only when that moved."""
    from pipeline_output.dagster_layer.source_assets import (
        scan_source,
        source_observation,
        source_snapshot,
    )

    assert spec.delta is not None
    column = spec.delta.watermark
    windowed = delta_source(spec, source)

    def read() -> UpstreamRead:
        # a watermark column the source lacks: one line naming the dataset, source and column
        rows, hwm = delta_stats(spec, source, runtime=runtime())
        observation = source_observation(
            dg.AssetKey(source.name),
            rows,
            hwm,
            watermark=column,
            versioned=source.watermark == column,
        )
        return UpstreamRead(hwm, observation)

    def values(window: Window, n: int) -> pl.Series:
        if source.kind == "postgres":
            url = source.url or runtime().pg_url
            return postgres_watermark_values(windowed, url, window, limit=n)
        frame = scan_source(windowed, window=window, runtime=runtime()).select(column).collect()
        return frame.get_column(column).sort().head(n)

    def version(context: dg.SensorEvaluationContext) -> str | None:
        """What moves when the source has new rows to plan (None: read it — an empty source,
        a table or column that does not exist, whose read then says why)."""
        if source.kind == "postgres":
            url = source.url or runtime().pg_url
            hwm = postgres_high_water_mark(windowed, url)
            return None if hwm is None else f"max:{hwm!r}"
        snapshot = source_snapshot(source, runtime=runtime())
        return None if snapshot is None else f"snapshot:{snapshot}"

    return WindowUpstream(name=source.name, read=read, values=values, version=version)


def _at_most(value: Any, bound: Any) -> Any:
    """min(value, bound), with a naive datetime bound read as UTC against an aware value."""
    if isinstance(value, datetime) and isinstance(bound, datetime):
        bound = Window(low=None, high=bound).aligned(aware=value.tzinfo is not None).high
    return bound if bound < value else value


def dataset_upstream(
    up: DatasetSpec,
    *,
    watermark: str,
    asset_key: dg.AssetKey,
    runtime: Callable[[], Runtime],
) -> WindowUpstream:
    """Another dataset (asset `asset_key`) as the upstream of a window sensor, cut on its column
    `watermark`."""

    def frame() -> pl.LazyFrame:
        publisher = runtime().publisher
        return publisher.scan(up, mode=publisher.resolve(up))

    def read() -> UpstreamRead:
        return UpstreamRead(high_water_mark(), None)

    def high_water_mark() -> WatermarkValue | None:
        try:
            value = frame().select(pl.col(watermark).max()).collect().item()
        except DatasetNotWritten:
            return None
        if value is None or up.delta is None:
            return value  # type: ignore[no-any-return]
        through, complete = runtime().windows.applied_through(up.name)
        if complete:
            return value  # type: ignore[no-any-return]
        if through is None or watermark != up.delta.watermark:
            return None
        return _at_most(value, through.high)  # type: ignore[no-any-return]

    def values(window: Window, n: int) -> pl.Series:
        read = within(frame(), window, watermark).select(watermark).collect()
        return read.get_column(watermark).sort().head(n)

    def version(context: dg.SensorEvaluationContext) -> str | None:
        records = context.instance.get_asset_records([asset_key])
        entry = records[0].asset_entry if records else None
        record = entry.last_materialization_record if entry is not None else None
        if record is None:
            return None  # never materialized through Dagster: read it every tick
        run = context.instance.get_run_by_id(record.run_id)
        if run is None or not run.is_finished:
            return None  # an audited write publishes when its run's checks pass
        return str(record.storage_id)

    return WindowUpstream(name=up.name, read=read, values=values, version=version)
