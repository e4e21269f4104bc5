"""Headless materialisation of a code location (what `pipeline-output materialize` runs).

Evaluates every window sensor once (as a daemon tick would: adding partitions and recording the
sources' observations), then per selected delta dataset, upstream first (a chained delta dataset
after the dataset it reads, whose sensor ticks again once that one was written here), applies
its pending (planned or failed) windows in one single-run backfill over the range from the
first to the last of them (in window order; applied windows inside the range
are skipped, and a dataset with no pending window gets no run); then runs the unpartitioned
datasets in one run; an asset with Dagster's own partitions runs over the partitions given
(`--partition`, `--partition-range`), each in a run of its own, else not at all (which
partitions?: it gets a row saying how to launch it). Every run executes to its end
(`raise_on_error=False`): a failed asset, or a failed blocking check, stops only what depends on
it, and a failure in one run does not stop the next. Returns a `RunOutcome` (`run_report`): a summary row per asset and arm, one line
per failure; the console logger stays at `log_level` and the full event log goes to `log_file`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.delta_assets import partitions_name
from pipeline_output.dagster_layer.failures import failure_retryable
from pipeline_output.dagster_layer.resource import runtime_of_definitions
from pipeline_output.dagster_layer.run_report import (
    Failure,
    MaterialisedAsset,
    RunOutcome,
    collect,
    format_table,
    write_log,
)
from pipeline_output.dagster_layer.window_sensor import RANGE_END_TAG, RANGE_START_TAG
from pipeline_output.errors import (
    PipelineOutputError,
    RetryableError,
    SettingsError,
    from_third_party,
)
from pipeline_output.services.runtime import Runtime

__all__ = [
    "Failure",
    "MaterialisedAsset",
    "RunOutcome",
    "execute",
    "format_table",
    "materialize",
    "plan_windows",
]

SENSOR_SUFFIX = "__window_sensor"


def plan_windows(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    only: str | None = None,
    failures: list[Failure] | None = None,
) -> dict[str, int]:
    """Evaluate every window sensor once; returns planned-or-pending windows per dataset. Each
    sensor plans through the one planner (`window_planning.plan_next`), as the daemon's tick does.

    The partitions each sensor adds and the observations it makes (the source's row count and
    high-water mark) are recorded in `instance`, as the daemon does; `only` evaluates the sensor
    of that dataset alone. Returns the windows that need a run, per dataset. With `failures`, a
    sensor that fails (a watermark column the source lacks, ...) is recorded there as one line and
    the other sensors still run; without, its error is raised."""
    runtime = runtime_of_definitions(defs.resources)
    out: dict[str, int] = {}
    for sensor in defs.sensors or []:
        name = sensor.name.removesuffix(SENSOR_SUFFIX)
        if name == sensor.name or (only is not None and name != only):
            continue
        dataset = name
        ctx = dg.build_sensor_context(instance=instance, definitions=defs)
        try:
            result = sensor(ctx)
        except Exception as exc:
            if failures is None:
                raise
            message, retryable = _one_line(exc)
            message = message.removeprefix(f"dataset {dataset!r}: ")
            failures.append(
                Failure(dataset, "-", f"{dataset}: windows not planned: {message}", retryable)
            )
            continue
        assert isinstance(result, dg.SensorResult)
        for req in result.dynamic_partitions_requests or []:
            if isinstance(req, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        for event in result.asset_events or []:
            instance.report_runless_asset_event(event)
        out[dataset] = len(runtime.windows.pending(dataset))
    return out


def _one_line(exc: BaseException) -> tuple[str, bool]:
    if isinstance(exc, dg.Failure) and exc.description:  # a sensor's error (`failures.py`)
        retryable = failure_retryable(exc.metadata)
        return " ".join(exc.description.split()), bool(retryable)
    known = exc if isinstance(exc, PipelineOutputError) else from_third_party(exc)
    if known is not None:
        return " ".join(str(known).split()), isinstance(known, RetryableError)
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}", False


def materialize(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    selection: Sequence[str] | None = None,
    partitions: tuple[str, str] | None = None,
    log_level: str = "INFO",
    log_file: Path | None = None,
) -> RunOutcome:
    """Plan windows, apply pending windows per delta dataset, run the other assets.
    `partitions` (first, last key; equal for one): each selected asset with Dagster's own
    partitions runs over them, in a run of its own (one single-run backfill for a range),
    upstream first; without, such an asset is not run (which partitions?)."""
    job = defs.resolve_implicit_global_asset_job_def()
    graph = defs.resolve_asset_graph()
    wanted: set[dg.AssetKey] | None = None
    if selection:
        wanted = set()
        for text in selection:
            wanted |= set(dg.AssetSelection.from_string(text).resolve(graph))
    report = RunOutcome()
    runtime = runtime_of_definitions(defs.resources)
    # every sensor ticks once, as the daemon's would (a dataset left out of the selection gets
    # its windows planned too); a failure counts only for a dataset the selection runs
    ticked: list[Failure] = []
    plan_windows(defs, instance, failures=ticked)
    unplanned = {f.asset: f for f in ticked}
    unpartitioned: list[dg.AssetKey] = []
    written: set[dg.AssetKey] = set()  # run in this call: a dataset reading one ticks again

    def run_unpartitioned() -> None:
        if unpartitioned:
            report.extend(
                execute(
                    job,
                    defs,
                    instance,
                    asset_keys=list(unpartitioned),
                    log_level=log_level,
                    log_file=log_file,
                )
            )
            written.update(unpartitioned)
            unpartitioned.clear()

    def run_one(key: dg.AssetKey, **where: Any) -> None:
        """One run of `key` (`where`: its partition key or range tags)."""
        report.extend(
            execute(
                job,
                defs,
                instance,
                asset_keys=[key],
                log_level=log_level,
                log_file=log_file,
                **where,
            )
        )
        written.add(key)

    order = {key: i for i, key in enumerate(graph.toposorted_asset_keys)}
    assets = [
        (key, assets_def)
        for assets_def in defs.assets or []
        if isinstance(assets_def, dg.AssetsDefinition) and assets_def.is_materializable
        for key in assets_def.keys
        if wanted is None or key in wanted
    ]
    if partitions is not None:  # every key checked before any run
        by_dagster = [(key, p) for key, a in assets if (p := _dagster_partitions(a)) is not None]
        if not by_dagster:
            raise PipelineOutputError(
                "--partition: no selected asset has Dagster partitions (a delta dataset's "
                "windows are planned, not chosen)"
            )
        for key, own in by_dagster:
            _partition_run(own, partitions, asset=key, instance=instance)
    for key, assets_def in sorted(assets, key=lambda item: order.get(item[0], len(order))):
        spec = spec_of(assets_def)
        if (partitions_def := _dagster_partitions(assets_def)) is not None:
            if partitions is None:
                report.rows.append(_partitioned_by_dagster(key))
                continue
            if set(unpartitioned) & graph.get(key).parent_keys:
                run_unpartitioned()
            run_one(key, **_partition_run(partitions_def, partitions, asset=key, instance=instance))
            continue
        if spec is None or spec.delta is None:
            unpartitioned.append(key)
            continue
        # upstream first: a chained delta dataset is planned once the dataset it reads is written
        parents = graph.get(key).parent_keys
        if set(unpartitioned) & parents:
            run_unpartitioned()
        if written & parents:  # its upstream moved since the first tick: tick it again
            again: list[Failure] = []
            plan_windows(defs, instance, only=spec.name, failures=again)
            unplanned.pop(spec.name, None)
            unplanned.update({f.asset: f for f in again})
        if spec.name in unplanned:
            report.failures.append(unplanned[spec.name])
            report.rows.append(_idle(key, status="failed", note="windows not planned"))
            continue
        ordered = _pending_keys(instance, runtime, spec.name)
        if not ordered:  # nothing to apply: no run, no re-materialisation of applied windows
            report.rows.append(_idle(key))
            continue
        run_one(key, tags=range_tags(ordered[0], ordered[-1]))
    run_unpartitioned()
    return report


def _partitioned_by_dagster(key: dg.AssetKey) -> MaterialisedAsset:
    """The summary row of an asset with Dagster's own partitions: not run here (which ones?)."""
    name = key.to_user_string()
    note = "Dagster-partitioned: --partition KEY or --partition-range FIRST...LAST"
    return MaterialisedAsset(name, "", "", "-", None, None, None, None, "-", note, status="not run")


