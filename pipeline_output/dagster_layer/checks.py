"""The checks of a dataset, evaluated in the dataset's own step.

A `@dataset` or model node declares its `parity` (blocking) and `table_health` checks as checks of
its own asset (`declared_checks`: Dagster's `check_specs`) and can be subset (`can_subset=True`):
a run that materialises it evaluates the checks it selected right after the write, in the same
step (`evaluate_checks`) — no step, and no process under a multiprocess executor, per check. A run
that selects only checks (the `table_health` job, a check launched alone in the UI) runs the step
without writing. A failed blocking check fails the step once its events are recorded (Dagster's
rule for checks an asset yields): downstream assets in the run do not run, as with a check step.

`build_definitions` keeps the checks the location wants (`with_location_checks`: `parity` unless
`with_parity_checks=False`, `table_health` with maintenance, its thresholds on its declaration);
a dataset asset built by other code (its spec in its metadata) gets the same checks as
stand-alone check definitions instead.

The `parity` check of every dataset (`build_definitions`).

Blocking: in a materialisation that wrote both arms (`dual`), it compares them (count and the
multiset of typed rows) and fails with counts and up to 20 differing keys per side, so downstream
assets in the run do not consume a diverged dataset. When the latest materialisation wrote a
single arm there is nothing to compare: the check reports no result, which Dagster shows as
*skipped* (a check planned in a run that ended well without evaluating it) — never a green pass.
Evaluated in the step that wrote, it knows the arms from that write (`note_written`: no query of
the instance); a check run alone reads them from the latest materialisation.
In an audited `dual` run the legacy arm is not written yet: the run's staged writes are replayed
on it in a transaction that is rolled back, and compared with the audited snapshot
(`audit.audit_parity`); the publish compares again before it commits.

A `@dataset` or model node declares it as a check of its own asset and evaluates it in its own
step, right after the write (`checks.py`): no step of its own. `parity_check` is the
stand-alone form, for a dataset asset built by other code (a one-check `multi_asset_check` with
`can_subset=True` only so that its output is optional).

The `table_health` check of every dataset (`build_definitions`).

Not blocking, severity WARN: it measures the dataset's Iceberg table (`stores/iceberg/maintenance/health.py`:
data files, small-file ratio, delete files, snapshots, metadata bytes, last compaction and expiry)
and fails — as a warning — past the thresholds, saying which maintenance would help. It runs with
materialisations of the dataset and in the `table_health` job; the maintenance job
reports it for every table it maintained (`health_evaluation`). Window runs leave it out (see
`build.py`). A dataset with no Iceberg table (the legacy arm) passes, saying so.

A `@dataset` or model node declares it as a check of its own asset and evaluates it in its own
step, after the write (`checks.py`); the thresholds ride on the check's declaration
(`THRESHOLDS_KEY`, shown with the check). `table_health_check` is the stand-alone form, for a
dataset asset built by other code.
"""

# No `from __future__ import annotations` here: Dagster reads the checks' `context` annotations
# at definition time and refuses them as strings.

import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.keys import HEALTH_CHECK
from pipeline_output.dagster_layer.resource import RESOURCE_KEY, runtime_of
from pipeline_output.services.parity import ParityReport
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds, TableHealth

PARITY = "parity"
OWN_CHECKS = (PARITY, HEALTH_CHECK)


