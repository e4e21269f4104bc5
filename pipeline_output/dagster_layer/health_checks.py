"""The `table_health` check of every dataset (`build_definitions`).

Not blocking, severity WARN: it measures the dataset's Iceberg table (`stores/iceberg/maintenance/health.py`:
data files, small-file ratio, delete files, snapshots, metadata bytes, last compaction and expiry)
and fails — as a warning — past the thresholds, saying which maintenance would help. It runs with
materialisations of the dataset and in the `table_health` job; the maintenance job
reports it for every table it maintained (`health_evaluation`). Window runs leave it out (see
`build.py`). A dataset with no Iceberg table (the legacy arm) passes, saying so.

A `@dataset` or model node declares it as a check of its own asset and evaluates it in its own
step, after the write (`dataset_checks.py`); the thresholds ride on the check's declaration
(`THRESHOLDS_KEY`, shown with the check). `table_health_check` is the stand-alone form, for a
dataset asset built by other code.
"""

from dataclasses import asdict
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.keys import HEALTH_CHECK
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds, TableHealth

THRESHOLDS_KEY = "thresholds"


def health_spec(
    spec: DatasetSpec, asset_key: dg.AssetKey, thresholds: HealthThresholds | None = None
) -> dg.AssetCheckSpec:
    """The declaration of the `table_health` check of `spec` (not blocking)."""
    return dg.AssetCheckSpec(
        HEALTH_CHECK,
        asset=asset_key,
        blocking=False,
        description=(
            f"The Iceberg table of {spec.name} is not fragmented (small files, delete files) "
            "and carries no excess history (snapshots, metadata bytes)"
        ),
        metadata=thresholds_metadata(thresholds or HealthThresholds()),
    )


def thresholds_metadata(thresholds: HealthThresholds) -> dict[str, Any]:
    """The check's declared metadata: the thresholds it warns past."""
    return {THRESHOLDS_KEY: dg.MetadataValue.json(asdict(thresholds))}


def thresholds_of(check_spec: dg.AssetCheckSpec) -> HealthThresholds:
    """The thresholds a declared `table_health` check warns past (the defaults when it names
    none)."""
    raw = (check_spec.metadata or {}).get(THRESHOLDS_KEY)
    value = getattr(raw, "value", raw)
    return HealthThresholds(**value) if isinstance(value, dict) else HealthThresholds()


def health_result(
    context: Any, spec: DatasetSpec, asset_key: dg.AssetKey, thresholds: HealthThresholds
) -> dg.AssetCheckResult:
    """Measure the table of `spec` now. `context`: the asset's or the check's execution context."""
    from pipeline_output.stores.iceberg.maintenance.health import table_health

    table = runtime_of(context).iceberg.load(spec)
    if table is None or table.current_snapshot() is None:
        return dg.AssetCheckResult(
            asset_key=asset_key,
            check_name=HEALTH_CHECK,
            passed=True,
            metadata={"note": "no Iceberg table yet; nothing to measure"},
        )
    passed, description, metadata = health_verdict(table_health(table), thresholds)
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name=HEALTH_CHECK,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata=metadata,
    )


def table_health_check(
    spec: DatasetSpec, asset_key: dg.AssetKey, thresholds: HealthThresholds
) -> dg.AssetChecksDefinition:
    """The stand-alone `table_health` check of a dataset asset that does not declare it itself."""
    declared = health_spec(spec, asset_key, thresholds)

    @dg.asset_check(
        asset=asset_key,
        name=HEALTH_CHECK,
        blocking=False,
        description=declared.description,
        metadata=declared.metadata,
        required_resource_keys={RESOURCE_KEY},
    )
    def _table_health(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        return health_result(context, spec, asset_key, thresholds)

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
