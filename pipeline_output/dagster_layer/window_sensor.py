"""The window sensor of a delta dataset: plan its windows, request runs for the pending ones.

`<dataset>__window_sensor`, one per delta dataset (`build_definitions`). Its upstream is a source
(`postgres_source` / `iceberg_source`: the high-water mark is read every tick, the rows only when
it moved) or another dataset (a chained delta dataset: read only after that dataset has a new
materialization, and only up to what it has fully written). One tick:

1. when the upstream's version moved since the cursor's (`window_upstreams.SensorUpstream`: a
   source's high-water mark on the Delta's watermark column), plans the next windows — the
   planner's `window_planning.plan_next`: at most 1,000 per tick, each within `max_rows`; a larger
   backlog continues on the next tick — and records the source read as an observation of the
   source (row count and high-water mark);
2. adds the partitions of the windows planned since its last tick (the cursor holds the last
   window whose partition was added; without a cursor, every missing partition is added);
3. (unless the dataset has an `automation_condition`, which then runs them) requests runs for
   the windows that need one (planned or failed) and that no queued or running
   run of the dataset covers: consecutive windows as one partition-range run of at most
   `Delta.max_windows_per_run` windows, a lone window as a single-partition run. A run key names
   the windows, their attempts and the tick's request generation, so a failed window — or one
   whose run was canceled — is requested again. The runs execute their steps in the run worker
   (`execution: in_process`) unless the code location sets an executor.

Every read is bounded by what can change — the upstream's high-water mark, the last window, the
pending and the new windows, the runs in flight — not by the ledger's history.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import WindowRow
from pipeline_output.dagster_layer.delta_assets import DEFAULT_SENSOR_INTERVAL_S, window_partitions
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.resource import PipelineOutputResource
from pipeline_output.dagster_layer.window_upstreams import SensorUpstream
from pipeline_output.services.window_planning import plan_next, run_groups

DATASET_TAG = "pipeline-output/dataset"  # lets a QueuedRunCoordinator limit runs per dataset
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
IN_PROCESS: dict[str, Any] = {"execution": {"config": {"in_process": {}}}}
_IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def _cursor(raw: str | None) -> dict[str, Any]:
    """The sensor's cursor: `seq` (the last window whose partition was added), `upstream` (the
    upstream's version when it was last read) and `generation` (how many ticks requested runs).
    A cursor of an older version (a high-water mark) is ignored."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def in_flight_keys(context: dg.SensorEvaluationContext, dataset: str) -> Callable[[str], bool]:
    """Whether a partition key is covered by a queued or running run of `dataset` (its single
    partition, or its partition range: keys sort in window order)."""
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(tags={DATASET_TAG: dataset}, statuses=_IN_FLIGHT)
    )
    singles: set[str] = set()
    ranges: list[tuple[str, str]] = []
    for record in records:
        tags = record.dagster_run.tags
        if RANGE_START_TAG in tags and RANGE_END_TAG in tags:
            ranges.append((tags[RANGE_START_TAG], tags[RANGE_END_TAG]))
        elif PARTITION_TAG in tags:
            singles.add(tags[PARTITION_TAG])
    return lambda key: key in singles or any(lo <= key <= hi for lo, hi in ranges)


def key_of(row: WindowRow) -> str:
    """A window and its attempt count, as a run key names it."""
    return f"{row.partition_key}:{row.attempts}"