def _dagster_partitions(assets_def: dg.AssetsDefinition) -> dg.PartitionsDefinition[Any] | None:
    """The asset's Dagster partitions, unless they are a delta dataset's windows."""
    spec = spec_of(assets_def)
    return None if spec is not None and spec.delta is not None else assets_def.partitions_def


def _partition_run(
    partitions_def: dg.PartitionsDefinition[Any],
    partitions: tuple[str, str],
    *,
    asset: dg.AssetKey,
    instance: dg.DagsterInstance,
) -> dict[str, Any]:
    """`execute`'s keywords for a run of `asset` over `partitions` (first, last): its partition
    key for one, the range tags of a single-run backfill for several; a key the asset does not
    have (dynamic partitions: as `instance` holds them) is refused before any run, naming the
    asset and its first and last keys."""
    first, last = partitions
    keys = list(partitions_def.get_partition_keys(dynamic_partitions_store=instance))
    missing = [k for k in dict.fromkeys(partitions) if k not in keys]
    if missing:
        span = f"{keys[0]} .. {keys[-1]} ({len(keys)} keys)" if keys else "none yet"
        raise PipelineOutputError(
            f"{asset.to_user_string()} has no partition {missing[0]!r}; its partitions: {span}"
        )
    if keys.index(first) > keys.index(last):
        raise PipelineOutputError(
            f"--partition-range {first}...{last}: {first!r} comes after {last!r}"
        )
    if first == last:
        return {"partition_key": first}
    return {"tags": range_tags(first, last)}


