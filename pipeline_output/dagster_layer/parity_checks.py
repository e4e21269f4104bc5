"""The parity asset check attached to every dataset by `build_definitions`.

Blocking: in a materialisation that wrote both arms (`dual`), it compares them (count and the
multiset of typed rows) and fails with counts and up to 20 differing keys per side, so downstream
assets in the run do not consume a diverged dataset. When the latest materialisation wrote a
single arm there is nothing to compare and the check passes, saying so. In an audited `dual` run
the legacy arm is not written yet: the run's staged writes are replayed on it in a transaction
that is rolled back, and compared with the audited snapshot (`audit.audit_parity`); the publish
compares again before it commits.
"""

from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.services.parity import ParityReport


def parity_check(spec: DatasetSpec, asset_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The `parity` check of one dataset."""

    @dg.asset_check(
        asset=asset_key,
        name="parity",
        blocking=True,
        description=f"Legacy (Postgres) and native (Iceberg) arms of {spec.name} hold the same rows",
        required_resource_keys={RESOURCE_KEY},
    )
    def _parity(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        from pipeline_output.services.audit import audit_parity
        from pipeline_output.services.canary import check_parity

        run_id = context.op_execution_context.run_id
        publisher = runtime_of(context).publisher
        staged = audit_parity(publisher, spec, run_id=run_id)
        if staged is not None:  # an audited dual write: the legacy arm is written at the publish
            return _result(
                staged,
                note="audited: the staged writes replayed on the legacy arm "
                "(rolled back) against the audited snapshot",
            )
        event = context.instance.get_latest_materialization_event(asset_key)
        arms = ""
        if event is not None and event.asset_materialization is not None:
            raw = event.asset_materialization.metadata.get("arms")
            arms = str(getattr(raw, "value", raw) or "")
        if not ("pg" in arms and "iceberg" in arms):
            return dg.AssetCheckResult(
                passed=True,
                metadata={"note": f"not a dual write (arms: {arms or 'none'}); nothing to compare"},
            )
        return _result(check_parity(publisher, spec, run_id=run_id))

    return _parity


def _result(report: ParityReport, *, note: str | None = None) -> dg.AssetCheckResult:
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
        passed=report.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=report.summary(),
        metadata=metadata,
    )
