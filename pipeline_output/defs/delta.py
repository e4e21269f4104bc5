"""Delta datasets in Dagster: window partitions, the window-planning sensor, windowed source readers.

One `DynamicPartitionsDefinition` per delta dataset (`<dataset>__windows`), keys `low..high` from
`Window.to_key`. The sensor polls the source's high-water mark, records the next window(s) in the
ledger, adds their partitions and requests one run per window in the same evaluation; failed windows
are re-requested (a new run key per attempt) and planned windows whose partition is missing (a
crash between planning and adding) are added on the next tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.delta import cut_points_of, next_windows
from pipeline_output.spec import DatasetSpec
from pipeline_output.windows import Window

DEFAULT_SENSOR_INTERVAL_S = 30


def partitions_name(dataset: str) -> str:
    """The dynamic partitions definition name of a delta dataset."""
    return f"{dataset}__windows"


def window_partitions(spec: DatasetSpec) -> dg.DynamicPartitionsDefinition:
    """The partitions definition of a delta dataset."""
    return dg.DynamicPartitionsDefinition(name=partitions_name(spec.name))


@dataclass(frozen=True)
class WindowedOutput:
    """A delta dataset's output: per window (in order) a zero-argument compute, applied one by one."""

    items: tuple[tuple[Window, Any, Window], ...]  # (window, compute thunk, write window)
    restate: bool = False


class WindowReader:
    """What a delta dataset's compute receives for its delta source: read it window by window."""

    def __init__(self, name: str, scan: Any) -> None:
        self.name = name
        self._scan = scan

    def scan(self, window: Window | None) -> pl.LazyFrame:
        """The source rows with `low < watermark <= high` (pushed down to the source)."""
        frame: pl.LazyFrame = self._scan(window)
        return frame


def build_window_sensor(
    spec: DatasetSpec,
    *,
    source: Any,
    asset_key: dg.AssetKey,
    minimum_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_S,
) -> dg.SensorDefinition:
    """The sensor that plans `spec`'s windows from `source`'s high-water mark."""
    assert spec.delta is not None
    delta = spec.delta
    partitions = window_partitions(spec)

    @dg.sensor(
        name=f"{spec.name}__window_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        asset_selection=dg.AssetSelection.assets(asset_key),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Plans delta windows of {spec.name} over {delta.source}.{delta.watermark}",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        from pipeline_output.defs.runtime import get_runtime
        from pipeline_output.defs.sources import source_stats

        runtime = get_runtime()
        ledger = runtime.windows
        _, hwm = source_stats(source)
        last = ledger.last(spec.name)
        cut = None
        if delta.max_rows:
            max_rows = delta.max_rows

            def cut(low: Any, high: Any) -> list[Any]:
                from pipeline_output.defs.sources import scan_source

                window = Window(low=low, high=high)
                values = (
                    scan_source(source, window=window)
                    .select(str(source.watermark))
                    .collect()
                    .get_column(str(source.watermark))
                )
                return cut_points_of(values, low=low, max_rows=max_rows)

        planned = next_windows(
            last_high=last.window.high if last else None,
            first=last is None,
            start=delta.start,
            high_water_mark=hwm,
            cut_points=cut,
        )
        ledger.plan(spec.name, planned)
        rows = ledger.windows(spec.name)
        existing = set(context.instance.get_dynamic_partitions(str(partitions.name)))
        to_add = [w.partition_key for w in rows if w.partition_key not in existing]
        requests = [
            dg.RunRequest(
                partition_key=w.partition_key,
                run_key=f"{spec.name}:{w.partition_key}:{w.attempts}",
                asset_selection=[asset_key],
                # lets a deployment's QueuedRunCoordinator limit runs per dataset (deploy/)
                tags={"pipeline-output/dataset": spec.name},
            )
            for w in rows
            if w.state in ("planned", "failed")
        ]
        return dg.SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=[partitions.build_add_request(to_add)] if to_add else [],
            cursor=str(hwm) if hwm is not None else None,
        )

    return _sensor
