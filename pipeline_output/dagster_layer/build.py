"""`build_definitions`: a user's whole `definitions.py` in a few lines.

Wires the IO manager, the datasets and sources, one job over every dataset, and whatever sensors,
schedules, checks and extra resources are passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from pipeline_output.dagster_layer.audit_hooks import with_audit_hooks
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.delta_assets import (
    DEFAULT_SENSOR_INTERVAL_S,
    build_window_sensor,
)
from pipeline_output.dagster_layer.io_manager import DatasetIOManager
from pipeline_output.dagster_layer.keys import ALL_DATASETS_JOB, IO_MANAGER_KEY
from pipeline_output.dagster_layer.parity_checks import parity_check
from pipeline_output.dagster_layer.source_assets import source_spec_of
from pipeline_output.stores.iceberg.properties import ICEBERG_CAPABILITIES
from pipeline_output.stores.postgres.types import LEGACY_CAPABILITIES
from pipeline_output.stores.protocol import check_specs


def build_definitions(
    *,
    datasets: Sequence[dg.AssetsDefinition] = (),
    sources: Sequence[Any] = (),
    assets: Sequence[Any] = (),
    sensors: Sequence[dg.SensorDefinition] = (),
    schedules: Sequence[Any] = (),
    asset_checks: Sequence[dg.AssetChecksDefinition] = (),
    jobs: Sequence[Any] = (),
    resources: Mapping[str, Any] | None = None,
    executor: Any = None,
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_S,
    with_parity_checks: bool = True,
) -> dg.Definitions:
    """Definitions for pipeline-output datasets and their sources.

    Every delta dataset gets its window sensor (`<dataset>__window_sensor`, polling every
    `sensor_interval_seconds`); `all_datasets` is a job over the unpartitioned datasets. Each
    dataset is checked against the declared capabilities of every arm it may be written to
    (`stores.protocol.check_specs`): a name the legacy arm cannot hold fails here, at load.
    """
    all_resources: dict[str, Any] = {IO_MANAGER_KEY: DatasetIOManager()}
    all_resources.update(resources or {})
    specs = [
        s
        for a in [*datasets, *assets]
        if isinstance(a, dg.AssetsDefinition) and (s := spec_of(a)) is not None
    ]
    check_specs(specs, {"pg": LEGACY_CAPABILITIES, "iceberg": ICEBERG_CAPABILITIES})
    source_specs = {s.name: s for s in (source_spec_of(a) for a in sources) if s is not None}
    all_sensors = list(sensors)
    dataset_keys: list[dg.AssetKey] = []
    all_checks = list(asset_checks)
    for asset in [*datasets, *assets]:
        spec = spec_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
        if spec is not None and with_parity_checks:
            all_checks.append(parity_check(spec, asset.key))
    # write-audit-publish: the dataset steps and the checks on them publish (`audit_hooks`)
    by_key = {
        key: spec
        for a in [*datasets, *assets]
        if isinstance(a, dg.AssetsDefinition) and (spec := spec_of(a)) is not None
        for key in a.keys
    }
    datasets = [with_audit_hooks(a, by_key) for a in datasets]
    assets = [
        with_audit_hooks(a, by_key) if isinstance(a, dg.AssetsDefinition) else a for a in assets
    ]
    all_checks = [with_audit_hooks(c, by_key) for c in all_checks]  # type: ignore[misc]
    for asset in datasets:
        spec = spec_of(asset)
        if spec is None or spec.delta is None:
            dataset_keys.extend(asset.keys)
            continue
        up = source_specs.get(spec.delta.source)
        if up is None:
            continue  # a delta over another dataset: windows are planned by the CLI / upstream
        all_sensors.append(
            build_window_sensor(
                spec,
                source=up,
                asset_key=asset.key,
                minimum_interval_seconds=sensor_interval_seconds,
            )
        )
    all_jobs = list(jobs)
    if dataset_keys:
        all_jobs.append(
            dg.define_asset_job(ALL_DATASETS_JOB, selection=dg.AssetSelection.assets(*dataset_keys))
        )
    return dg.Definitions(
        assets=[*sources, *datasets, *assets],
        asset_checks=all_checks,
        sensors=all_sensors,
        schedules=list(schedules),
        jobs=all_jobs,
        resources=all_resources,
        executor=executor,
    )
