"""The `parity` check of every dataset (`build_definitions`).

Blocking: in a materialisation that wrote both arms (`dual`), it compares them (count and the
multiset of typed rows) and fails with counts and up to 20 differing keys per side, so downstream
assets in the run do not consume a diverged dataset. When the latest materialisation wrote a
single arm there is nothing to compare: the check reports no result, which Dagster shows as
*skipped* (a check planned in a run that ended well without evaluating it) — never a green pass.
In an audited `dual` run the legacy arm is not written yet: the run's staged writes are replayed
on it in a transaction that is rolled back, and compared with the audited snapshot
(`audit.audit_parity`); the publish compares again before it commits.

A `@dataset` or model node declares it as a check of its own asset and evaluates it in its own
step, right after the write (`dataset_checks.py`): no step of its own. `parity_check` is the
stand-alone form, for a dataset asset built by other code (a one-check `multi_asset_check` with
`can_subset=True` only so that its output is optional).
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.services.parity import ParityReport

PARITY = "parity"


def parity_spec(spec: DatasetSpec, asset_key: dg.AssetKey) -> dg.AssetCheckSpec:
    """The declaration of the `parity` check of `spec` (blocking)."""
    return dg.AssetCheckSpec(
        PARITY,
        asset=asset_key,
        blocking=True,
        description=(
            f"Legacy (Postgres) and native (Iceberg) arms of {spec.name} hold the same "
            "rows (skipped when the dataset was not written to both)"
        ),
    )


def parity_result(
    context: Any, spec: DatasetSpec, asset_key: dg.AssetKey
) -> dg.AssetCheckResult | None:
    """The parity of `spec` after this run's write (None: not a dual write, nothing to compare).
    `context`: the asset's or the check's execution context."""
    from pipeline_output.services.audit import audit_parity
    from pipeline_output.services.canary import check_parity

    run_id = context.run.run_id
    publisher = runtime_of(context).publisher
    staged = audit_parity(publisher, spec, run_id=run_id)
    if staged is not None:  # an audited dual write: the legacy arm is written at the publish
        return _result(
            staged,
            asset_key,
            note="audited: the staged writes replayed on the legacy arm "
            "(rolled back) against the audited snapshot",
        )
    arms = written_arms(context.instance, asset_key)
    if not ("pg" in arms and "iceberg" in arms):
        context.log.info(
            f"{spec.name}: parity skipped: not a dual write (arms: {arms or 'none'}); "
            "nothing to compare"
        )
        return None
    return _result(check_parity(publisher, spec, run_id=run_id), asset_key)


def parity_check(spec: DatasetSpec, asset_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The stand-alone `parity` check of a dataset asset that does not declare it itself."""

    @dg.multi_asset_check(
        name=f"{asset_key.to_python_identifier()}_{PARITY}",
        specs=[parity_spec(spec, asset_key)],
        can_subset=True,  # its result is optional: no result = skipped
        required_resource_keys={RESOURCE_KEY},
    )
    def _parity(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        result = parity_result(context, spec, asset_key)
        if result is not None:
            yield result

    return _parity


def written_arms(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> str:
    """The arms the latest materialisation of `asset_key` wrote (`"iceberg, pg"`, ...)."""
    event = instance.get_latest_materialization_event(asset_key)
    if event is None or event.asset_materialization is None:
        return ""
    raw = event.asset_materialization.metadata.get("arms")
    return str(getattr(raw, "value", raw) or "")


def _result(
    report: ParityReport, asset_key: dg.AssetKey, *, note: str | None = None
) -> dg.AssetCheckResult:
    metadata: dict[str, Any] = {
        "pg_count": report.pg_count,
        "iceberg_count": report.iceberg_count,
        "only_in_pg": dg.MetadataValue.json(report.only_in_pg),
        "only_in_iceberg": dg.MetadataValue.json(report.only_in_iceberg),
        "detail": report.detail or "-",
    }
    if note:
        metadata["note"] = note
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name=PARITY,
        passed=report.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=report.summary(),
        metadata=metadata,
    )
