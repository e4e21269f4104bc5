"""The `table_health` asset check attached to every dataset by `build_definitions`.

Not blocking, severity WARN: it measures the dataset's Iceberg table (`stores/iceberg/maintenance/health.py`:
data files, small-file ratio, delete files, snapshots, metadata bytes, last compaction and expiry)
and fails — as a warning — past the thresholds, saying which maintenance would help. It runs after
unpartitioned materialisations of the dataset and in the `table_health` job; the maintenance job
reports it for every table it maintained (`health_evaluation`). Window runs leave it out (see
`build.py`). A dataset with no Iceberg table (the legacy arm) passes, saying so.
"""

from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.keys import HEALTH_CHECK
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds, TableHealth


def table_health_check(
    spec: DatasetSpec, asset_key: dg.AssetKey, thresholds: HealthThresholds
) -> dg.AssetChecksDefinition:
    """The `table_health` check of one dataset."""

    @dg.asset_check(
        asset=asset_key,
        name=HEALTH_CHECK,
        blocking=False,
        description=(
            f"The Iceberg table of {spec.name} is not fragmented (small files, delete files) "
            "and carries no excess history (snapshots, metadata bytes)"
        ),
        required_resource_keys={RESOURCE_KEY},
    )
    def _table_health(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        from pipeline_output.stores.iceberg.maintenance.health import table_health

        table = runtime_of(context).iceberg.load(spec)
        if table is None or table.current_snapshot() is None:
            return dg.AssetCheckResult(
                passed=True, metadata={"note": "no Iceberg table yet; nothing to measure"}
            )
        passed, description, metadata = health_verdict(table_health(table), thresholds)
        return dg.AssetCheckResult(
            passed=passed,
            severity=dg.AssetCheckSeverity.WARN,
            description=description,
            metadata=metadata,
        )

    return _table_health


def health_verdict(
    health: TableHealth, thresholds: HealthThresholds
) -> tuple[bool, str, dict[str, Any]]:
    """(passed, description, metadata) of the check for a measured table."""
    warnings = health.warnings(thresholds)
    return (
        not warnings,
        "; ".join(warnings) or "healthy",
        {**health.as_dict(), "table": health.table},
    )


def health_evaluation(
    asset_key: dg.AssetKey, health: TableHealth, thresholds: HealthThresholds
) -> dg.AssetCheckEvaluation:
    """The `table_health` check's evaluation, reported from another op (the maintenance job)."""
    passed, description, metadata = health_verdict(health, thresholds)
    return dg.AssetCheckEvaluation(
        asset_key=asset_key,
        check_name=HEALTH_CHECK,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata=metadata,
    )
