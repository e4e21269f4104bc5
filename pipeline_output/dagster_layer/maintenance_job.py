"""The `table_maintenance` job and its schedule, built by `build_definitions` for a code location.

One op, `maintain_tables`, runs the core's maintenance (`pipeline_output/services/maintenance.py`:
stale audit branches, compaction, snapshot expiry, orphan removal) over the location's datasets
one after another, logs what each step did, and records each table's health after maintenance as
an asset observation of the dataset (data files, delete files, snapshots, metadata bytes, last
maintenance, with the values before) and its `table_health` check evaluation. Run config
(`MaintenanceConfig`: the `MaintenanceSettings` the Component's `maintenance:` attribute shares,
plus `datasets` and `dry_run`) picks datasets and operations; its defaults come from
`build_definitions(maintenance=...)`. A dataset whose maintenance fails does not stop the others;
the run fails at the end, naming them.
"""

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import dagster as dg
from pydantic import BaseModel

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.checks import health_evaluation
from pipeline_output.dagster_layer.keys import MAINTENANCE_JOB, MAINTENANCE_SCHEDULE
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.services.maintenance import MaintenanceOptions
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds

OP_NAME = "maintain_tables"
DEFAULT_CRON = "0 3 * * *"  # daily at 03:00 (the schedule is stopped unless turned on)


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
