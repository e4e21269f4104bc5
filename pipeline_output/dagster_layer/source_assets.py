"""Source assets: `postgres_source` and `iceberg_source`, observable (row count, high-water mark).

Each is an observable asset (`asset_params.define_observation`) with Dagster's own asset options
(`group`, `pool`, …: `asset_params.AssetOptions`) and its kind (`postgres`, `iceberg`); one declared without `group=` joins the group of
the datasets that read it (`grouped_sources`, applied by `build_definitions`). A delta dataset's
window sensor records what it sees of its source on each tick where the source's high-water mark
moved (`source_observation`), so the source is observed without anyone pressing "Observe".

Reads go through the runtime of the code location (its `PipelineOutputResource`): a Postgres source
without `url=` is a table of its control plane, an Iceberg source a table of its catalog.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Unpack

import dagster as dg
import polars as pl

from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.asset_params import (
    AssetOptions,
    AssetOptionsKwargs,
    asset_options,
    asset_params,
    define_observation,
    remember_build,
)
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.keys import IO_MANAGER_KEY, SOURCE_METADATA_KEY
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.errors import BadInput, InvalidSpec
from pipeline_output.services.reads import scan_table, within
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import (
    SourceSpec,
    postgres_stats,
    scan_postgres,
)

DATA_VERSION_TAG = "dagster/data_version"  # dagster's own tag names (data_version.py)
DATA_VERSION_USER_TAG = "dagster/data_version_is_user_provided"
DEFAULT_SOURCE_GROUP = "sources"


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
    """How many rows of an Iceberg source lie in `window`: polars' native scan of the watermark
    column alone, the window pushed to the files' statistics and row groups (delete files
    applied)."""
    assert source.watermark is not None
    frame = scan_source(source, window=window, runtime=runtime)
    return int(frame.select(pl.len()).collect().item())


def source_snapshot(source: SourceSpec, *, runtime: Runtime) -> int | None:
    """The current snapshot id of an Iceberg source's table (None: no snapshot, or no table —
    `source_stats` says so): a metadata read, no data file opened."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = runtime.catalog.load_table(str(source.identifier))
    except NoSuchTableError:
        return None
    return table.metadata.current_snapshot_id


def source_stats(source: SourceSpec, *, runtime: Runtime) -> tuple[int, Any]:
    """(row count, high-water mark) of a source: one `count(*), max(watermark)` query on
    Postgres; on Iceberg, polars' native scan of the watermark column."""
    if source.kind == "postgres":
        return postgres_stats(source, _url_for(source, runtime))
    table = runtime.catalog.load_table(str(source.identifier))
    names = [field.name for field in table.schema().fields]
    if source.watermark and source.watermark not in names:
        raise InvalidSpec(
            f"{source.display} has no watermark column {source.watermark!r}; its columns: "
            f"{', '.join(names)}"
        )
    # polars' native scan: the watermark column alone (no column for the count), delete files
    # applied — not pyiceberg's reader of whole files
    frame = scan_table(table, name=f"iceberg:{source.display}")
    if source.watermark is None:
        return int(frame.select(pl.len()).collect().item()), None
    rows, hwm = frame.select(pl.len(), pl.col(source.watermark).max()).collect().row(0)
    return int(rows), hwm


def source_observation(
    key: dg.AssetKey, rows: int, hwm: Any, *, watermark: str | None, versioned: bool = True
) -> dg.AssetObservation:
    """What one look at a source found (the window sensor records one on each tick its
    high-water mark moved): its row count and the high-water mark of `watermark`; `versioned`:
    the observation sets the source's data version (`rows:hwm`, as its observe function does)."""
    tags = {DATA_VERSION_TAG: f"{rows}:{hwm}", DATA_VERSION_USER_TAG: "true"} if versioned else None
    metadata = _observed(rows, hwm, watermark=watermark)
    return dg.AssetObservation(asset_key=key, metadata=metadata, tags=tags)


def _observed(rows: int, hwm: Any, *, watermark: str | None) -> dict[str, Any]:
    """The metadata of one look at a source (the sensor's observation and the observe function's
    result alike): row count, watermark column, high-water mark."""
    metadata: dict[str, Any] = {"dagster/row_count": rows}
    if watermark:
        metadata["watermark"] = watermark
    if hwm is not None:
        metadata["high_water_mark"] = str(hwm)
    return metadata