def window_run_requests(
    spec: DatasetSpec,
    rows: Sequence[WindowRow],
    *,
    asset_key: dg.AssetKey,
    asset_check_keys: Sequence[dg.AssetCheckKey] | None,
    run_config: dict[str, Any] | None,
    generation: int = 0,
) -> list[dg.RunRequest]:
    """One run request per group of consecutive windows of `rows` (`window_planning.run_groups`):
    a partition-range run for several, a single-partition run for one. The run key names the
    windows, their attempts and the sensor's request `generation` (a tick the daemon evaluates
    again after a crash requests the same keys; a later tick, once the previous run of those
    windows ended without applying them — canceled, say — requests them again)."""
    assert spec.delta is not None
    out = []
    for group in run_groups(rows, max_per_run=spec.delta.max_windows_per_run):
        first, last = group[0], group[-1]
        tags = {DATASET_TAG: spec.name}
        if len(group) == 1:
            key, run_key = first.partition_key, f"{spec.name}:{key_of(first)}:{generation}"
        else:
            key = None
            tags.update({RANGE_START_TAG: first.partition_key, RANGE_END_TAG: last.partition_key})
            run_key = f"{spec.name}:{key_of(first)}:{key_of(last)}:{generation}"
            run_key += f":{sum(r.attempts for r in group)}"
        out.append(
            dg.RunRequest(
                partition_key=key,
                run_key=run_key,
                asset_selection=[asset_key],
                asset_check_keys=list(asset_check_keys) if asset_check_keys is not None else None,
                tags=tags,
                run_config=run_config,
            )
        )
    return out


def build_window_sensor(
    spec: DatasetSpec,
    *,
    upstream: SensorUpstream,
    asset_key: dg.AssetKey,
    minimum_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_S,
    asset_check_keys: Sequence[dg.AssetCheckKey] | None = None,
    in_process: bool = True,
    request_runs: bool = True,
    resource: PipelineOutputResource | None = None,
) -> dg.SensorDefinition:
    """The sensor that plans `spec`'s windows from `upstream` and requests their runs.

    `asset_check_keys`: the checks each window run executes (None: every check of the asset).
    `in_process`: the runs execute their steps in the run worker (Dagster's default executor,
    configured `in_process`); False when the code location sets its own executor. Without
    `request_runs` it only plans windows and adds their partitions: the dataset's
    `automation_condition` decides when they run. `resource`: where the ledger lives (None: the
    environment's settings)."""
    assert spec.delta is not None
    delta = spec.delta
    partitions = window_partitions(spec)
    run_config = IN_PROCESS if in_process else None

    @dg.sensor(
        name=f"{spec.name}__window_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        asset_selection=dg.AssetSelection.assets(asset_key),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Plans delta windows of {spec.name} over {upstream.name}.{delta.watermark}",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        with failing_as_dagster(spec.name):
            return _evaluate(context)

    def _evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        ledger = (resource or PipelineOutputResource()).runtime().windows
        cursor = _cursor(context.cursor)
        version = upstream.version(context)
        observations: list[dg.AssetObservation] = []
        if version is None or version != cursor.get("upstream"):
            planned = plan_next(spec, upstream, ledger=ledger)
            last = planned.last
            observation = upstream.observation(planned.seen)
            if observation is not None:  # what was read of the source, recorded
                observations.append(observation)
            if version is not None and planned.caught_up:  # else the rest is planned next tick
                cursor["upstream"] = version
        else:
            last = ledger.last(spec.name)
        seq = cursor.get("seq")
        if isinstance(seq, int):
            new = [w.partition_key for w in ledger.after(spec.name, seq)]
        else:  # no cursor: add every partition the instance lacks (once)
            existing = set(context.instance.get_dynamic_partitions(str(partitions.name)))
            new = [w.partition_key for w in ledger.windows(spec.name)]
            new = [k for k in new if k not in existing]
        if last is not None:
            cursor["seq"] = last.seq
        covered = in_flight_keys(context, spec.name)
        pending = [w for w in ledger.pending(spec.name) if not covered(w.partition_key)]
        if not request_runs:
            pending = []
        generation = int(cursor.get("generation") or 0)
        requests = window_run_requests(
            spec,
            pending,
            asset_key=asset_key,
            asset_check_keys=asset_check_keys,
            run_config=run_config,
            generation=generation,
        )
        if requests:
            cursor["generation"] = generation + 1
        return dg.SensorResult(
            run_requests=requests,
            asset_events=observations,
            dynamic_partitions_requests=[partitions.build_add_request(new)] if new else [],
            cursor=json.dumps(cursor),
        )

    return _sensor
