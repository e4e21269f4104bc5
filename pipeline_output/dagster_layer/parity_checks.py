"""The parity asset check attached to every dataset by `build_definitions`.

Blocking: in a materialisation that wrote both arms (`dual`), it compares them (count and the
multiset of typed rows) and fails with counts and up to 20 differing keys per side, so downstream
assets in the run do not consume a diverged dataset. When the latest materialisation wrote a
single arm there is nothing to compare: the check reports no result, which Dagster shows as
*skipped* (a check planned in a run that ended well without evaluating it) — never a green pass.
It is a one-check `multi_asset_check` with `can_subset=True` only so that its output is optional.
In an audited `dual` run the legacy arm is not written yet: the run's staged writes are replayed
on it in a transaction that is rolled back, and compared with the audited snapshot
(`audit.audit_parity`); the publish compares again before it commits.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.services.parity import ParityReport

PARITY = "parity"


def parity_check(spec: DatasetSpec, asset_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The `parity` check of one dataset."""

    @dg.multi_asset_check(
        name=f"{asset_key.to_python_identifier()}_{PARITY}",
        specs=[
            dg.AssetCheckSpec(
                PARITY,
                asset=asset_key,
                blocking=True,
                description=(
                    f"Legacy (Postgres) and native (Iceberg) arms of {spec.name} hold the same "
                    "rows (skipped when the dataset was not written to both)"
                ),
            )
        ],
        can_subset=True,  # its result is optional: no result = skipped
        required_resource_keys={RESOURCE_KEY},
    )
    def _parity(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        from pipeline_output.services.audit import audit_parity
        from pipeline_output.services.canary import check_parity

        run_id = context.op_execution_context.run_id
        publisher = runtime_of(context).publisher
        staged = audit_parity(publisher, spec, run_id=run_id)
        if staged is not None:  # an audited dual write: the legacy arm is written at the publish
            yield _result(
                staged,
                asset_key,
                note="audited: the staged writes replayed on the legacy arm "
                "(rolled back) against the audited snapshot",
            )
            return
        arms = written_arms(context.instance, asset_key)
        if not ("pg" in arms and "iceberg" in arms):
            context.log.info(
                f"{spec.name}: parity skipped: not a dual write (arms: {arms or 'none'}); "
                "nothing to compare"
            )
            return
        yield _result(check_parity(publisher, spec, run_id=run_id), asset_key)

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
