"""Dagster's own partitions on `@dataset`: `partitions_def=` + `partition_column=` (issue 34).

A dataset partitioned by day, by region or both maps each Dagster partition key to a slice of its
rows (`contract/slices.py`): a time-window partition is `[start, end)` on its column, a static or
dynamic one is `column == key`, a multi-partition one is one term per dimension
(`partition_column={"date": "day", "region": "region"}`). The compute is called once per
partition key of the run (a range run: in the definition's order) with `partition_key=` when it declares that
parameter; inputs from a dataset partitioned by the same definition are narrowed to that key's
slice, and a partitioned plain upstream loaded as `{key: frame}` gives that key's frame. The
IO manager then writes each partition in turn through the publish step (`write_partitions`), the
slice made exactly the compute's rows (see `contract/plan.py`): one commit per partition, except
a range run of a `replace` dataset in iceberg mode — one load, one lock, one commit for the run
(`stores/iceberg/write/range_write.py`).

Checked when the code location loads: the definition's kind (time window, static, dynamic, or
multi-partitions of those), one identifier column per dimension, no `Delta` beside it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import dagster as dg
import polars as pl

from pipeline_output.contract.checked_input import (
    CheckedInput,
    checked_input,
    collect_frame,
    to_polars,
)
from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.slices import (
    Equals,
    PartitionSlice,
    Term,
    TimeRange,
    covering,
    split_by_slices,
)
from pipeline_output.contract.spec import DatasetSpec, check_identifier
from pipeline_output.dagster_layer.asset_params import as_lazy
from pipeline_output.dagster_layer.checks import PARITY
from pipeline_output.dagster_layer.compute_context import CONTEXT_PARAMETER, KeyContext
from pipeline_output.errors import InvalidSpec, RowsOutsideWindow, UnsupportedWrite
from pipeline_output.services.publish import PublishResult, ResolvedMode
from pipeline_output.services.runtime import Runtime
from pipeline_output.stores.iceberg.write.range_write import LoadedAhead

_T = TypeVar("_T")

PARTITION_COLUMNS_KEY = "pipeline_output/partition_columns"
KEY_PARAMETER = "partition_key"
_SINGLE = ""  # the dimension name of a one-dimensional definition
_DIMENSIONS = (
    dg.TimeWindowPartitionsDefinition,
    dg.StaticPartitionsDefinition,
    dg.DynamicPartitionsDefinition,
)


def partition_columns_of(
    spec: DatasetSpec, partitions_def: Any, partition_column: Any
) -> dict[str, str] | None:
    """Dimension name -> partition column (`""` for a one-dimensional definition), or None for
    a dataset without Dagster partitions; refuses a misconfiguration (`InvalidSpec`)."""
    where = f"@dataset {spec.name!r}"
    if partitions_def is None:
        if partition_column is not None:
            raise InvalidSpec(f"{where}: partition_column needs a partitions_def")
        return None
    if spec.delta is not None:
        raise InvalidSpec(
            f"{where}: a delta dataset's partitions are its windows; pass Delta(...) or "
            "partitions_def=, not both"
        )
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        dims = {d.name: d.partitions_def for d in partitions_def.partitions_defs}
        if not isinstance(partition_column, Mapping) or set(partition_column) != set(dims):
            raise InvalidSpec(
                f"{where}: a multi-partitions definition needs partition_column={{dimension: "
                f"column}} for exactly its dimensions {sorted(dims)}, got {partition_column!r}"
            )
        columns = {str(d): str(c) for d, c in partition_column.items()}
    else:
        dims = {_SINGLE: partitions_def}
        if not isinstance(partition_column, str):
            raise InvalidSpec(
                f"{where}: partitions_def needs partition_column=<the column holding the "
                f"partition>, got {partition_column!r}"
            )
        columns = {_SINGLE: partition_column}
    for dim, definition in dims.items():
        if not isinstance(definition, _DIMENSIONS):
            raise InvalidSpec(
                f"{where}: partitions of kind {type(definition).__name__} are not supported "
                "(time-window, static, dynamic, or multi-partitions of those)"
            )
        check_identifier(columns[dim], what="partition column", dataset=spec.name)
    return columns


def slice_for(partitions_def: Any, columns: Mapping[str, str], key: str) -> PartitionSlice:
    """The slice of rows Dagster partition `key` stands for."""
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        by_dim = partitions_def.get_partition_key_from_str(key).keys_by_dimension
        dims = {d.name: d.partitions_def for d in partitions_def.partitions_defs}
        terms = tuple(_term(dims[d], columns[d], by_dim[d]) for d in sorted(columns))
        return PartitionSlice(key, terms)
    return PartitionSlice(key, (_term(partitions_def, columns[_SINGLE], key),))


def _term(definition: Any, column: str, key: str) -> Term:
    if isinstance(definition, dg.TimeWindowPartitionsDefinition):
        window = definition.time_window_for_partition_key(key)
        return TimeRange(column, window.start, window.end)
    return Equals(column, key)


def _ranker(partitions_def: Any, instance: Any) -> Callable[[str], Any]:
    """A sort key putting partition keys in the definition's order: time windows by their start,
    static keys as listed, dynamic keys as added (read from `instance`), a multi-partition key
    by its dimensions in turn."""
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        return lambda key: (
            partitions_def.time_window_for_partition_key(key).start.timestamp(),
            key,
        )
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        dims = [
            (d.name, _ranker(d.partitions_def, instance)) for d in partitions_def.partitions_defs
        ]

        def multi(key: str) -> Any:
            by_dim = partitions_def.get_partition_key_from_str(key).keys_by_dimension
            return tuple(rank(by_dim[name]) for name, rank in dims)

        return multi
    if partitions_def is None:
        return lambda key: (0, key)
    listed = partitions_def.get_partition_keys(dynamic_partitions_store=instance)
    index = {key: n for n, key in enumerate(listed)}
    return lambda key: (index.get(key, len(index)), key)


def _instance(context: Any) -> Any:
    """The run's instance (it holds the dynamic partitions), or None outside a run."""
    try:
        step = (
            context.step_context
            if isinstance(context, (dg.OutputContext, dg.InputContext))
            else context
        )
        return step.instance
    except dg.DagsterInvariantViolationError:  # a context built outside a run (a unit test)
        return None


