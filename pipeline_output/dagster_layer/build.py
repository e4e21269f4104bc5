"""`build_definitions`: a user's whole `definitions.py` in a few lines.

Wires the IO manager, the datasets and sources, one job over every dataset, table maintenance (a
`table_health` check per dataset, the `table_maintenance` job and its schedule, the
`table_health` job), and whatever sensors, schedules, checks and extra resources are passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from pipeline_output.contract.store_protocol import check_specs
from pipeline_output.dagster_layer.asset_params import check_unique_names
from pipeline_output.dagster_layer.audit_hooks import with_audit_hooks
from pipeline_output.dagster_layer.changes_assets import CHANGES_OF_KEY, check_changes_upstreams
from pipeline_output.dagster_layer.checks import with_location_checks
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.delta_assets import DEFAULT_SENSOR_INTERVAL_S
from pipeline_output.dagster_layer.io_manager import DatasetIOManager, default_io_manager
from pipeline_output.dagster_layer.keys import (
    ALL_DATASETS_JOB,
    HEALTH_CHECK,
    HEALTH_JOB,
    IO_MANAGER_KEY,
)
from pipeline_output.dagster_layer.load_time import at_load, location_default_mode
from pipeline_output.dagster_layer.maintenance_job import (
    DEFAULT_CRON,
    build_maintenance_job,
    maintenance_schedule,
    maintenance_sensor,
)
from pipeline_output.dagster_layer.maintenance_job import (
    DEFAULT_SENSOR_INTERVAL_S as DEFAULT_MAINTENANCE_SENSOR_INTERVAL_S,
)
from pipeline_output.dagster_layer.resource import (
    RESOURCE_KEY,
    PipelineOutputResource,
    bound_resource,
    freeze_long_lived,
)
from pipeline_output.dagster_layer.source_assets import grouped_sources, source_spec_of
from pipeline_output.dagster_layer.window_sensor import build_window_sensor
from pipeline_output.dagster_layer.window_upstreams import (
    check_delta_sources,
    dataset_upstream,
    delta_upstream_key,
    source_upstream,
)
from pipeline_output.errors import InvalidArgument
from pipeline_output.services.maintenance import MaintenanceOptions
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds
from pipeline_output.stores.iceberg.write.merge import ICEBERG_CAPABILITIES
from pipeline_output.stores.postgres.staging import LEGACY_CAPABILITIES


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
    resource: PipelineOutputResource | None = None,
    executor: Any = None,
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_S,
    with_parity_checks: bool = True,
    with_maintenance: bool = True,
    maintenance: MaintenanceOptions | None = None,
    maintenance_schedule_cron: str = DEFAULT_CRON,
    maintenance_schedule_running: bool = False,
    maintenance_sensor_running: bool = False,
    maintenance_sensor_interval_seconds: int = DEFAULT_MAINTENANCE_SENSOR_INTERVAL_S,
    health_thresholds: HealthThresholds | None = None,
) -> dg.Definitions:
    """Definitions for pipeline-output datasets and their sources.

    Every delta dataset gets its window sensor (`<dataset>__window_sensor`, polling every
    `sensor_interval_seconds`), over its source or — a chained delta dataset — over the dataset it
    reads (planned after that one materializes); with an `automation_condition` the sensor only
    plans windows and adds their partitions, the condition runs them. `all_datasets` is a job over
    the unpartitioned datasets. Two datasets may not share a name under different key prefixes
    (it names their table). Each dataset is checked against the declared capabilities of every
    arm it may be written to (`store_protocol.check_specs`): a name the legacy arm cannot hold,
    or a strategy whose write mode an arm has no handler for, fails here, at load.

    Every run of the location executes its steps in the run worker (`dg.in_process_executor`)
    unless `executor` is given (it then governs every run, window runs included). Every dataset
    gets a blocking `parity` check unless `with_parity_checks=False`; a `@dataset` or model node
    evaluates its checks in its own step, after the write (`checks.py`).

    With `with_maintenance` (default), every dataset gets a `table_health` check (warns past
    `health_thresholds`), the location gets the `table_maintenance` job (defaults from
    `maintenance`), its schedule `table_maintenance_schedule` (`maintenance_schedule_cron`,
    stopped unless `maintenance_schedule_running`), the `table_health` job (every check) and the
    opt-in `table_maintenance_sensor` (stopped unless `maintenance_sensor_running`; every
    `maintenance_sensor_interval_seconds` it launches the job for each table past its
    `health_thresholds` on small files, delete files or snapshots).
    `table_health` runs in that job, after each maintenance run (reported by the maintenance op)
    and with materialisations of the dataset, but not in window runs (it reads every manifest).

    `resource` (a `PipelineOutputResource`, also accepted as `resources["pipeline_output"]`) says
    where the datasets live: the control plane, the Iceberg catalog and the namespace; without it,
    the environment's settings (`PIPELINE_OUTPUT_*`, pyiceberg's config, the embedded server).
    """
    given = dict(resources or {})
    resource = resource or given.pop(RESOURCE_KEY, None) or PipelineOutputResource()
    if not isinstance(resource, PipelineOutputResource):
        raise InvalidArgument(
            f"build_definitions: resource must be a PipelineOutputResource, got "
            f"{type(resource).__name__}"
        )
    resource.check()
    binding = bound_resource(resource)  # one initialisation a run, shared by the IO manager
    all_resources: dict[str, Any] = {
        IO_MANAGER_KEY: DatasetIOManager(pipeline_output=binding),
        RESOURCE_KEY: binding,
    }
    all_resources.update(given)
    all_resources.setdefault("io_manager", default_io_manager())  # Dagster's, built on first use
    # kinds by arm; the column schema of tables that exist (when Dagster loads the location)
    datasets, assets = at_load(datasets, resource), at_load(assets, resource)
    specs = [
        s
        for a in [*datasets, *assets]
        if isinstance(a, dg.AssetsDefinition) and (s := spec_of(a)) is not None
    ]
    check_specs(specs, {"pg": LEGACY_CAPABILITIES, "iceberg": ICEBERG_CAPABILITIES})
    check_unique_names([*datasets, *assets], spec_of)
    check_changes_upstreams(
        {s.name: s for s in specs},
        {
            spec.name: str(getattr(raw, "value", raw))
            for a in [*datasets, *assets]
            if isinstance(a, dg.AssetsDefinition) and (spec := spec_of(a)) is not None
            for raw in [a.metadata_by_key.get(a.key, {}).get(CHANGES_OF_KEY)]
            if raw is not None
        },
        default_mode=location_default_mode(resource),
    )
    source_specs = {
        dg.AssetKey(s.name): s for s in (source_spec_of(a) for a in sources) if s is not None
    }
    check_delta_sources(
        [
            (s, a)
            for a in [*datasets, *assets]
            if isinstance(a, dg.AssetsDefinition) and (s := spec_of(a)) is not None
        ],
        [*sources, *datasets, *assets],
    )
    sources = grouped_sources(sources, [*datasets, *assets])
    all_sensors = list(sensors)
    dataset_keys: list[dg.AssetKey] = []
    all_checks = list(asset_checks)
    # each dataset's `parity` and `table_health` checks: declared by the asset and evaluated in
    # its step (`checks.py`), else stand-alone checks
    thresholds = (health_thresholds or HealthThresholds()) if with_maintenance else None

    def checked(asset: Any) -> Any:
        spec = spec_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
        if spec is None:
            return asset
        asset, standalone = with_location_checks(
            asset, spec, parity=with_parity_checks, thresholds=thresholds
        )
        all_checks.extend(standalone)
        return asset

    datasets, assets = [checked(a) for a in datasets], [checked(a) for a in assets]
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
    all_jobs = list(jobs)
    all_schedules = list(schedules)
    window_checks: dict[dg.AssetKey, list[dg.AssetCheckKey]] | None = None
    if thresholds is not None and specs:
        # window runs (the high-frequency path) leave `table_health` out (it reads every
        # manifest); the maintenance job and the `table_health` job report it
        every_check = [
            *(
                k
                for a in [*datasets, *assets]
                if isinstance(a, dg.AssetsDefinition)
                for k in a.check_keys
            ),
            *(k for c in all_checks for k in c.check_keys),
        ]
        window_checks = {}
        for key in every_check:
            if key.name != HEALTH_CHECK or key.asset_key not in by_key:
                window_checks.setdefault(key.asset_key, []).append(key)
        maintained = [
            (s, a.key)
            for a in [*datasets, *assets]
            if isinstance(a, dg.AssetsDefinition) and (s := spec_of(a)) is not None
        ]
        health = [k for k in every_check if k.name == HEALTH_CHECK and k.asset_key in by_key]
        job = build_maintenance_job(
            maintained, options=maintenance or MaintenanceOptions(), thresholds=thresholds
        )
        all_jobs.extend(
            [job, dg.define_asset_job(HEALTH_JOB, selection=dg.AssetSelection.checks(*health))]
        )
        all_schedules.append(
            maintenance_schedule(
                job, cron=maintenance_schedule_cron, running=maintenance_schedule_running
            )
        )
        all_sensors.append(
            maintenance_sensor(
                job,
                [s for s, _ in maintained],
                thresholds=thresholds,
                options=maintenance or MaintenanceOptions(),
                resource=resource,
                minimum_interval_seconds=maintenance_sensor_interval_seconds,
                running=maintenance_sensor_running,
            )
        )
    for asset in datasets:
        spec = spec_of(asset)
        if spec is None or spec.delta is None:
            if asset.partitions_def is None:  # Dagster-partitioned ones run by partition
                dataset_keys.extend(asset.keys)
            continue
        upstream_key = delta_upstream_key(spec, asset)  # with the upstream's key_prefix, if any
        source, upstream_spec = source_specs.get(upstream_key), by_key.get(upstream_key)
        if source is not None:
            upstream = source_upstream(spec, source, runtime=resource.runtime)
        elif upstream_spec is not None:  # a chained delta dataset: cut on the dataset it reads
            upstream = dataset_upstream(
                upstream_spec,
                watermark=spec.delta.watermark,
                asset_key=upstream_key,
                runtime=resource.runtime,
            )
        else:
            continue  # an upstream this location does not define: windows are planned by hand
        all_sensors.append(
            build_window_sensor(
                spec,
                upstream=upstream,
                asset_key=asset.key,
                minimum_interval_seconds=sensor_interval_seconds,
                asset_check_keys=(
                    window_checks.get(asset.key, []) if window_checks is not None else None
                ),
                resource=resource,
                # with an automation condition the sensor only plans: Dagster runs the windows
                request_runs=all(s.automation_condition is None for s in asset.specs),
                # the location's runs execute in process already (no run config needed)
                in_process=False,
            )
        )
    if dataset_keys:
        all_jobs.append(
            dg.define_asset_job(ALL_DATASETS_JOB, selection=dg.AssetSelection.assets(*dataset_keys))
        )
    defs = dg.Definitions(
        assets=[*sources, *datasets, *assets],
        asset_checks=all_checks,
        sensors=all_sensors,
        schedules=all_schedules,
        jobs=all_jobs,
        resources=all_resources,
        # Dagster's default executor runs each step in a process of its own (~1-15 s of imports
        # each, for a step that often takes less): in process unless one is given
        executor=executor if executor is not None else dg.in_process_executor,
    )
    freeze_long_lived("definitions")  # the loaded code location lives as long as the process
    return defs
