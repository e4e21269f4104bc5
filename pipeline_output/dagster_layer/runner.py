"""Headless materialisation of a code location (what `pipeline-output materialize` runs).

Plans delta windows by evaluating each window sensor once (adding its partitions), applies every
pending window of each delta dataset in one single-run backfill (in window order), then runs the
unpartitioned datasets in one run; returns one summary row per materialised asset (and one per
asset with Dagster's own partitions, which it does not run: it cannot know which partitions).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.delta_assets import partitions_name
from pipeline_output.dagster_layer.resource import runtime_of_definitions
from pipeline_output.services.runtime import Runtime


@dataclass(frozen=True)
class MaterialisedAsset:
    """One line of the materialise summary."""

    asset: str
    run_id: str
    mode: str
    write_mode: str
    rows_in: int | None
    rows_inserted: int | None
    rows_updated: int | None
    rows_deleted: int | None
    snapshot: str
    note: str


def _value(meta: dict[str, Any], key: str) -> Any:
    raw = meta.get(key)
    return getattr(raw, "value", raw)


def plan_windows(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, int]:
    """Evaluate every window sensor once; returns planned-or-pending windows per dataset."""
    out: dict[str, int] = {}
    for sensor in defs.sensors or []:
        if not sensor.name.endswith("__window_sensor"):
            continue
        ctx = dg.build_sensor_context(instance=instance, definitions=defs)
        result = sensor(ctx)
        assert isinstance(result, dg.SensorResult)
        for req in result.dynamic_partitions_requests or []:
            if isinstance(req, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        out[sensor.name.removesuffix("__window_sensor")] = len(result.run_requests or [])
    return out


def _summaries(result: dg.ExecuteInProcessResult) -> list[MaterialisedAsset]:
    rows = []
    seen: set[str] = set()
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        if mat.asset_key.to_user_string() in seen:
            continue  # a range run reports one event per partition with the same metadata
        seen.add(mat.asset_key.to_user_string())
        meta = dict(mat.metadata)
        rows.append(
            MaterialisedAsset(
                asset=mat.asset_key.to_user_string(),
                run_id=result.run_id,
                mode=str(_value(meta, "mode") or ""),
                write_mode=str(_value(meta, "write_mode") or "-"),
                rows_in=_value(meta, "rows_in"),
                rows_inserted=_value(meta, "rows_inserted"),
                rows_updated=_value(meta, "rows_updated"),
                rows_deleted=_value(meta, "rows_deleted"),
                snapshot=str(
                    _value(meta, "iceberg/snapshot_id") or _value(meta, "pg/deploy_id") or "no-op"
                ),
                note=str(_value(meta, "windows") or _value(meta, "note") or ""),
            )
        )
    return rows


def materialize(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    *,
    selection: Sequence[str] | None = None,
    log_level: str = "INFO",
) -> list[MaterialisedAsset]:
    """Plan windows, apply pending windows per delta dataset, run the other assets."""
    run_config = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    job = defs.resolve_implicit_global_asset_job_def()
    graph = defs.resolve_asset_graph()
    wanted: set[dg.AssetKey] | None = None
    if selection:
        wanted = set()
        for text in selection:
            wanted |= set(dg.AssetSelection.from_string(text).resolve(graph))
    plan_windows(defs, instance)
    runtime = runtime_of_definitions(defs.resources)
    summaries: list[MaterialisedAsset] = []
    unpartitioned: list[dg.AssetKey] = []
    for assets_def in defs.assets or []:
        if not isinstance(assets_def, dg.AssetsDefinition) or not assets_def.is_materializable:
            continue
        for key in assets_def.keys:
            if wanted is not None and key not in wanted:
                continue
            spec = spec_of(assets_def)
            if (spec is None or spec.delta is None) and assets_def.partitions_def is not None:
                summaries.append(_partitioned_by_dagster(key))
                continue
            if spec is None or spec.delta is None:
                unpartitioned.append(key)
                continue
            keys = instance.get_dynamic_partitions(partitions_name(spec.name))
            if not keys:
                continue
            ordered = sorted(keys)
            result = _execute(
                job,
                runtime,
                instance=instance,
                asset_selection=[key],
                run_config=run_config,
                tags={
                    "dagster/asset_partition_range_start": ordered[0],
                    "dagster/asset_partition_range_end": ordered[-1],
                },
            )
            summaries.extend(_summaries(result))
    if unpartitioned:
        result = _execute(
            job, runtime, instance=instance, asset_selection=unpartitioned, run_config=run_config
        )
        summaries.extend(_summaries(result))
    return summaries


def _partitioned_by_dagster(key: dg.AssetKey) -> MaterialisedAsset:
    """The summary row of an asset with Dagster's own partitions: not run here (which ones?)."""
    name = key.to_user_string()
    note = f"Dagster-partitioned: dg launch --assets {name} --partition KEY"
    return MaterialisedAsset(name, "", "", "-", None, None, None, None, "not run", note)


def _execute(job: Any, runtime: Runtime, **kwargs: Any) -> dg.ExecuteInProcessResult:
    """One run in this process, raising its first step failure; afterwards every audit the run
    staged is settled: published, or — the run stopped before the publish (a blocking check
    failed and raised here, before the step's hooks) — failed, main untouched."""
    run_id = str(uuid.uuid4())
    try:
        result = job.execute_in_process(run_id=run_id, raise_on_error=True, **kwargs)
    except Exception as exc:
        _fail_staged_audits(
            runtime, run_id, reason=f"run failed: {' '.join(str(exc).split())[:300]}"
        )
        raise
    _check_audits(runtime, run_id)
    return result  # type: ignore[no-any-return]


def _fail_staged_audits(runtime: Runtime, run_id: str, *, reason: str) -> None:
    from pipeline_output.services.audit import fail_audit

    for audit in runtime.ledger.audit_log.audits_of_run(run_id):
        fail_audit(
            runtime.publisher, audit.dataset, run_id=run_id, reason=reason, windows=runtime.windows
        )


def _check_audits(runtime: Runtime, run_id: str) -> None:
    """Every audit the run staged must have published (a publish refused in a hook — main moved
    meanwhile — does not fail the run itself: `audit_hooks`)."""
    from pipeline_output.errors import AuditConflict, AuditFailed

    for audit in runtime.ledger.audit_log.audits_of_run(run_id):
        if audit.state == "published":
            continue
        error = AuditConflict if "main moved" in (audit.reason or "") else AuditFailed
        raise error(
            f"dataset {audit.dataset!r}: the audit of run {run_id} was not published "
            f"({audit.state}: {audit.reason or 'its blocking checks did not all pass'}); main "
            f"was not moved, branch {audit.branch} is kept (pipeline-output audit show "
            f"{audit.dataset})"
        )


def format_table(rows: Sequence[MaterialisedAsset]) -> str:
    """The summary as a plain-text table."""
    header = ("dataset", "mode", "write mode", "in", "ins", "upd", "del", "snapshot", "note")
    body = [
        (
            r.asset,
            r.mode,
            r.write_mode,
            *(
                "" if v is None else str(v)
                for v in (r.rows_in, r.rows_inserted, r.rows_updated, r.rows_deleted)
            ),
            r.snapshot,
            r.note[:60],
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False))
        for row in [header, *body]
    ]
    return "\n".join(line.rstrip() for line in lines)