def run_keys(context: Any, partitions_def: Any) -> list[str]:
    """The partition keys this step covers (several in a range run), in the definition's order."""
    if isinstance(context, dg.OutputContext):
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else []
    elif context.has_partition_key or context.has_partition_key_range:
        keys = list(context.partition_keys)
    else:
        keys = []
    if len(keys) < 2:
        return keys
    return sorted(keys, key=_ranker(partitions_def, _instance(context)))


@dataclass(frozen=True)
class PartitionedOutput:
    """A Dagster-partitioned dataset's output: per partition (in order) its slice and a
    zero-argument compute of its rows, written one by one."""

    items: tuple[tuple[PartitionSlice, Callable[[], Any]], ...]


def first_computed_while(
    out: PartitionedOutput, setup: Callable[[], _T]
) -> tuple[PartitionedOutput, _T]:
    """`out` with its first partition's rows computed on this thread while `setup` runs on
    another, and what `setup` returned: a partition run's write readies its runtime, mode and
    table (Postgres and catalog round trips, the table's metadata parsed) while the user's
    compute runs — mostly polars, which leaves the GIL and a core to it — instead of before
    it (issue 44). The compute's exception is raised as it is, `setup`'s outcome left to its
    thread; `setup`'s exception is raised once the compute ended, its rows dropped."""
    (part, compute), rest = out.items[0], out.items[1:]
    pool = ThreadPoolExecutor(1, thread_name_prefix="po-write-setup")
    try:
        ready = pool.submit(setup)
        rows = compute()
        made = ready.result()
    finally:
        pool.shutdown(wait=False)
    return PartitionedOutput(((part, lambda: rows), *rest)), made


def partitioned_output(
    context: dg.AssetExecutionContext,
    spec: DatasetSpec,
    fn: Callable[..., Any],
    inputs: Mapping[str, Any],
    *,
    columns: Mapping[str, str],
) -> PartitionedOutput:
    """One thunk per partition key of the run: the compute called for that key."""
    partitions_def = context.assets_def.partitions_def
    keys = run_keys(context, partitions_def)
    if not keys:
        raise UnsupportedWrite(
            f"dataset {spec.name!r} is partitioned by Dagster: materialise it for partitions, "
            "not unpartitioned; nothing was written"
        )
    takes = inspect.signature(fn).parameters
    takes_key, takes_context = KEY_PARAMETER in takes, CONTEXT_PARAMETER in takes
    same = _same_partitions_inputs(context, inputs, partitions_def)
    items = []
    for key in keys:
        part = slice_for(partitions_def, columns, key)

        def thunk(key: str = key) -> Any:
            args = {
                name: _for_key(value, key, same.get(name), partitions_def)
                for name, value in inputs.items()
            }
            if takes_key:
                args[KEY_PARAMETER] = key
            if takes_context:
                args[CONTEXT_PARAMETER] = KeyContext(context, key, partitions_def)
            try:
                out = fn(**args)
            except Exception as exc:  # which of a range's partitions, its type and message kept
                exc.add_note(f"(computing partition {key!r} of dataset {spec.name!r})")
                raise
            return collect_frame(spec, out)

        items.append((part, thunk))
    return PartitionedOutput(tuple(items))


