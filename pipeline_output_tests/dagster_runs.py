"""Test harness: materialise assets of a code location in process, and read back what a run
recorded (materialisation metadata, the parity check's evaluations)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from pipeline_output import PipelineOutputResource
from pipeline_output.infra.settings import to_sqlalchemy_url


def configured_resource(url: str, warehouse: Path, **fields: Any) -> PipelineOutputResource:
    """A resource that names its control plane (`url`) and a SQL catalog on the same Postgres,
    its files under `warehouse`: nothing is read from the environment. `fields`: the others."""
    return PipelineOutputResource(
        pg_url=url,
        catalog={
            "type": "sql",
            "uri": to_sqlalchemy_url(url, driver="psycopg"),
            "warehouse": f"file://{warehouse}",
        },
        **fields,
    )


def run_assets(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    keys: list[str],
    *,
    run_config: dict[str, Any] | None = None,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey(k) for k in keys],
        run_config=run_config or {},
        raise_on_error=raise_on_error,
    )


def mat_meta(result: dg.ExecuteInProcessResult, key: str) -> dict[str, Any]:
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        if mat.asset_key == dg.AssetKey(key):
            return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    raise AssertionError(f"{key} was not materialised")


def failure_errors(result: dg.ExecuteInProcessResult) -> list[str]:
    """The pipeline-output error class of each failed step, as its `dg.Failure` names it in its
    metadata (`dagster_layer/failures.py`); "" for a step that failed otherwise."""
    out = []
    for event in result.get_step_failure_events():
        data = event.step_failure_data.user_failure_data
        raw = data.metadata.get("error") if data is not None else None
        out.append(str(getattr(raw, "value", raw or "")))
    return out


def partition_meta(instance: dg.DagsterInstance, name: str, key: str) -> dict[str, Any]:
    """The latest materialisation's metadata of partition `key` of asset `name`, as the instance
    recorded it."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[key]), limit=1
    ).records
    mat = records[0].asset_materialization
    assert mat is not None
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def check_evals(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    """The `parity` check evaluation of each asset (each also has a `table_health` check)."""
    out = {}
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            ev = event.event_specific_data
            if ev.check_name == "parity":  # type: ignore[union-attr]
                out[ev.asset_key.to_user_string()] = ev  # type: ignore[union-attr]
    return out


def requested_keys(result: dg.SensorResult, instance: dg.DagsterInstance) -> list[str]:
    """The window partition keys a window sensor's run requests cover, in request order: a
    single-partition request its key, a partition-range request every key from its start to its
    end in the dynamic partitions' order (what the run resolves)."""
    out: list[str] = []
    for request in result.run_requests or []:
        if request.partition_key is not None:
            out.append(request.partition_key)
            continue
        span = request.partition_key_range
        assert span is not None, f"a window run request without a partition: {request}"
        dataset = request.tags["pipeline-output/dataset"]
        keys = list(instance.get_dynamic_partitions(f"{dataset}__windows"))
        out.extend(keys[keys.index(span.start) : keys.index(span.end) + 1])
    return out


def run_request(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    request: dg.RunRequest,
    *,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """Execute a sensor's run request in this process, as the daemon would launch it: its assets,
    checks, partition (or partition range) and tags (`execute_in_process` is in-process already,
    so the request's executor config is left out)."""
    job = defs.resolve_implicit_global_asset_job_def()
    config = {k: v for k, v in (request.run_config or {}).items() if k != "execution"}
    return job.execute_in_process(
        instance=instance,
        asset_selection=list(request.asset_selection or []),
        partition_key=request.partition_key,
        tags=dict(request.tags),
        run_config=config,
        raise_on_error=raise_on_error,
    )
