"""What a delta dataset reads its windows from, checked when it can be.

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
- The sensor's upstream over a source (`window_upstreams.source_upstream`) reads it through
  `delta_source` and `delta_stats`, so `pipeline-output plan` and the sensor see the same windows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import InvalidSpec
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import SourceSpec


def delta_source(spec: DatasetSpec, source: SourceSpec) -> SourceSpec:
    """`source` as `spec`'s windows read it: with the Delta's watermark column."""
    assert spec.delta is not None
    if source.watermark == spec.delta.watermark:
        return source
    return replace(source, watermark=spec.delta.watermark)


def delta_upstream_key(spec: DatasetSpec, asset: Any) -> Any:
    """The asset key `spec`'s Delta reads: the key of the input its `source` parameter names (an
    `ins=` key, with the upstream's `key_prefix`), else the asset named like the source."""
    import dagster as dg

    assert spec.delta is not None
    key = getattr(asset, "keys_by_input_name", {}).get(spec.delta.source)
    return key if key is not None else dg.AssetKey(spec.delta.source)


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