def _same_partitions_inputs(
    context: dg.AssetExecutionContext, inputs: Mapping[str, Any], partitions_def: Any
) -> dict[str, dict[str, str]]:
    """Input name -> partition columns, for inputs from a dataset partitioned like this one."""
    out = {}
    layer = context.job_def.asset_layer
    for name in inputs:
        key = context.asset_key_for_input(name)
        if not layer.has(key):
            continue
        node = layer.get(key)
        raw = (node.metadata or {}).get(PARTITION_COLUMNS_KEY)
        if raw is not None and node.partitions_def == partitions_def:
            out[name] = columns_from_metadata(raw)
    return out


def columns_from_metadata(raw: Any) -> dict[str, str]:
    """The partition columns as asset metadata carries them (JSON, or a Dagster text value)."""
    value = getattr(raw, "value", raw)
    return dict(json.loads(value) if isinstance(value, str) else value)


def partition_columns_of_asset(asset: Any) -> tuple[str, ...]:
    """The partition columns of a Dagster-partitioned dataset's asset (one per dimension, in
    dimension-name order, as its slices list them); () for any other asset."""
    if not isinstance(asset, dg.AssetsDefinition):
        return ()
    for key in asset.keys:
        raw = asset.metadata_by_key.get(key, {}).get(PARTITION_COLUMNS_KEY)
        if raw is not None:
            columns = columns_from_metadata(raw)
            return tuple(columns[d] for d in sorted(columns))
    return ()


def _for_key(value: Any, key: str, columns: dict[str, str] | None, partitions_def: Any) -> Any:
    """An input as the compute of partition `key` receives it: a dataset partitioned like this
    one (`columns`: its partition columns) narrowed to the key's slice, a partitioned plain
    upstream's `{key: frame}` to that key's frame, anything else whole."""
    if isinstance(value, dict) and key in value:
        return as_lazy(value[key])
    lazy = as_lazy(value)
    if columns is None or not isinstance(lazy, pl.LazyFrame):
        return lazy
    return lazy.filter(slice_for(partitions_def, columns, key).contains(lazy.collect_schema()))


def narrowed_to_input_partitions(
    context: dg.InputContext, lazy: pl.LazyFrame, upstream_meta: Mapping[str, Any]
) -> pl.LazyFrame:
    """A Dagster-partitioned dataset read as an input, narrowed to the upstream partitions the
    step reads (a 7-day range run of a daily downstream: those 7 days), as one filter the scan
    pushes down (consecutive days: one range, `covering`); the whole table when the step reads
    every partition, when the upstream is not a partitioned dataset or the input has none."""
    raw = upstream_meta.get(PARTITION_COLUMNS_KEY)
    if raw is None or not context.has_asset_partitions:
        return lazy
    partitions_def = context.asset_partitions_def
    instance = _instance(context)
    keys = set(context.asset_partition_keys)
    every = partitions_def.get_partition_keys(dynamic_partitions_store=instance)
    if keys >= set(every):
        return lazy
    columns = columns_from_metadata(raw)
    slices = [
        slice_for(partitions_def, columns, k)
        for k in sorted(keys, key=_ranker(partitions_def, instance))
    ]
    return lazy.filter(covering(slices, lazy.collect_schema()))


def partitioned_frame(
    spec: DatasetSpec, frame: pl.DataFrame, slices: Sequence[PartitionSlice]
) -> PartitionedOutput:
    """A frame for the run's partitions computed outside `@dataset` (an asset of the user's own
    with this IO manager), split by slice; refused before any I/O when a row lies outside them."""
    if not slices:
        raise UnsupportedWrite(
            f"dataset {spec.name!r} is partitioned by Dagster: this run has no partition, so "
            "nothing was written"
        )
    if len(slices) == 1:
        return PartitionedOutput(((slices[0], lambda: frame),))
    parts, outside = split_by_slices(frame, slices)  # one pass for consecutive time windows
    if outside:
        raise RowsOutsideWindow(
            f"dataset {spec.name!r}: {outside} row(s) lie outside the partitions "
            f"{slices[0].key} .. {slices[-1].key} of this run; nothing was written"
        )
    return PartitionedOutput(tuple((s, _constant(p)) for s, p in zip(slices, parts, strict=True)))