def declared_checks(spec: DatasetSpec, asset_key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    """The checks a dataset asset declares as its own (what `build_definitions` may narrow)."""
    return [parity_spec(spec, asset_key), health_spec(spec, asset_key)]


def evaluate_checks(context: dg.AssetExecutionContext, spec: DatasetSpec) -> Iterator[Any]:
    """The results of the dataset's own checks this run selected, after its write (or alone).
    `parity` yields nothing when there is nothing to compare (Dagster shows it skipped); it
    learns the arms from this step's write when the step wrote (`note_written`)."""
    written = {
        key: _WRITTEN.pop((context.run.run_id, key), None) for key in context.selected_asset_keys
    }
    for key in sorted(context.selected_asset_check_keys, key=lambda k: k.name):
        if key.name == PARITY:
            arms, told = written.get(key.asset_key) or (None, False)
            result = parity_result(context, spec, key.asset_key, arms=arms, told=told)
            if result is not None:
                yield result
            else:  # said already, by the write's metadata or the check's own line
                _quiet_unyielded(
                    context, context.assets_def.get_output_name_for_asset_check_key(key)
                )
        elif key.name == HEALTH_CHECK:
            declared = context.assets_def.get_spec_for_check_key(key)
            yield health_result(context, spec, key.asset_key, thresholds_of(declared))


class _Unyielded(logging.Filter):
    """Drops Dagster's line that a step did not yield the output `output` and only that output."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self.line = f"did not yield or return expected outputs {{{output!r}}}."

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().endswith(self.line)


def _quiet_unyielded(context: dg.AssetExecutionContext, output: str) -> None:
    """Leave out of the step's log Dagster's INFO line that the step did not yield `parity`'s
    output (`op '...' did not yield or return expected outputs {'..._parity'}`): the skip is
    said with its reason — in the write's materialisation metadata (`parity`) or the check's
    own line — and Dagster shows the check skipped. Each line is an event written to the run's
    storage (issue 44). The filter is on this step's log manager only (Dagster makes one a
    step, and the step evaluates its checks once); a line naming any other output, or more than
    this one, is logged as before."""
    context.log.addFilter(_Unyielded(output))


def with_location_checks(
    asset: dg.AssetsDefinition,
    spec: DatasetSpec,
    *,
    parity: bool,
    thresholds: HealthThresholds | None,
) -> tuple[dg.AssetsDefinition, list[dg.AssetChecksDefinition]]:
    """`asset` declaring the checks this location wants — `parity` when `parity`, `table_health`
    warning past `thresholds` when given — and the stand-alone check definitions of those it
    does not declare itself (an asset built by other code)."""
    wanted = {PARITY} if parity else set()
    if thresholds is not None:
        wanted.add(HEALTH_CHECK)
    own = {k for k in asset.check_keys if k.asset_key == asset.key and k.name in OWN_CHECKS}
    keep = {k for k in own if k.name in wanted}
    if keep != own and asset.can_subset:
        asset = asset.subset_for(set(asset.keys), (asset.check_keys - own) | keep)
    health = next((k for k in keep if k.name == HEALTH_CHECK), None)
    if health is not None and thresholds is not None:
        declared = asset.get_spec_for_check_key(health)
        metadata = {**(declared.metadata or {}), **thresholds_metadata(thresholds)}
        asset = asset.with_attributes(metadata_by_key={health: metadata})
    standalone: list[dg.AssetChecksDefinition] = []
    missing = wanted - {k.name for k in keep}
    if PARITY in missing:
        standalone.append(parity_check(spec, asset.key))
    if HEALTH_CHECK in missing and thresholds is not None:
        standalone.append(table_health_check(spec, asset.key, thresholds))
    return asset, standalone


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
    context: Any,
    spec: DatasetSpec,
    asset_key: dg.AssetKey,
    *,
    arms: str | None = None,
    told: bool = False,
) -> dg.AssetCheckResult | None:
    """The parity of `spec` after this run's write (None: not a dual write, nothing to compare).
    `context`: the asset's or the check's execution context; `arms`: the arms the step's own
    write wrote (its materialisation's `arms`), else the latest materialisation's are read.
    A step that wrote one arm staged no dual audit either (an audited dual write's `arms` are
    both): it is skipped without asking the ledger, and without a log line of its own when
    the write's materialisation said so already (`told`, `parity_skip_note`)."""
    if arms is not None and not _dual(arms):
        if not told:
            _skipped(context, spec, arms)
        return None
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
    if arms is None:
        arms = written_arms(context.instance, asset_key)
    if not _dual(arms):
        _skipped(context, spec, arms)
        return None
    return _result(check_parity(publisher, spec, run_id=run_id), asset_key)


def _dual(arms: str) -> bool:
    return "pg" in arms and "iceberg" in arms


def _skipped(context: Any, spec: DatasetSpec, arms: str) -> None:
    context.log.info(f"{spec.name}: {_skip_text(arms)}")


def _skip_text(arms: str) -> str:
    return f"parity skipped: not a dual write (arms: {arms or 'none'}); nothing to compare"


def parity_skip_note(step_context: Any, asset_key: dg.AssetKey, arms: Sequence[str]) -> str | None:
    """What a dataset step's materialisation says (under `parity`) of the step's own `parity`
    check when it has nothing to compare (a write of one arm) and this step evaluates it — the
    check then logs no line of its own (each line is an event in the run's log, issue 44); None
    otherwise."""
    joined = ", ".join(arms)
    if _dual(joined):
        return None
    try:
        output = step_context.job_def.asset_layer.get_op_output_name(
            dg.AssetCheckKey(asset_key, PARITY)
        )
        if output not in step_context.selected_output_names:
            return None
    except Exception:  # not declared by this asset (a stand-alone check, or none)
        return None
    return _skip_text(joined)


def parity_check(spec: DatasetSpec, asset_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    """The stand-alone `parity` check of a dataset asset that does not declare it itself."""

    @dg.multi_asset_check(
        name=f"{asset_key.to_python_identifier()}_{PARITY}",
        specs=[parity_spec(spec, asset_key)],
        can_subset=True,  # its result is optional: no result = skipped
        required_resource_keys={RESOURCE_KEY},
    )
    def _parity(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        with failing_as_dagster(spec.name):
            result = parity_result(context, spec, asset_key)
        if result is not None:
            yield result

    return _parity


_WRITTEN: dict[tuple[str, dg.AssetKey], tuple[str, bool]] = {}
"""(run id, asset key) -> the arms the dataset's step wrote in that run (its materialisation's
`arms`) and whether its materialisation said `parity` is skipped, noted by the IO manager and taken
by the same step's `evaluate_checks`."""
_WRITTEN_MAX = 256  # a step whose checks never run (an asset built by other code) leaves one


def note_written(run_id: str, asset_key: dg.AssetKey, arms: str, *, told: bool = False) -> None:
    """Note the arms a step's write wrote (`told`: its materialisation said `parity` is
    skipped): the checks evaluated next in that step read them here instead of asking the
    instance for the latest materialisation."""
    while len(_WRITTEN) >= _WRITTEN_MAX:
        _WRITTEN.pop(next(iter(_WRITTEN)))
    _WRITTEN[(run_id, asset_key)] = (arms, told)


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
    return dg.AssetCheckResult(**_health_fields(asset_key, table_health(table), thresholds))


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
        with failing_as_dagster(spec.name):
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
    return dg.AssetCheckEvaluation(**_health_fields(asset_key, health, thresholds))


def _health_fields(
    asset_key: dg.AssetKey, health: TableHealth, thresholds: HealthThresholds
) -> dict[str, Any]:
    """What a `table_health` result says, whether the asset's step or another op reports it."""
    passed, description, metadata = health_verdict(health, thresholds)
    return {
        "asset_key": asset_key,
        "check_name": HEALTH_CHECK,
        "passed": passed,
        "severity": dg.AssetCheckSeverity.WARN,
        "description": description,
        "metadata": metadata,
    }
