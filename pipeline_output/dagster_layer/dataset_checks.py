"""The checks of a dataset, evaluated in the dataset's own step.

A `@dataset` or model node declares its `parity` (blocking) and `table_health` checks as checks of
its own asset (`declared_checks`: Dagster's `check_specs`) and can be subset (`can_subset=True`):
a run that materialises it evaluates the checks it selected right after the write, in the same
step (`evaluate_checks`) — no step, and no process under a multiprocess executor, per check. A run
that selects only checks (the `table_health` job, a check launched alone in the UI) runs the step
without writing. A failed blocking check fails the step once its events are recorded (Dagster's
rule for checks an asset yields): downstream assets in the run do not run, as with a check step.

`build_definitions` keeps the checks the location wants (`with_location_checks`: `parity` unless
`with_parity_checks=False`, `table_health` with maintenance, its thresholds on its declaration);
a dataset asset built by other code (its spec in its metadata) gets the same checks as
stand-alone check definitions instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.health_checks import (
    health_result,
    health_spec,
    table_health_check,
    thresholds_metadata,
    thresholds_of,
)
from pipeline_output.dagster_layer.keys import HEALTH_CHECK
from pipeline_output.dagster_layer.parity_checks import (
    PARITY,
    parity_check,
    parity_result,
    parity_spec,
)
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds

OWN_CHECKS = (PARITY, HEALTH_CHECK)


def declared_checks(spec: DatasetSpec, asset_key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    """The checks a dataset asset declares as its own (what `build_definitions` may narrow)."""
    return [parity_spec(spec, asset_key), health_spec(spec, asset_key)]


def evaluate_checks(context: dg.AssetExecutionContext, spec: DatasetSpec) -> Iterator[Any]:
    """The results of the dataset's own checks this run selected, after its write (or alone).
    `parity` yields nothing when there is nothing to compare (Dagster shows it skipped)."""
    for key in sorted(context.selected_asset_check_keys, key=lambda k: k.name):
        if key.name == PARITY:
            result = parity_result(context, spec, key.asset_key)
            if result is not None:
                yield result
        elif key.name == HEALTH_CHECK:
            declared = context.assets_def.get_spec_for_check_key(key)
            yield health_result(context, spec, key.asset_key, thresholds_of(declared))


def with_location_checks(
    asset: dg.AssetsDefinition,
    spec: DatasetSpec,
    *,
    parity: bool,
    thresholds: HealthThresholds | None,
) -> tuple[dg.AssetsDefinition, list[dg.AssetChecksDefinition]]:
    """`asset` declaring the checks this location wants — `parity` when `parity`, `table_health`
    warning past `thresholds` when given — and the stand-alone check definitions of those it
    does not declare itself (an asset built by other code)."""
    wanted = {PARITY} if parity else set()
    if thresholds is not None:
        wanted.add(HEALTH_CHECK)
    own = {k for k in asset.check_keys if k.asset_key == asset.key and k.name in OWN_CHECKS}
    keep = {k for k in own if k.name in wanted}
    if keep != own and asset.can_subset:
        asset = asset.subset_for(set(asset.keys), (asset.check_keys - own) | keep)
    health = next((k for k in keep if k.name == HEALTH_CHECK), None)
    if health is not None and thresholds is not None:
        declared = asset.get_spec_for_check_key(health)
        metadata = {**(declared.metadata or {}), **thresholds_metadata(thresholds)}
        asset = asset.with_attributes(metadata_by_key={health: metadata})
    standalone: list[dg.AssetChecksDefinition] = []
    missing = wanted - {k.name for k in keep}
    if PARITY in missing:
        standalone.append(parity_check(spec, asset.key))
    if HEALTH_CHECK in missing and thresholds is not None:
        standalone.append(table_health_check(spec, asset.key, thresholds))
    return asset, standalone