def _constant(frame: pl.DataFrame) -> Callable[[], pl.DataFrame]:
    return lambda: frame


def partitioned_output_of(
    context: dg.OutputContext, spec: DatasetSpec, obj: Any
) -> PartitionedOutput | None:
    """The output of a Dagster-partitioned dataset as partitions to write (a plain frame from an
    asset of the user's own split by the run's partitions); None for any other dataset."""
    if isinstance(obj, PartitionedOutput):
        return obj
    raw = (context.definition_metadata or {}).get(PARTITION_COLUMNS_KEY)
    if raw is None:
        return None
    columns = columns_from_metadata(raw)
    partitions_def = context.asset_partitions_def if context.has_asset_partitions else None
    keys = run_keys(context, partitions_def)
    slices = [slice_for(partitions_def, columns, k) for k in keys]
    return partitioned_frame(spec, to_polars(spec, obj), slices)


def write_partitions(
    context: dg.OutputContext,
    spec: DatasetSpec,
    out: PartitionedOutput,
    mode: ResolvedMode,
    *,
    runtime: Runtime,
    audit: bool,
    note: str | None = None,
    ahead: LoadedAhead | None = None,
) -> tuple[dict[str, Any], PublishResult]:
    """Compute and write each partition in order (`Publisher.publish_range`: a `replace`
    dataset's range run in iceberg mode as one commit, otherwise one commit per partition);
    returns the step's materialisation metadata and the last partition's write. A one-partition
    run: its write's metadata, with `dagster/partition_row_count` (the rows it wrote) and
    `partitions` (its line). A range run: no step metadata (Dagster would copy it onto every
    partition's materialisation); each partition's materialisation gets its own write's figures
    (`partition_metadata`), and the last partition's — the asset's latest — also what is the same
    for the whole run, once rather than on each of N events (each event's metadata is serialised
    and stored: issue 44): the mode and arms, the run's span (`run_metadata`), a one-commit run's
    timings, the table after the run (name, location, row count, column schema, file counts) and
    the run's `partitions` line (`range_line`; docs/reference.md, "A range run's materialisations").
    `ahead`: the run's table, loaded while its first partition computed (`first_computed_while`).
    A range run logs one line saying what each partition did, and `note` after them
    (`parity_skip_note`); a one-partition run none — its materialisation's `partitions` is that
    line, and `parity` the note (each line is an event in the run's log)."""
    from pipeline_output.dagster_layer.metadata import publish_metadata, table_metadata

    schemas: list[pl.Schema] = []

    def rows_of(compute: Callable[[], Any]) -> Callable[[], CheckedInput]:
        def rows() -> CheckedInput:
            # converted and key-checked once: the write takes it as it is (`checked_input`)
            checked = checked_input(spec, compute())
            schemas[:] = [checked.frame.schema]  # the last partition's (the legacy arm's schema)
            return checked

        return rows

    written = runtime.publisher.publish_range(
        spec,
        ((part, rows_of(compute)) for part, compute in out.items),
        mode=mode,
        run_id=context.run_id,
        audit=audit,
        ahead=ahead,
    )
    schema = schemas[0] if schemas else None
    last = written[-1][1]
    if len(written) == 1:
        meta = publish_metadata(last, runtime=runtime, spec=spec, schema=schema)
        meta["dagster/partition_row_count"] = last.primary.rows_in
        meta["partitions"] = _line(written[0][0], last.primary)
        if note is not None:
            meta[PARITY] = note
        return meta, last
    # one line per range run (each log line is a Dagster event), its partitions in it
    said = range_line([(part.key, result.primary) for part, result in written])
    context.log.info(f"{spec.name}: {said}" + (f"; {note}" if note else ""))
    table = table_metadata(runtime, spec, arms=tuple(last.results), schema=schema)
    owns = [partition_metadata(result) for _, result in written]
    run = run_metadata(written, mode)
    for own in owns:  # the table after each write: the run's last says it once
        for key in TABLE_TOTAL_KEYS:
            own.pop(key, None)
    for key in TIMING_KEYS:  # a one-commit run's timings are the run's: said once
        values = {own.get(key) for own in owns}
        if len(values) == 1 and None not in values:
            run[key] = values.pop()
            for own in owns:
                del own[key]
    run.update(table)
    run["dagster/row_count"] = last.primary.rows_total_after
    for arm, res in last.results.items():
        run[f"{'iceberg' if arm == 'iceberg' else 'pg'}/rows_total_after"] = res.rows_total_after
    run["partitions"] = said
    owns[-1].update(run)  # the asset's latest materialisation: the run and the table after it
    for (part, _), own in zip(written, owns, strict=True):
        context.step_context.add_asset_metadata(
            own, asset_key=context.asset_key, partition_key=part.key
        )
    return {}, last


