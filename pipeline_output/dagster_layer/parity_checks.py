"""The parity asset check attached to every dataset by `build_definitions`.

Blocking: in a materialisation that wrote both arms (`dual`), it compares them (count and the
multiset of typed rows) and fails with counts and up to 20 differing keys per side, so downstream
assets in the run do not consume a diverged dataset. When the latest materialisation wrote a
single arm there is nothing to compare and the check passes, saying so.
"""

import dagster as dg

from pipeline_output.spec import DatasetSpec


def parity_check(spec: DatasetSpec, asset_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The `parity` check of one dataset."""

    @dg.asset_check(
        asset=asset_key,
        name="parity",
        blocking=True,
        description=f"Legacy (Postgres) and native (Iceberg) arms of {spec.name} hold the same rows",
    )
    def _parity(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        from pipeline_output.canary import check_parity
        from pipeline_output.dagster_layer.runtime import get_runtime

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
        report = check_parity(
            get_runtime().publisher, spec, run_id=context.op_execution_context.run_id
        )
        return dg.AssetCheckResult(
            passed=report.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=report.summary(),
            metadata={
                "pg_count": report.pg_count,
                "iceberg_count": report.iceberg_count,
                "only_in_pg": dg.MetadataValue.json(report.only_in_pg),
                "only_in_iceberg": dg.MetadataValue.json(report.only_in_iceberg),
                "detail": report.detail or "-",
            },
        )

    return _parity