def range_tags(first: str, last: str) -> dict[str, str]:
    """The tags of a single-run backfill from partition `first` to `last`."""
    return {RANGE_START_TAG: first, RANGE_END_TAG: last}


def _pending_keys(instance: dg.DagsterInstance, runtime: Runtime, dataset: str) -> list[str]:
    """The partition keys of the dataset's planned or failed windows, in window order."""
    existing = set(instance.get_dynamic_partitions(partitions_name(dataset)))
    pending = {w.partition_key for w in runtime.windows.pending(dataset)}
    return sorted(pending & existing)


def _idle(
    key: dg.AssetKey, *, status: str = "ok", note: str = "no pending window"
) -> MaterialisedAsset:
    """The row of a delta dataset that got no run."""
    name = key.to_user_string()
    return MaterialisedAsset(name, "-", "", "-", None, None, None, None, "-", note, status=status)


def execute(
    job: Any,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    asset_keys: Sequence[dg.AssetKey],
    log_level: str = "INFO",
    log_file: Path | None = None,
    tags: Mapping[str, str] | None = None,
    partition_key: str | None = None,
    ops_config: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """One run in this process, to its end; afterwards every audit it staged is settled —
    published by its hooks, or failed here (the run ended before its blocking checks passed):
    main untouched, the branch kept."""
    run_id = str(uuid.uuid4())
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if ops_config:
        run_config["ops"] = dict(ops_config)
    try:
        result = job.execute_in_process(
            run_id=run_id,
            instance=instance,
            asset_selection=list(asset_keys),
            run_config=run_config,
            tags=dict(tags or {}),
            partition_key=partition_key,
            raise_on_error=False,
        )
    except dg.DagsterInvalidConfigError as exc:  # before the run starts: nothing ran
        raise config_refused(exc) from exc
    audits = _settle_audits(runtime_of_definitions(defs.resources), run_id)
    if log_file is not None:
        write_log(log_file, instance, run_id)
    return collect(result, defs, asset_keys, audits=audits)


def _settle_audits(runtime: Runtime, run_id: str) -> list[Any]:
    """Fail every audit the run left staged; the run's audits, decided."""
    from pipeline_output.services.audit import fail_audit

    for audit in runtime.ledger.audit_log.audits_of_run(run_id):
        if audit.state == "staged":
            fail_audit(
                runtime.publisher,
                audit.dataset,
                run_id=run_id,
                reason="the run ended before every blocking check on it passed",
                windows=runtime.windows,
            )
    return list(runtime.ledger.audit_log.audits_of_run(run_id))


def config_refused(exc: dg.DagsterInvalidConfigError) -> SettingsError:
    """Dagster's refusal of a run's config (`DagsterInvalidConfigError`: a resource field's
    `dg.EnvVar` not set, a wrong type) in one line, without Dagster's stack trace:
    `resource pipeline_output, field namespace: environment variable SHOP_NAMESPACE is not set`."""
    causes = []
    for error in exc.errors:
        text = error.message.split("Stack Trace:")[0]
        unset = re.search(r'environment variable "([^"]+)" which is not set', text)
        if unset:
            text = f"environment variable {unset.group(1)} is not set"
        where = re.search(r"root:resources:([^:\s]+):config:([^\s]+)", error.message)
        prefix = f"resource {where.group(1)}, field {where.group(2)}: " if where else ""
        causes.append(prefix + " ".join(text.split()))
    return SettingsError("the run's config", "; ".join(causes) or " ".join(str(exc).split())[:300])