def range_line(written: Sequence[tuple[str, WriteResult]]) -> str:
    """What a range run's partitions did, in one line (its log line and the `partitions` of its
    last materialisation): each partition's row counts, in order; the commit and write mode
    once when every written partition shares them (a one-commit run), else on each; and a
    stretch of consecutive partitions that did the same shortened to its first and last keys
    (`2024-01-01 .. 2024-03-30 (90) +100000 ~0 -100000 each`) — a year's backfill is a line
    to read, not the same commit id 365 times."""
    commits = {(r.write_mode, r.snapshot_id) for _, r in written if not r.noop}
    shared = next(iter(commits)) if len(commits) == 1 else None

    def did(r: WriteResult) -> str:
        counts = f"+{r.rows_inserted} ~{r.rows_updated} -{r.rows_deleted}"
        if r.noop:
            return f"{counts} no-op"
        return (
            counts if shared is not None else f"{counts} ({r.write_mode}, commit {r.snapshot_id})"
        )

    stretches: list[tuple[str, str, int, str]] = []  # (first key, last key, partitions, what)
    for key, r in written:
        what = did(r)
        if stretches and stretches[-1][3] == what:
            first, _, n, _ = stretches[-1]
            stretches[-1] = (first, key, n + 1, what)
        else:
            stretches.append((key, key, 1, what))
    parts = "; ".join(
        f"{first}: {what}" if n == 1 else f"{first} .. {last} ({n}): {what} each"
        for first, last, n, what in stretches
    )
    head = f"{len(written)} partitions"
    if shared is not None:
        head += f", one commit {shared[1]} ({shared[0]})"
    return f"{head}: {parts}"


def _line(part: PartitionSlice, r: WriteResult) -> str:
    """What one partition's write did, in the run's line and its `partitions` metadata."""
    return f"{part.key}: +{r.rows_inserted} ~{r.rows_updated} -{r.rows_deleted} " + (
        "no-op" if r.noop else f"({r.write_mode}, commit {r.snapshot_id})"
    )


# what a range run's partitions leave to its last one (the asset's latest materialisation): the
# table's totals after each write (the run's last write's are the table after the run), and the
# timings when they are the same on every partition (one commit for the run: the run's timings)
TABLE_TOTAL_KEYS = ("dagster/row_count", "iceberg/rows_total_after", "pg/rows_total_after")
TIMING_KEYS = ("duration_s", "lock_wait_s", "lock_held_s")
# what is the same for the whole run, also on its last partition only
RUN_KEYS = ("mode", "arms")


def partition_metadata(result: PublishResult) -> dict[str, Any]:
    """One partition's write as its own materialisation records it: why, no-op, write mode, row
    counts, timings, `dagster/partition_row_count`, and each arm's commit (`no-op` when none)."""
    from pipeline_output.dagster_layer.metadata import write_metadata

    meta = write_metadata(result)
    for key in RUN_KEYS:
        del meta[key]
    meta["dagster/partition_row_count"] = result.primary.rows_in
    for arm in result.results:
        meta.setdefault("iceberg/snapshot_id" if arm == "iceberg" else "pg/deploy_id", "no-op")
    return meta


def run_metadata(
    written: Sequence[tuple[PartitionSlice, PublishResult]], mode: ResolvedMode
) -> dict[str, Any]:
    """What is true of every partition of a range run: the mode, the arms, the run's span and
    how many partitions were written or were no-ops (the table after the run is added beside)."""
    changed = sum(not r.primary.noop for _, r in written)
    first, last = written[0][0].key, written[-1][0].key
    return {
        "mode": f"{mode.mode} (from {mode.source})",
        "arms": ", ".join(mode.arms),
        "run_partitions": (
            f"{len(written)} partitions {first} .. {last}: {changed} written, "
            f"{len(written) - changed} no-op"
        ),
    }
