"""The `table_maintenance` job, its schedule and its health sensor, built by `build_definitions`
for a code location.

One op, `maintain_tables`, runs the core's maintenance (`pipeline_output/services/maintenance.py`:
stale audit branches, compaction, snapshot expiry, orphan removal) over the location's datasets
one after another, logs what each step did, and records each table's health after maintenance as
an asset observation of the dataset (data files, delete files, snapshots, metadata bytes, last
maintenance, with the values before) and its `table_health` check evaluation. Run config
(`MaintenanceConfig`: the `MaintenanceSettings` the Component's `maintenance:` attribute shares,
plus `datasets` and `dry_run`) picks datasets and operations; its defaults come from
`build_definitions(maintenance=...)`. A dataset whose maintenance fails does not stop the others;
the run fails at the end, naming them.

The opt-in sensor (`table_maintenance_sensor`, stopped unless turned on) launches the job for
each table past one of its `table_health` thresholds on small files, delete files or snapshots
(metadata bytes grow with those; alone they launch nothing) between scheduled runs: one run per table, keyed by the table's current snapshot (a table
maintenance could not fix is not maintained again until it changes), none while a run for it is
queued or in progress. It reads the cheap counts of the current snapshot first and measures the
full health only of tables whose counts could be past a threshold.
"""

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import dagster as dg
from pydantic import BaseModel

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.checks import health_evaluation
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.keys import (
    MAINTENANCE_JOB,
    MAINTENANCE_SCHEDULE,
    MAINTENANCE_SENSOR,
)
from pipeline_output.dagster_layer.resource import (
    RESOURCE_KEY,
    PipelineOutputResource,
    runtime_of,
)
from pipeline_output.services.maintenance import MaintenanceOptions
from pipeline_output.stores.iceberg.maintenance.health import (
    HealthThresholds,
    file_counts,
    table_health,
)

OP_NAME = "maintain_tables"
DEFAULT_CRON = "0 3 * * *"  # daily at 03:00 (the schedule is stopped unless turned on)
DEFAULT_SENSOR_INTERVAL_S = 600  # the sensor reads manifests of tables that may be unhealthy
DATASET_TAG = "pipeline-output/maintained-dataset"  # the table a sensor-launched run maintains


class MaintenanceSettings(BaseModel):
    """The maintenance settings the job's run config and the Component's `maintenance:` attribute
    share (sizes in bytes, ages in hours/seconds), and their core `MaintenanceOptions`."""

    audits: bool = True
    compact: bool = True
    expire: bool = True
    orphans: bool = True
    target_file_size: int | None = None
    min_input_files: int = 5
    older_than_hours: float = 120.0
    retain_last: int = 1
    grace_seconds: float = 3600.0
    audit_retention_hours: float = 168.0

    def options(self) -> MaintenanceOptions:
        """The core options these settings ask for (hours and seconds as the core's units)."""
        return MaintenanceOptions(
            **{name: getattr(self, name) for name in _SAME_NAMES},
            older_than=timedelta(hours=self.older_than_hours),
            grace_s=self.grace_seconds,
            audit_retention=timedelta(hours=self.audit_retention_hours),
        )


class MaintenanceConfig(MaintenanceSettings, dg.Config):
    """Which datasets (none: all), the settings, and whether it is a dry run."""

    datasets: list[str] = []
    dry_run: bool = False

    @classmethod
    def of(cls, options: MaintenanceOptions) -> "MaintenanceConfig":
        """The run config equivalent to core `options` (the job's defaults)."""
        return cls(
            **{name: getattr(options, name) for name in _SAME_NAMES},
            dry_run=options.dry_run,
            older_than_hours=options.older_than.total_seconds() / 3600,
            grace_seconds=options.grace_s,
            audit_retention_hours=options.audit_retention.total_seconds() / 3600,
        )

    def options(self) -> MaintenanceOptions:
        return replace(super().options(), dry_run=self.dry_run)


# the options the settings and the core name and measure alike
_SAME_NAMES = (
    "audits",
    "compact",
    "expire",
    "orphans",
    "target_file_size",
    "min_input_files",
    "retain_last",
)


