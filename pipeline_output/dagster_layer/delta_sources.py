"""What a delta dataset reads its windows from, checked when it can be.

- `Delta(watermark=...)` is the one column that cuts and reads a dataset's windows: the source's
  own `watermark=` (what its observation reports as high-water mark) may be left out, or name
  another column, and the dataset still works as declared (`delta_source`).
- When the code location loads (`check_delta_sources`, called by `build_definitions`): a Delta
  whose source is neither a source nor a dataset of the location fails in one line naming the
  dataset, instead of planning nothing.
- At the first tick (what only the database knows, `delta_stats`): a watermark column the source
  table lacks fails in one line naming the dataset, the source and the column.
- `windows_to_plan`: the windows a sensor tick plans now (the sensor and `pipeline-output plan`,
  which shows them without recording them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.errors import InvalidSpec
from pipeline_output.ledger.window_ledger import WindowRow
from pipeline_output.services.sources import SourceSpec
from pipeline_output.services.window_planning import cut_points_of, next_windows


def delta_source(spec: DatasetSpec, source: SourceSpec) -> SourceSpec:
    """`source` as `spec`'s windows read it: with the Delta's watermark column."""
    assert spec.delta is not None
    if source.watermark == spec.delta.watermark:
        return source
    return replace(source, watermark=spec.delta.watermark)


def check_delta_sources(
    datasets: Iterable[tuple[DatasetSpec, Any]], defined: Iterable[Any]
) -> None:
    """A delta dataset (spec, asset) that reads its Delta's source as an input (`@dataset`) finds
    it among the `defined` assets and sources of the code location (else `InvalidSpec`)."""
    import dagster as dg

    known = {key for item in defined for key in _keys(item)}
    for spec, asset in datasets:
        if spec.delta is None:
            continue
        source = dg.AssetKey(spec.delta.source)
        reads = {up for deps in asset.asset_deps.values() for up in deps}
        if source not in reads or source in known:
            continue  # an asset of the user's own that reads no input, or a defined one
        choices = ", ".join(sorted(k.to_user_string() for k in known - set(asset.keys)))
        raise InvalidSpec(
            f"dataset {spec.name!r}: Delta(source={spec.delta.source!r}) is neither a source nor "
            "a dataset of this code location (pass it to build_definitions(sources=[...])); its "
            f"sources and datasets: {choices or '(none)'}"
        )


def _keys(item: Any) -> list[Any]:
    keys = getattr(item, "keys", None)
    if keys is not None and not callable(keys):
        return list(keys)
    key = getattr(item, "key", None)
    return [key] if key is not None else []


def delta_stats(spec: DatasetSpec, source: SourceSpec) -> tuple[int, Any]:
    """(row count, high-water mark of the Delta's watermark) of `spec`'s source; a watermark
    column the source lacks fails naming the dataset, the source and the column."""
    from pipeline_output.dagster_layer.source_assets import source_stats

    assert spec.delta is not None
    windowed = delta_source(spec, source)
    try:
        return source_stats(windowed)
    except InvalidSpec as exc:
        raise InvalidSpec(
            f"dataset {spec.name!r}: Delta(watermark={spec.delta.watermark!r}) over source "
            f"{source.name!r}: {exc}"
        ) from exc


def windows_to_plan(
    spec: DatasetSpec, source: SourceSpec, *, last: WindowRow | None
) -> tuple[int, Any, list[Window]]:
    """What a window sensor of `spec` plans now after the ledger's `last` window: (the source's
    row count, its high-water mark, the new windows — cut every `Delta.max_rows` rows)."""
    from pipeline_output.dagster_layer.source_assets import scan_source

    assert spec.delta is not None
    delta = spec.delta
    windowed = delta_source(spec, source)
    rows, hwm = delta_stats(spec, source)
    cut = None
    if delta.max_rows:
        max_rows = delta.max_rows

        def cut(low: Any, high: Any) -> list[Any]:
            values = (
                scan_source(windowed, window=Window(low=low, high=high))
                .select(delta.watermark)
                .collect()
                .get_column(delta.watermark)
            )
            return cut_points_of(values, low=low, max_rows=max_rows)

    planned = next_windows(
        last_high=last.window.high if last else None,
        first=last is None,
        start=delta.start,
        high_water_mark=hwm,
        cut_points=cut,
    )
    return rows, hwm, planned
