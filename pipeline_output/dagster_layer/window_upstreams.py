"""What a delta dataset's windows are cut from, in Dagster: a source asset or another dataset, as
the planner's upstream (`window_planning.WindowUpstream`) plus what the window sensor needs of it
(`SensorUpstream`: when to read it, what to record of a read).

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

Which column, checked when it can be:

- `Delta(watermark=...)` is the one column that cuts and reads a dataset's windows: the source's
  own `watermark=` (what its observation reports as high-water mark) may be left out, or name
  another column, and the dataset still works as declared (`delta_source`).
- The Delta's `source` names the compute's parameter; what it reads is that input's asset key
  (`delta_upstream_key`: an `ins=` key, an upstream's `key_prefix` included).
- When the code location loads (`check_delta_sources`, called by `build_definitions`): a Delta
  whose source is neither a source nor a dataset of the location fails in one line naming the
  dataset, instead of planning nothing (and, when a prefixed asset has that name, the `ins=`
  that reads it).
- At the first tick (what only the database knows, `delta_stats`): a watermark column the source
  table lacks fails in one line naming the dataset, the source and the column.
- The sensor and `pipeline-output plan` read a source through the same `source_upstream`, so they
  see the same windows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

import dagster as dg
import polars as pl

from pipeline_output.contract.spec import DatasetSpec, WatermarkValue
from pipeline_output.contract.windows import Window
from pipeline_output.errors import DatasetNotWritten, InvalidSpec
from pipeline_output.services.reads import within
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import (
    SourceSpec,
    postgres_high_water_mark,
    postgres_watermark_values,
)
from pipeline_output.services.window_planning import UpstreamRead, WindowUpstream


class SensorUpstream(WindowUpstream, Protocol):
    """An upstream as the window sensor reads it. `version(context)`: a token that changes when
    the upstream may have moved (None: always read it) — the high-water mark is only read when it
    changed. `observation(read)`: what to record of a read (a source's row count and high-water
    mark; None for a dataset, whose materializations say it)."""

    def version(self, context: dg.SensorEvaluationContext) -> str | None: ...

    def observation(self, read: UpstreamRead) -> dg.AssetObservation | None: ...


def delta_source(spec: DatasetSpec, source: SourceSpec) -> SourceSpec:
    """`source` as `spec`'s windows read it: with the Delta's watermark column."""
    assert spec.delta is not None
    if source.watermark == spec.delta.watermark:
        return source
    return replace(source, watermark=spec.delta.watermark)


def delta_stats(spec: DatasetSpec, source: SourceSpec, *, runtime: Runtime) -> tuple[int, Any]:
    """(row count, high-water mark of the Delta's watermark) of `spec`'s source; a watermark
    column the source lacks fails naming the dataset, the source and the column."""
    from pipeline_output.dagster_layer.source_assets import source_stats

    assert spec.delta is not None
    windowed = delta_source(spec, source)
    try:
        return source_stats(windowed, runtime=runtime)
    except InvalidSpec as exc:
        raise InvalidSpec(
            f"dataset {spec.name!r}: Delta(watermark={spec.delta.watermark!r}) over source "
            f"{source.name!r}: {exc}"
        ) from exc


@dataclass(frozen=True)
class _SourceUpstream:
    spec: DatasetSpec
    source: SourceSpec
    runtime: Callable[[], Runtime]

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def windowed(self) -> SourceSpec:
        return delta_source(self.spec, self.source)

    def read(self) -> UpstreamRead:
        # a watermark column the source lacks: one line naming the dataset, source and column
        rows, hwm = delta_stats(self.spec, self.source, runtime=self.runtime())
        return UpstreamRead(hwm, rows)

    def observation(self, read: UpstreamRead) -> dg.AssetObservation | None:
        from pipeline_output.dagster_layer.source_assets import source_observation

        assert self.spec.delta is not None and read.rows is not None
        column = self.spec.delta.watermark
        return source_observation(
            dg.AssetKey(self.source.name),
            read.rows,
            read.high_water_mark,
            watermark=column,
            versioned=self.source.watermark == column,
        )

    def values(self, window: Window, n: int) -> pl.Series:
        from pipeline_output.dagster_layer.source_assets import scan_source

        windowed = self.windowed
        column = str(windowed.watermark)
        if windowed.kind == "postgres":
            url = windowed.url or self.runtime().pg_url
            return postgres_watermark_values(windowed, url, window, limit=n)
        frame = scan_source(windowed, window=window, runtime=self.runtime())
        return frame.select(column).collect().get_column(column).sort().head(n)

    def count(self, window: Window) -> int | None:
        from pipeline_output.dagster_layer.source_assets import window_count

        return window_count(self.windowed, window, runtime=self.runtime())

    def version(self, context: dg.SensorEvaluationContext) -> str | None:
        """What moves when the source has new rows to plan (None: read it — an empty source,
        a table or column that does not exist, whose read then says why)."""
        from pipeline_output.dagster_layer.source_assets import source_snapshot

        windowed = self.windowed
        if windowed.kind == "postgres":
            url = windowed.url or self.runtime().pg_url
            hwm = postgres_high_water_mark(windowed, url)
            return None if hwm is None else f"max:{hwm!r}"
        snapshot = source_snapshot(windowed, runtime=self.runtime())
        return None if snapshot is None else f"snapshot:{snapshot}"


def source_upstream(
    spec: DatasetSpec, source: SourceSpec, *, runtime: Callable[[], Runtime]
) -> SensorUpstream:
    """A source asset's table as the upstream of `spec`'s windows, cut on the Delta's watermark
    column whatever the source declares (`delta_source`). Each read the sensor makes is also
    recorded as an observation of the source (its row count and high-water mark); its version is
    the high-water mark alone (Postgres) or the current snapshot (Iceberg), so a tick reads and
    records it only when that moved."""
    assert spec.delta is not None
    return _SourceUpstream(spec, source, runtime)


def _at_most(value: Any, bound: Any) -> Any:
    """min(value, bound), with a naive datetime bound read as UTC against an aware value."""
    if isinstance(value, datetime) and isinstance(bound, datetime):
        bound = Window(low=None, high=bound).aligned(aware=value.tzinfo is not None).high
    return bound if bound < value else value


@dataclass(frozen=True)
class _DatasetUpstream:
    up: DatasetSpec
    watermark: str
    asset_key: dg.AssetKey
    runtime: Callable[[], Runtime]

    @property
    def name(self) -> str:
        return self.up.name

    def _frame(self) -> pl.LazyFrame:
        publisher = self.runtime().publisher
        return publisher.scan(self.up, mode=publisher.resolve(self.up))

    def read(self) -> UpstreamRead:
        return UpstreamRead(self._high_water_mark())

    def observation(self, read: UpstreamRead) -> dg.AssetObservation | None:
        return None  # its materializations say what it holds

    def _high_water_mark(self) -> WatermarkValue | None:
        up, watermark = self.up, self.watermark
        try:
            value = self._frame().select(pl.col(watermark).max()).collect().item()
        except DatasetNotWritten:
            return None
        if value is None or up.delta is None:
            return value  # type: ignore[no-any-return]
        through, complete = self.runtime().windows.applied_through(up.name)
        if complete:
            return value  # type: ignore[no-any-return]
        if through is None or watermark != up.delta.watermark:
            return None
        return _at_most(value, through.high)  # type: ignore[no-any-return]

    def values(self, window: Window, n: int) -> pl.Series:
        read = within(self._frame(), window, self.watermark).select(self.watermark).collect()
        return read.get_column(self.watermark).sort().head(n)

    def count(self, window: Window) -> int | None:
        return None  # a delta over another dataset has no source to count in

    def version(self, context: dg.SensorEvaluationContext) -> str | None:
        records = context.instance.get_asset_records([self.asset_key])
        entry = records[0].asset_entry if records else None
        record = entry.last_materialization_record if entry is not None else None
        if record is None:
            return None  # never materialized through Dagster: read it every tick
        run = context.instance.get_run_by_id(record.run_id)
        if run is None or not run.is_finished:
            return None  # an audited write publishes when its run's checks pass
        return str(record.storage_id)


def dataset_upstream(
    up: DatasetSpec,
    *,
    watermark: str,
    asset_key: dg.AssetKey,
    runtime: Callable[[], Runtime],
) -> SensorUpstream:
    """Another dataset (asset `asset_key`) as the upstream of a window sensor, cut on its column
    `watermark`."""
    return _DatasetUpstream(up, watermark, asset_key, runtime)


def delta_upstream_key(spec: DatasetSpec, asset: Any) -> Any:
    """The asset key `spec`'s Delta reads: the key of the input its `source` parameter names (an
    `ins=` key, with the upstream's `key_prefix`), else the asset named like the source."""
    assert spec.delta is not None
    key = getattr(asset, "keys_by_input_name", {}).get(spec.delta.source)
    return key if key is not None else dg.AssetKey(spec.delta.source)


def check_delta_sources(
    datasets: Iterable[tuple[DatasetSpec, Any]], defined: Iterable[Any]
) -> None:
    """A delta dataset (spec, asset) that reads its Delta's source as an input (`@dataset`) finds
    it among the `defined` assets and sources of the code location (else `InvalidSpec`)."""
    known = {key for item in defined for key in _keys(item)}
    for spec, asset in datasets:
        if spec.delta is None:
            continue
        source = delta_upstream_key(spec, asset)
        reads = {up for deps in asset.asset_deps.values() for up in deps}
        if source not in reads or source in known:
            continue  # an asset of the user's own that reads no input, or a defined one
        others = known - set(asset.keys)
        choices = ", ".join(sorted(k.to_user_string() for k in others))
        prefixed = sorted(k.path for k in others if k.path[-1] == source.path[-1])
        hint = "".join(
            f"; {dg.AssetKey(path).to_user_string()} has a key_prefix: read it with "
            f"ins={{{spec.delta.source!r}: dg.AssetKey({path!r})}}"
            for path in prefixed[:1]
        )
        raise InvalidSpec(
            f"dataset {spec.name!r}: Delta(source={spec.delta.source!r}) is neither a source nor "
            "a dataset of this code location (pass it to build_definitions(sources=[...])); its "
            f"sources and datasets: {choices or '(none)'}{hint}"
        )


def _keys(item: Any) -> list[Any]:
    keys = getattr(item, "keys", None)
    if keys is not None and not callable(keys):
        return list(keys)
    key = getattr(item, "key", None)
    return [key] if key is not None else []