def _source_asset(source: SourceSpec, options: AssetOptionsKwargs) -> dg.AssetsDefinition:
    """The observable asset of `source` with Dagster's own `options` (remembered: the Component
    builds it again with its defaults); `options`' description is the source's."""
    given = asset_options(f"{source.kind}_source", **options)
    source = dataclasses.replace(source, description=given.description)

    def observe(context: dg.AssetExecutionContext) -> dg.ObserveResult:
        with failing_as_dagster(source.name):
            rows, hwm = source_stats(source, runtime=runtime_of(context))
        return dg.ObserveResult(
            metadata=_observed(rows, hwm, watermark=source.watermark),
            data_version=dg.DataVersion(f"{rows}:{hwm}"),
        )

    def build(chosen: AssetOptions) -> dg.AssetsDefinition:
        label = f"source {source.name!r}"
        passed = asset_params(chosen, label=label, kinds={source.kind})  # the UI's kind badge
        passed.setdefault("description", f"{source.kind} table {source.display}")
        meta = {
            **passed.pop("metadata", {}),
            SOURCE_METADATA_KEY: json.dumps(dataclasses.asdict(source)),
            "source": f"{source.kind}: {source.display}",
        }
        if source.watermark:
            meta["watermark"] = source.watermark
        return define_observation(
            observe,
            key=chosen.key(source.name),
            label=label,
            io_manager_key=IO_MANAGER_KEY,
            required_resource_keys={RESOURCE_KEY},
            metadata=meta,
            **passed,
        )

    asset = build(given)
    remember_build(asset, given, build)
    return asset


def postgres_source(
    name: str,
    *,
    table: str,
    schema: str = "public",
    url: str | None = None,
    watermark: str | None = None,
    **options: Unpack[AssetOptionsKwargs],
) -> dg.AssetsDefinition:
    """A Postgres table (the control-plane database without `url`) as an observable source
    asset; `watermark`: its high-water-mark column; `options`: Dagster's own asset options (as
    the module docstring says)."""
    spec = SourceSpec(
        name=name,
        kind="postgres",
        table=table,
        schema=schema,
        url=url,
        watermark=watermark,
    )
    return _source_asset(spec, options)


def iceberg_source(
    name: str,
    *,
    identifier: str,
    watermark: str | None = None,
    **options: Unpack[AssetOptionsKwargs],
) -> dg.AssetsDefinition:
    """An existing Iceberg table of the configured catalog as an observable source asset; its
    `watermark` and `options` as `postgres_source`'s."""
    spec = SourceSpec(name=name, kind="iceberg", identifier=identifier, watermark=watermark)
    return _source_asset(spec, options)


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


def grouped_sources(sources: Sequence[Any], readers: Sequence[Any]) -> list[Any]:
    """`sources` with a group each: one declared with `group=` keeps it; another joins the group
    of the datasets that read it when they share one, else `sources` (never Dagster's
    `default`)."""
    groups: dict[dg.AssetKey, set[str]] = {}
    for asset in readers:
        if not isinstance(asset, dg.AssetsDefinition):
            continue
        for key, group in asset.group_names_by_key.items():
            for upstream in asset.asset_deps.get(key, ()):
                groups.setdefault(upstream, set()).add(group)
    out = []
    for source in sources:
        if _group_of(source) == "default":
            found = groups.get(source.key, set())
            group = next(iter(found)) if len(found) == 1 else DEFAULT_SOURCE_GROUP
            if isinstance(source, dg.SourceAsset):
                source = source.with_attributes(group_name=group)
            else:
                source = source.with_attributes(group_names_by_key={source.key: group})
        out.append(source)
    return out


def _group_of(source: Any) -> str | None:
    """The group of a source asset (an `AssetsDefinition` of one key, or a `SourceAsset`)."""
    if isinstance(source, dg.AssetsDefinition) and len(source.keys) == 1:
        return source.group_names_by_key.get(source.key)
    return source.group_name if isinstance(source, dg.SourceAsset) else None


def window_count(source: SourceSpec, window: Window, *, runtime: Runtime) -> int:
    """How many rows of `source` lie in `window` (of its watermark column)."""
    if source.kind == "postgres":
        from pipeline_output.services.sources import postgres_window_count

        return postgres_window_count(source, _url_for(source, runtime), window)
    return iceberg_window_count(source, window, runtime=runtime)
