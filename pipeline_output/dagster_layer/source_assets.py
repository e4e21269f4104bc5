"""Source assets: `postgres_source` and `iceberg_source`, observable (row count, high-water mark).

Reads go through the runtime of the code location (its `PipelineOutputResource`): a Postgres source
without `url=` is a table of its control plane, an Iceberg source a table of its catalog."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.keys import IO_MANAGER_KEY, SOURCE_METADATA_KEY
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.errors import BadInput
from pipeline_output.services.reads import scan_table, within
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import SourceSpec, postgres_stats, scan_postgres


def _url_for(source: SourceSpec, runtime: Runtime) -> str:
    return source.url or runtime.pg_url


def scan_source(source: SourceSpec, *, window: Window | None, runtime: Runtime) -> pl.LazyFrame:
    """The source as a LazyFrame (projection pushed down; the window as SQL WHERE / Iceberg row
    filter)."""
    if source.kind == "postgres":
        return scan_postgres(source, _url_for(source, runtime), window=window)
    table = runtime.catalog.load_table(str(source.identifier))
    # pinned to the table's current snapshot; projection and filters (the window is one: pyiceberg
    # prunes files by the watermark's column stats) become the pyiceberg scan's fields and filter
    frame = scan_table(table, name=f"iceberg:{source.display}")
    if window is None:
        return frame
    if source.watermark is None:
        raise BadInput(f"source {source.name!r}: a window read needs a watermark column")
    return within(frame, window, source.watermark)


def iceberg_window_count(source: SourceSpec, window: Window, *, runtime: Runtime) -> int:
    """How many rows of an Iceberg source lie in `window`."""
    from pipeline_output.stores.iceberg import window_filter

    assert source.watermark is not None
    table = runtime.catalog.load_table(str(source.identifier))
    row_filter = window_filter(source.watermark, window, schema=table.schema())
    return int(table.scan(row_filter=row_filter).count())


def source_stats(source: SourceSpec, *, runtime: Runtime) -> tuple[int, Any]:
    """(row count, high-water mark) of a source."""
    if source.kind == "postgres":
        return postgres_stats(source, _url_for(source, runtime))
    table = runtime.catalog.load_table(str(source.identifier))
    cols = [source.watermark] if source.watermark else []
    frame = pl.from_arrow(table.scan(selected_fields=tuple(cols) or ("*",)).to_arrow())
    assert isinstance(frame, pl.DataFrame)
    hwm = frame[source.watermark].max() if source.watermark and frame.height else None
    return frame.height, hwm


def _source_asset(source: SourceSpec, *, group: str | None) -> dg.SourceAsset:
    meta = {
        SOURCE_METADATA_KEY: json.dumps(dataclasses.asdict(source)),
        "source": f"{source.kind}: {source.display}",
    }
    if source.watermark:
        meta["watermark"] = source.watermark

    @dg.observable_source_asset(
        name=source.name,
        io_manager_key=IO_MANAGER_KEY,
        metadata=meta,
        group_name=group,
        description=source.description or f"{source.kind} table {source.display}",
        required_resource_keys={RESOURCE_KEY},
    )
    def _observe(context: dg.AssetExecutionContext) -> dg.ObserveResult:
        rows, hwm = source_stats(source, runtime=runtime_of(context))
        metadata: dict[str, Any] = {"dagster/row_count": rows}
        if hwm is not None:
            metadata["high_water_mark"] = str(hwm)
        return dg.ObserveResult(
            metadata=metadata,
            data_version=dg.DataVersion(f"{rows}:{hwm}"),
        )

    return _observe


def postgres_source(
    name: str,
    *,
    table: str,
    schema: str = "public",
    url: str | None = None,
    watermark: str | None = None,
    description: str | None = None,
    group: str | None = None,
) -> dg.SourceAsset:
    """A Postgres table as an observable source asset (the control-plane database by default)."""
    spec = SourceSpec(
        name=name,
        kind="postgres",
        table=table,
        schema=schema,
        url=url,
        watermark=watermark,
        description=description,
    )
    return _source_asset(spec, group=group)


def iceberg_source(
    name: str,
    *,
    identifier: str,
    watermark: str | None = None,
    description: str | None = None,
    group: str | None = None,
) -> dg.SourceAsset:
    """An existing Iceberg table (in the configured catalog) as an observable source asset."""
    spec = SourceSpec(
        name=name,
        kind="iceberg",
        identifier=identifier,
        watermark=watermark,
        description=description,
    )
    return _source_asset(spec, group=group)


def source_spec_of(asset: Any) -> SourceSpec | None:
    """The `SourceSpec` of a source asset built here (None otherwise)."""
    raw = None
    if isinstance(asset, dg.AssetsDefinition):
        for key in asset.keys:
            raw = raw or asset.metadata_by_key.get(key, {}).get(SOURCE_METADATA_KEY)
    else:
        raw = getattr(asset, "metadata", {}).get(SOURCE_METADATA_KEY)
    if raw is None:
        return None
    value = getattr(raw, "value", raw)
    data: dict[str, Any] = json.loads(value) if isinstance(value, str) else dict(value or {})
    return SourceSpec(**data)