def build_maintenance_job(
    datasets: Sequence[tuple[DatasetSpec, dg.AssetKey]],
    *,
    options: MaintenanceOptions,
    thresholds: HealthThresholds | None = None,
) -> dg.JobDefinition:
    """The `table_maintenance` job over `datasets` (spec and asset key of each); with
    `thresholds` it also reports each dataset's `table_health` check after maintenance."""
    by_name = {spec.name: (spec, key) for spec, key in datasets}

    @dg.op(
        name=OP_NAME,
        description="Drop stale audit branches, compact, expire snapshots, remove orphan files",
        required_resource_keys={RESOURCE_KEY},
    )
    def maintain_tables(context: dg.OpExecutionContext, config: MaintenanceConfig) -> None:
        with failing_as_dagster(config.datasets[0] if len(config.datasets) == 1 else None):
            _maintain_tables(context, config)

    def _maintain_tables(context: dg.OpExecutionContext, config: MaintenanceConfig) -> None:
        from pipeline_output.services.maintenance import maintain

        unknown = sorted(set(config.datasets) - set(by_name))
        if unknown:
            raise dg.Failure(
                f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(sorted(by_name))}"
            )
        chosen = [by_name[name] for name in (config.datasets or sorted(by_name))]
        runtime = runtime_of(context)
        reports = maintain(
            runtime.iceberg,
            [spec for spec, _ in chosen],
            options=config.options(),
            ledger=runtime.windows,
            run_id=context.run_id,
            on_step=lambda dataset, step: context.log.info(f"{dataset}: {step} ..."),
            publisher=runtime.publisher,
        )
        for report, (_, key) in zip(reports, chosen, strict=True):
            for line in report.lines():
                context.log.info(line)
            if report.after is None:
                continue
            meta: dict[str, Any] = dict(report.after.as_dict())
            if report.before is not None:
                for name in ("data_files", "delete_files", "snapshots", "metadata_bytes"):
                    meta[f"{name}_before"] = report.before.as_dict()[name]
            meta["maintenance"] = "; ".join(report.lines())
            meta["dry_run"] = config.dry_run
            context.log_event(dg.AssetObservation(asset_key=key, metadata=meta))
            if thresholds is not None:
                # recorded in the check's history like its own run (typed narrower than it is)
                context.log_event(health_evaluation(key, report.after, thresholds))  # type: ignore[arg-type]
        failed = [r for r in reports if r.errors]
        if failed:
            raise dg.Failure(
                description="maintenance failed for "
                + ", ".join(f"{r.dataset} ({'; '.join(r.errors)})" for r in failed)
            )

    @dg.job(
        name=MAINTENANCE_JOB,
        description="Table maintenance of every dataset: compaction, snapshot expiry, orphans",
        config=dg.RunConfig(ops={OP_NAME: MaintenanceConfig.of(options)}),
    )
    def table_maintenance() -> None:
        maintain_tables()

    return table_maintenance


def maintenance_schedule(
    job: dg.JobDefinition, *, cron: str = DEFAULT_CRON, running: bool = False
) -> dg.ScheduleDefinition:
    """The schedule of the maintenance job (stopped unless `running`)."""
    return dg.ScheduleDefinition(
        name=MAINTENANCE_SCHEDULE,
        job=job,
        cron_schedule=cron,
        default_status=(
            dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
        ),
        description=f"Table maintenance ({cron})",
    )


_IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def maintenance_sensor(
    job: dg.JobDefinition,
    datasets: Sequence[DatasetSpec],
    *,
    thresholds: HealthThresholds,
    options: MaintenanceOptions,
    resource: PipelineOutputResource | None = None,
    minimum_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_S,
    running: bool = False,
) -> dg.SensorDefinition:
    """The sensor launching `job` (with `options`) for each of `datasets` whose table is past
    `thresholds` (module docstring); stopped unless `running`. `resource`: where the tables
    live (None: the environment's settings)."""
    config = MaintenanceConfig.of(options).model_dump()

    @dg.sensor(
        name=MAINTENANCE_SENSOR,
        # the job by name, not the object: Dagster copies a sensor whose job object lacks the
        # location's resources (binding them to the job), and its copy warns that the beta
        # `owners` parameter was passed, in every process that loads the location
        job_name=job.name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=(
            dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED
        ),
        description="Table maintenance of each table past its table_health thresholds",
    )
    def table_maintenance_sensor(
        context: dg.SensorEvaluationContext,
    ) -> dg.SensorResult | dg.SkipReason:
        with failing_as_dagster(None):
            return _evaluate(context)

    def _evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        store = (resource or PipelineOutputResource()).runtime().iceberg
        requests, healthy = [], 0
        for spec in datasets:
            table = store.load(spec)
            if table is None:  # not written yet, or a legacy (Postgres) dataset
                continue
            snapshot = table.current_snapshot()
            counts = file_counts(table)
            if not (
                counts.data_files > thresholds.max_small_files
                or counts.delete_files > thresholds.max_delete_files
                or counts.snapshots > thresholds.max_snapshots
            ):  # past none of the thresholds that launch maintenance, whatever the manifests say
                healthy += 1
                continue
            warnings = table_health(table).warnings(thresholds, metadata_bytes=False)
            if not warnings:
                healthy += 1
                continue
            if _in_flight(context.instance, spec.name):
                context.log.info(f"{spec.name}: a maintenance run is in flight")
                continue
            context.log.info(f"{spec.name}: {'; '.join(warnings)}")
            requests.append(
                dg.RunRequest(
                    run_key=f"{spec.name}:{snapshot.snapshot_id if snapshot else 0}",
                    run_config={"ops": {OP_NAME: {"config": {**config, "datasets": [spec.name]}}}},
                    tags={DATASET_TAG: spec.name, "pipeline-output/health": "; ".join(warnings)},
                )
            )
        if not requests:
            return dg.SkipReason(f"{healthy} table(s) within their health thresholds")
        return dg.SensorResult(run_requests=requests)

    return table_maintenance_sensor


def _in_flight(instance: dg.DagsterInstance, dataset: str) -> bool:
    runs = instance.get_run_records(
        filters=dg.RunsFilter(
            job_name=MAINTENANCE_JOB, statuses=_IN_FLIGHT, tags={DATASET_TAG: dataset}
        ),
        limit=1,
    )
    return bool(runs)
