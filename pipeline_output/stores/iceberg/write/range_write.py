"""A range run's partitions as one commit (issue 44): a Dagster single-run backfill of N
partitions of a `replace` dataset is one table load, one writer lock and one snapshot.

Each partition is computed and checked (its rows inside its slice, the capabilities, NOT
NULLs) in turn on the calling thread, put there in the table's columns and order (its keys and
NaN counts taken), and written to data files on one of `ENCODE_THREADS` threads while the next
partitions are computed (polars' Parquet encode releases the GIL; the encode thread runs little
Python else, each step of which waits for the GIL the computing thread holds). Memory is a
small bounded batch: at most `ENCODE_FRAMES` partitions' frames are held at once (those waiting
or encoding and the one being computed), and the next partition is computed only once those
waiting or encoding are under `ENCODE_BYTES` — partitions larger than that are computed and
written one at a time. The queue is deeper than the threads because one partition's encode
(single-threaded in polars, zstd) takes longer than a small partition's compute: with one frame
of slack the computing thread waited for an encode on a third of a 90-partition run's
partitions while a core idled; with a few queued, the encodes catch up in the compute's gaps
(issue 44). Only each written
partition's key columns are kept (keys stay unique across the run). The files are written
against the table as this process's last write left it, else as loaded once — by the caller
while it computed the first partition (`LoadedAhead`: the Dagster IO manager), or here — (or,
for a table that does not exist yet, against the transaction that creates it). Then the table's writer lock
is taken and the commit planned on that same table, not loaded again, while the process holds
the project's writer lock (`IcebergTables.plans_from_memory`): the commit then asserts that base
(`merge.assert_base`), and when another engine committed in between (the commit refused, a file
planned from gone) the run's files are kept, the table loaded and the commit planned again on
it, once (without the writer lock, or after such a refusal: loaded under the lock, once) —, and
one snapshot replaces every slice of the run: files wholly inside a slice are dropped unread, files
straddling one are read and rewritten or kept with a positional delete file (`MergePolicy`),
and a keyed dataset's rows outside the slices whose key the run writes go too (a key moved
into a slice), as a one-partition replace does. That commit is planned while the last
partitions encode (`_plan_commit`: the table's manifests read, the files each slice replaces
found, straddling files rewritten, the rows each partition deletes counted — from each
partition's slice, rows and keys, known before its files are), and committed once their files
are written (`_finish_commit`): a one-partition run plans its commit during its encode,
instead of after it (issue 44). A failure anywhere before the commit — a compute raising, a
row outside its slice, an empty partition that would delete rows, an encode failing —
commits nothing and deletes the files written (the plan's rewrites too).

Each partition keeps its own `WriteResult` (its rows in, inserted, deleted from its slice)
and so its own deploy record and Dagster materialisation; they share the snapshot id. The
snapshot's summary names the run's first and last partition (`pipeline-output.partition`:
`first..last`).

A partition whose frame needs a schema or partition-spec evolution stops the range: the
partitions before it commit as one snapshot (`RangeWrite.stopped` hands back that partition
and its frame), and the publish step writes the rest one by one, each evolution under the
lock as a single write does. Only `replace` plans take this path (`combines`); other
strategies write partition by partition.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import polars as pl
import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from pipeline_output.contract.checked_input import checked_frame, polars_schema
from pipeline_output.contract.plan import RowCounts, WritePlan, WriteResult, plan_write
from pipeline_output.contract.slices import PartitionSlice, check_in_partition
from pipeline_output.contract.spec import STRATEGIES, DatasetSpec
from pipeline_output.errors import (
    DuplicateKeys,
    EmptyComputeRefused,
    FilesRemoved,
    LockLost,
    WriteConflict,
)
from pipeline_output.infra.locks import LockStats
from pipeline_output.stores.iceberg.snapshot.commit import (
    CommitRequest,
    commit,
    delete_quietly,
    row_properties,
    summary_properties,
    writing,
)
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter, file_arrow_schema
from pipeline_output.stores.iceberg.snapshot.manifests import (
    FlatTransaction,
    ManifestIndex,
    read_index,
    upgrade_properties,
)
from pipeline_output.stores.iceberg.table.partitions import needs_evolution, slice_test
from pipeline_output.stores.iceberg.table.tables import (
    PROPERTY_PREFIX,
    IcebergTables,
    head,
    state_of,
    total_records,
)
from pipeline_output.stores.iceberg.write.frame_rows import (
    RewriteSink,
    align_to_schema,
    sorted_for_write,
)
from pipeline_output.stores.iceberg.write.key_scan import FileReader, prune_by_keys
from pipeline_output.stores.iceberg.write.merge import (
    MergePolicy,
    assert_base,
    drop_from_file,
    live_rows,
)
from pipeline_output.stores.iceberg.write.prepare import MergeChanges
from pipeline_output.stores.schema import check_required, plan_evolution

if TYPE_CHECKING:
    from pipeline_output.contract.store_protocol import Capabilities
    from pipeline_output.stores.iceberg.table.tables import HasTables

_PART = "__po_part__"  # the index of the partition a key belongs to

ENCODE_THREADS = 2
"""The threads encoding a range run's partitions (two cores: more only add GIL hand-offs)."""
ENCODE_FRAMES = 6
"""The most partitions' frames a range run holds at once: those waiting or encoding and the one
being computed (100k rows of five columns: ~3 MB each)."""
ENCODE_BYTES = 64 * 1024 * 1024
"""The next partition is computed once the frames waiting or encoding hold less than this
(polars' estimate): a larger frame is encoded alone, larger ones queue fewer."""


def combines(spec: DatasetSpec) -> bool:
    """Whether a range run of `spec` is written as one commit: its partition write is a
    `replace` of the slice (the rows are written as they are; nothing is compared)."""
    strategy = STRATEGIES.get(spec.strategy)
    decision = strategy.decide("partition") if strategy is not None else None
    return (
        decision is not None
        and decision.write_mode == "replace"
        and decision.delete_scope == "slice"
        and spec.delta is None
    )


@dataclass
class SlicePart:
    """One partition of the run, its data files written: what the commit needs of it."""

    partition: PartitionSlice
    rows_in: int
    files: list[DataFile]
    keys: pl.DataFrame | None  # its key columns (keyed datasets)


@dataclass
class _Prepared:
    """One partition's frame ready for its encode (`_Target.prepare`)."""

    partition: PartitionSlice
    frame: pl.DataFrame
    keys: pl.DataFrame | None
    nan_counts: dict[int, int]


@dataclass(frozen=True)
class LoadedAhead:
    """The table a range run writes its files against, loaded before the run's first partition
    was computed, while it computed (`IcebergStore.load_ahead`): a caller that computes that
    partition itself hands it to `write_range` instead of the run loading it after. `table`
    None: the table did not exist then. It stands for the load `write_range` makes before the
    writer lock (the same table, a few milliseconds older): the commit plans and asserts it
    under the lock as it does a table loaded there. `schemas`: the table's schema as its files
    are written, in Arrow and in polars (`loaded_ahead`)."""

    table: Table | None
    schemas: tuple[pa.Schema, pl.Schema] | None = field(default=None, compare=False)


def loaded_ahead(table: Table | None) -> LoadedAhead:
    """`table`, loaded ahead, with the schemas its run's files are written with, converted now
    (~1 ms of a fresh process's first conversions, then off the path after the compute)."""
    return LoadedAhead(table, None if table is None else _schemas(table.metadata.schema()))


def _schemas(schema: Schema) -> tuple[pa.Schema, pl.Schema]:
    """`schema` as a table's data files are written (`file_arrow_schema`), and its polars
    columns."""
    arrow = file_arrow_schema(schema)
    return arrow, polars_schema(arrow)


@dataclass
class RangeWrite:
    """What `write_range` did: each committed partition's result, in order, and the partition
    it stopped at (its frame needs an evolution: written one by one from there), if any."""

    results: list[tuple[PartitionSlice, WriteResult]] = field(default_factory=list)
    stopped: tuple[PartitionSlice, pl.DataFrame] | None = None


# Iceberg types whose polars type (`polars_schema` of the table's Arrow schema) converts back to
# the same Iceberg type: a frame of exactly the table's polars columns plans no evolution
_PLAIN_TYPES = frozenset(
    {
        BooleanType,
        IntegerType,
        LongType,
        FloatType,
        DoubleType,
        DecimalType,
        DateType,
        TimeType,
        TimestampType,
        TimestamptzType,
        StringType,
        BinaryType,
    }
)


@dataclass
class _Target:
    """The table metadata the run's files are written against: the table as loaded, or the
    transaction creating it (`create`)."""

    metadata: TableMetadata
    io: FileIO
    create: Transaction | None = None
    handed: bool = False  # its files went to a commit attempt (its outcome deletes them)
    # the schema's Arrow and polars forms, converted already (`LoadedAhead.schemas`)
    schemas: tuple[pa.Schema, pl.Schema] | None = None
    writer: DataFileWriter = field(init=False)

    def __post_init__(self) -> None:
        # once a run, not per partition: the writer's Arrow schema (its encodes use it too)
        arrow, self.columns = self.schemas or _schemas(self.schema)
        self.writer = DataFileWriter(
            self.metadata, self.io, write_id=uuid.uuid4(), arrow_schema=arrow
        )
        self.plain = all(type(f.field_type) in _PLAIN_TYPES for f in self.schema.fields)

    @property
    def schema(self) -> Schema:
        return self.metadata.schema()

    def fits(self, spec: DatasetSpec, frame: pl.DataFrame) -> bool:
        """Whether `frame` is written as it is against this schema and partition spec."""
        check_required(spec, frame, self.schema)
        # a frame of the table's own columns and polars types, all of types that read back as
        # themselves, needs no schema change: its planning's Arrow and Iceberg conversions of
        # the frame's columns (~0.6 ms of a fresh process's one-partition write) are not made
        own = self.plain and frame.schema == self.columns
        if not own and not plan_evolution(spec, self.schema, frame).empty:
            return False
        return not needs_evolution(spec, self.metadata)

    def prepare(self, spec: DatasetSpec, part: PartitionSlice, frame: pl.DataFrame) -> _Prepared:
        """`frame` in the table's columns and sort order, its keys and NaN counts: on the
        calling thread, so that the encode thread's work is the encode and the file's put (each
        Python step on it waits for the GIL the computing thread holds: issue 44)."""
        # a frame in the table's columns, order and types already (the usual range run) is
        # taken as it is: no polars query per partition on the computing thread
        same = frame.schema == self.columns
        aligned = frame if same else align_to_schema(frame, self.schema, target=self.columns)
        aligned = sorted_for_write(aligned, spec)
        pk = list(spec.primary_key)
        keys = aligned.select(pk) if pk else None
        return _Prepared(part, aligned, keys, self.writer.nan_counts(aligned))

    def part_of(self, prepared: _Prepared) -> SlicePart:
        """The partition as the commit sees it, its files to come (`write`): what the commit
        plans from (its slice, rows, keys) is known before its encode ends."""
        return SlicePart(prepared.partition, prepared.frame.height, [], prepared.keys)

    def write(self, prepared: _Prepared, part: SlicePart) -> None:
        """Encode `prepared` to data files, the files then `part`'s."""
        part.files = self.writer.write(prepared.frame, nan_counts=prepared.nan_counts)

    def same_table(self, table: Table) -> bool:
        meta, mine = table.metadata, self.metadata
        return (
            meta.table_uuid == mine.table_uuid
            and meta.location == mine.location
            and meta.current_schema_id == mine.current_schema_id
            and meta.default_spec_id == mine.default_spec_id
        )


def write_range(
    store: HasTables,
    spec: DatasetSpec,
    items: Iterator[tuple[PartitionSlice, Callable[[], Any]]],
    *,
    capabilities: Capabilities,
    run_id: str | None = None,
    ahead: LoadedAhead | None = None,
) -> RangeWrite:
    """Compute, check and write each partition of `items` to data files in turn, then replace
    every slice in one commit under the writer lock (see the module doc). `items` is consumed
    up to the partition the run stops at (`RangeWrite.stopped`), if any. `ahead`: the table,
    loaded while the caller computed the first partition (not loaded again)."""
    started = time.perf_counter()
    tables = store.tables
    last = tables.as_written(spec)
    if last is not None:
        base: Table | None = last
    else:
        base = ahead.table if ahead is not None else tables.load(spec)
    # planned from the table as this process's last write left it, else as loaded (here or by
    # the caller, ahead) before the lock (no second load under it) while it holds the project's
    # writer lock: the commit asserts it (`IcebergStore.write`'s `_from_memory`); a table that
    # moved in between is loaded under the lock and the commit planned again
    remembered = base if base is not None and tables.plans_from_memory(spec) else None
    out = RangeWrite()
    target: _Target | None = None
    parts: list[SlicePart] = []
    with ExitStack() as stack:
        held = stack.enter_context(writing(store, tables.table_name(spec)))
        try:
            # the pool's exit waits for every encode: a failure deletes all files written
            with ThreadPoolExecutor(ENCODE_THREADS, "po-range-encode") as pool:
                encoding: deque[tuple[Future[None], int]] = deque()
                try:
                    for part, compute in items:
                        while encoding and (
                            len(encoding) >= ENCODE_FRAMES
                            or sum(size for _, size in encoding) >= ENCODE_BYTES
                        ):
                            encoding.popleft()[0].result()
                        frame = checked_frame(spec, compute())
                        capabilities.check_frame(spec, frame)
                        check_in_partition(spec, frame, part)
                        if target is None:
                            target = _target(tables, spec, base, frame, ahead)
                        if not target.fits(spec, frame):
                            out.stopped = (part, frame)
                            break
                        size = int(frame.estimated_size())
                        prepared = target.prepare(spec, part, frame)
                        del frame
                        parts.append(target.part_of(prepared))
                        encoding.append((pool.submit(target.write, prepared, parts[-1]), size))
                        del prepared
                    if target is None or not parts:
                        return out

                    def drain() -> None:
                        while encoding:
                            encoding.popleft()[0].result()

                    # the lock, the table, its manifests and the commit's plan while the last
                    # partitions encode; the commit once they are written
                    with tables.hold(spec, on=held) as stats:
                        # the lock's check, asked once now while the files encode: the session's
                        # first look at `pg_locks` (~1 ms on a fresh session) is not then on the
                        # path to the swap, whose check right before it is a plain round trip
                        stats.verify()
                        plan = partial(_plan_commit, tables, spec, target, parts, run_id=run_id)
                        finish = partial(_finish_commit, tables, spec, target, parts, fence=stats)
                        outcome = None
                        if remembered is not None:
                            outcome = _from_memory(
                                tables, spec, target, remembered, plan, finish, drain
                            )
                        if outcome is None:
                            planned = plan(tables.load_since(spec, last))
                            _drained(drain, planned)
                            outcome = finish(planned)
                        results, committed = outcome
                        tables.remember(spec, committed)
                except BaseException:
                    for pending, _ in encoding:
                        pending.cancel()
                    raise
        except BaseException:
            if target is not None and not target.handed:
                for path in target.writer.written:
                    delete_quietly(target.io, path)
            raise
    elapsed = time.perf_counter() - started
    name = tables.table_name(spec)
    out.results = [
        (
            p.partition,
            replace(
                r,
                duration_s=elapsed,
                lock_wait_s=stats.wait_s,
                lock_held_s=stats.held_s,
                table=name,
            ),
        )
        for p, r in zip(parts, results, strict=True)
    ]
    return out


def _target(
    tables: IcebergTables,
    spec: DatasetSpec,
    base: Table | None,
    frame: pl.DataFrame,
    ahead: LoadedAhead | None,
) -> _Target:
    if base is not None:
        given = ahead.schemas if ahead is not None and ahead.table is base else None
        return _Target(base.metadata, base.io, schemas=given)
    tx = tables.create_transaction(spec, frame)
    return _Target(tx.table_metadata, tx._table.io, create=tx)


def _from_memory(
    tables: IcebergTables,
    spec: DatasetSpec,
    target: _Target,
    table: Table,
    plan: Callable[..., _CommitPlan],
    finish: Callable[[_CommitPlan], tuple[list[WriteResult], Table | None]],
    drain: Callable[[], None],
) -> tuple[list[WriteResult], Table | None] | None:
    """The run's commit planned on `table` as this process's last write left it, without
    loading it, the commit asserting that base (`merge.assert_base`); None when the table moved
    since (another engine's commit refused it, a file it planned from is gone, the table is
    gone, or an empty partition's refusal was judged on a table that moved), with nothing
    committed and the run's data files kept — the caller then loads the table and plans the
    commit again, once. The files a refused attempt wrote itself (rewrites of straddling files)
    are deleted as on any failure."""
    try:
        planned = plan(table, asserted=True)
    except EmptyComputeRefused:
        now = tables.load(spec)
        if now is not None and now.metadata_location == table.metadata_location:
            raise  # judged on the table as it is
        tables.contended(spec, by_others=True)
        return None
    except (FileNotFoundError, NoSuchTableError):
        tables.contended(spec, by_others=True)
        return None
    _drained(drain, planned)
    try:
        return finish(planned)
    except WriteConflict as exc:
        # certainly not committed, the run's files kept (`CommitRequest.keep`): its own again —
        # deleted when it fails, as files not yet handed to a commit are
        target.handed = False
        if isinstance(exc, (LockLost, FilesRemoved)):
            raise
    except (FileNotFoundError, NoSuchTableError):
        target.handed = False  # the catalog refused a commit to a table that is gone
    tables.contended(spec, by_others=True)
    return None


@dataclass
class _CommitPlan:
    """The run's one commit as planned while its last partitions encode (`_plan_commit`):
    everything but its new data files, which `_finish_commit` adds once they are written.
    `tx` None: nothing is replaced (a new table, or its first deploy): every file is an insert."""

    table: Table | None
    plans: list[WritePlan]
    props: dict[str, str]
    asserted: bool
    tx: Transaction | None = None
    index: ManifestIndex | None = None
    total_before: int = 0
    changes: MergeChanges = field(default_factory=MergeChanges)
    deleted: list[int] = field(default_factory=list)


def _plan_commit(
    tables: IcebergTables,
    spec: DatasetSpec,
    target: _Target,
    parts: list[SlicePart],
    table: Table | None,
    *,
    run_id: str | None,
    asserted: bool = False,
) -> _CommitPlan:
    """The run's commit on `table` (loaded under the writer lock, or — `asserted` — as this
    process's last write left it: the commit then asserts it as its base, `merge.assert_base`),
    planned from each partition's slice, rows and keys while their files are still encoding:
    the table's manifests read, the files each slice replaces found, straddling files rewritten
    or given positional deletes (`_replace_slices`), an empty partition that would delete rows
    refused (`EmptyComputeRefused`, nothing written). A table created, dropped or changed in
    schema or partitioning since the run was planned refuses it (`WriteConflict`)."""
    name = tables.table_name(spec)
    if target.create is not None and table is not None:
        raise WriteConflict(
            f"dataset {spec.name!r}: {name} was created by another writer after this range run "
            "was planned; nothing was committed — run it again"
        )
    if target.create is None and table is None:
        raise WriteConflict(
            f"dataset {spec.name!r}: {name} was dropped while this range run wrote its files; "
            "nothing was committed — run it again"
        )
    if table is not None and not target.same_table(table):
        raise WriteConflict(
            f"dataset {spec.name!r}: {name}'s schema or partitioning changed while this range "
            "run wrote its files; nothing was committed — run it again"
        )
    state = state_of(table)
    plans = [plan_write(spec, state, partition=p.partition) for p in parts]
    _check_unique_keys(spec, parts)
    props = summary_properties(spec, plans[0], run_id)
    props[f"{PROPERTY_PREFIX}partition"] = f"{parts[0].partition.key}..{parts[-1].partition.key}"
    planned = _CommitPlan(table, plans, props, asserted)
    if table is None or state.first_deploy:  # nothing to replace: every file is an insert
        inserted = sum(p.rows_in for p in parts)
        props.update(row_properties(RowCounts(inserted=inserted), added_are_inserts=True))
        return planned
    tx = planned.tx = FlatTransaction(table)
    if asserted:
        assert_base(tx, MAIN_BRANCH)
    upgrade_properties(tx)
    index = planned.index = read_index(table)
    schema = tx.table_metadata.schema()
    planned.total_before = total_records(table)
    changes, deleted = _replace_slices(spec, table, tx, index.tasks(), schema, parts)
    try:
        for p, gone in zip(parts, deleted, strict=True):
            if p.rows_in == 0 and gone and not spec.allow_empty:
                raise EmptyComputeRefused(
                    f"dataset {spec.name!r}: the compute returned no rows for partition "
                    f"{p.partition.key} and its replace would delete {gone} target row(s); set "
                    "allow_empty=True to allow it (nothing was written)"
                )
    except BaseException:
        for data_file in changes.written:
            delete_quietly(table.io, data_file.file_path)
        raise
    props.update(row_properties(changes))
    planned.changes, planned.deleted = changes, deleted
    return planned


def _discard(planned: _CommitPlan, io: FileIO) -> None:
    """Delete the files a plan wrote itself (rewrites of straddling files): it is not committed."""
    for data_file in planned.changes.written:
        delete_quietly(io, data_file.file_path)


def _drained(drain: Callable[[], None], planned: _CommitPlan) -> None:
    """Wait for every partition's files (`drain`); an encode that failed leaves the plan
    uncommitted: the files it wrote itself go."""
    try:
        drain()
    except BaseException:
        if planned.table is not None:
            _discard(planned, planned.table.io)
        raise


def _finish_commit(
    tables: IcebergTables,
    spec: DatasetSpec,
    target: _Target,
    parts: list[SlicePart],
    planned: _CommitPlan,
    *,
    fence: LockStats,
) -> tuple[list[WriteResult], Table | None]:
    """The one commit of the run, under the writer lock, as `planned` with every partition's
    files written: each partition's result, and the table as the commit left it (None: reload
    it next time). When the plan was made on the table as this process's last write left it
    (`asserted`), a refused commit leaves the run's files in place for the plan made again on
    the table loaded (`CommitRequest.keep`)."""
    table, plans, props = planned.table, planned.plans, planned.props
    ready = [f for p in parts for f in p.files]
    kept = frozenset(f.file_path for f in ready) if planned.asserted else frozenset()
    if planned.tx is None:  # nothing to replace: every file is an insert
        tx = target.create if table is None else FlatTransaction(table)
        assert tx is not None
        if planned.asserted and table is not None:
            assert_base(tx, MAIN_BRANCH)
        target.handed = True
        try:
            committed = commit(
                CommitRequest(
                    tx=tx,
                    dataset=spec.name,
                    properties=props,
                    ready=ready,
                    force=True,
                    fence=fence,
                    keep=kept,
                )
            )
        except TableAlreadyExistsError as exc:
            for data_file in ready:
                delete_quietly(target.io, data_file.file_path)
            raise WriteConflict(
                f"dataset {spec.name!r}: {tables.table_name(spec)} was created by another "
                "writer after this range run was planned; nothing was committed — run it again"
            ) from exc
        after = tables.load(spec) if table is None else committed
        snap = after.current_snapshot() if after is not None else None
        inserted = sum(p.rows_in for p in parts)
        results = [
            WriteResult.inserts(
                plan,
                p.rows_in,
                arm="iceberg",
                snapshot_id=snap.snapshot_id if snap else None,
                files_added=len(p.files),
            )
            for plan, p in zip(plans, parts, strict=True)
        ]
        return _totals(results, inserted), after
    changes = planned.changes
    target.handed = True  # the commit deletes its files when it certainly failed
    committed = commit(
        CommitRequest(
            tx=planned.tx,
            dataset=spec.name,
            properties=props,
            frames=changes.new_frames,
            ready=[*ready, *changes.written],
            deleted=changes.deleted_files,
            positional=changes.positional,
            fence=fence,
            index=planned.index,
            keep=kept,
        )
    )
    snapshot_id = head(committed)
    total_before = planned.total_before
    results = [
        WriteResult.of(
            plan,
            RowCounts(inserted=p.rows_in, deleted=gone),
            rows_in=p.rows_in,
            total_before=total_before,
            arm="iceberg",
            snapshot_id=snapshot_id,
            files_added=len(p.files),
        )
        for plan, p, gone in zip(plans, parts, planned.deleted, strict=True)
    ]
    return _totals(results, total_before + changes.inserted - changes.deleted), committed


def _totals(results: list[WriteResult], total_after: int) -> list[WriteResult]:
    """Every partition's result with the table's row count after the run's one commit."""
    return [replace(r, rows_total_after=total_after) for r in results]


def _check_unique_keys(spec: DatasetSpec, parts: list[SlicePart]) -> None:
    """`DuplicateKeys` when a key is in two partitions' rows (a key lies in one slice: nothing
    is committed). Partitions whose one-column key ranges do not overlap (ids growing with the
    day) are not hashed."""
    pk = list(spec.primary_key)
    if not pk or _disjoint(pk, [p.keys for p in parts if p.keys is not None]):
        return
    keys = _keys_frame(parts)
    assert keys is not None
    dup = keys.filter(keys.select(pk).is_duplicated())
    if dup.height:
        first = dup.row(0, named=True)
        where = sorted({parts[n].partition.key for n in dup.get_column(_PART).to_list()})
        raise DuplicateKeys(
            f"dataset {spec.name!r}: key {tuple(first[c] for c in pk)!r} (and "
            f"{dup.select(pk).n_unique() - 1} more) is in the rows of several partitions "
            f"of this range run ({', '.join(where[:4])}); a key lies in one partition's "
            "slice — nothing was written"
        )


def _keys_frame(parts: list[SlicePart]) -> pl.DataFrame | None:
    """The keys the run writes, each with its partition's index (None: an unkeyed dataset)."""
    frames = [
        p.keys.with_columns(pl.lit(n, dtype=pl.Int64).alias(_PART))
        for n, p in enumerate(parts)
        if p.keys is not None
    ]
    return pl.concat(frames) if frames else None


def _disjoint(pk: list[str], frames: list[pl.DataFrame]) -> bool:
    """Whether no key can be in two of `frames` by their one-column key's min and max alone
    (each frame's keys are unique already: `checked_input`)."""
    if len(pk) != 1:
        return False
    bounds: list[tuple[Any, Any]] = [
        (f.get_column(pk[0]).min(), f.get_column(pk[0]).max()) for f in frames if f.height
    ]
    if any(lo is None or hi is None for lo, hi in bounds):
        return False
    try:
        bounds.sort()
        return all(a[1] < b[0] for a, b in itertools.pairwise(bounds))
    except TypeError:  # keys that do not order
        return False


def _replace_slices(
    spec: DatasetSpec,
    table: Table,
    tx: Transaction,
    tasks: list[FileScanTask],
    schema: Schema,
    parts: list[SlicePart],
) -> tuple[MergeChanges, list[int]]:
    """What one snapshot replacing every slice of `parts` removes (the run's own files are
    added by the caller), and how many target rows each partition's slice loses."""
    slices = [p.partition for p in parts]
    deleted = [0] * len(parts)
    pk = list(spec.primary_key)
    changes = MergeChanges(inserted=sum(p.rows_in for p in parts))
    tests = [slice_test(schema, part) for part in slices]  # each slice's bounds resolved once
    relations = [(task, _relation(task, tests)) for task in tasks]
    outside = _may_hold_keys(spec, schema, parts, [t for t, where in relations if where is None])
    reads = outside or any(w == "straddles" or t.delete_files for t, w in relations)
    keys = _keys_frame(parts) if pk and reads else None  # only when a file is read
    # a file outside every slice is read only when it may hold a key the run writes
    by_key = (
        {id(t) for t in prune_by_keys(table, spec, keys, outside)} if keys is not None else set()
    )
    straddling: list[FileScanTask] = []
    for task, where in relations:
        if where is None and id(task) not in by_key:
            changes.preserved += live_rows(task)
        elif isinstance(where, int) and not task.delete_files:
            changes.deleted_files.append(task.file)
            changes.deleted += task.file.record_count
            deleted[where] += task.file.record_count
        else:
            straddling.append(task)
    if not straddling:
        return changes, deleted
    policy = MergePolicy.resolve(spec, tx.table_metadata, "replace").within_budget(
        sum(t.file.file_size_in_bytes for t in straddling)
    )
    writer = DataFileWriter(tx.table_metadata, table.io, write_id=uuid.uuid4())
    sink = RewriteSink(writer, spec)
    reader = FileReader(table, schema)
    try:
        for task, rows in reader.stream(straddling):
            owner = pl.Series(_PART, [-1] * rows.height, dtype=pl.Int64)
            for n, part in enumerate(slices):
                inside = rows.select(part.contains(rows.schema)).to_series()
                owner = owner.zip_with(~inside | (owner >= 0), pl.Series([n] * rows.height))
            if keys is not None:
                hit = rows.select(pk).join(keys, on=pk, how="left", nulls_equal=True)
                moved = hit.get_column(_PART).fill_null(-1).cast(pl.Int64)
                owner = owner.zip_with(owner >= 0, moved)
            drop = owner >= 0
            if drop_from_file(changes, task, rows, drop, policy=policy, io=table.io, sink=sink):
                for n, count in owner.filter(drop).value_counts().iter_rows():
                    deleted[n] += count
    except BaseException:
        for path in writer.written:
            delete_quietly(table.io, path)
        raise
    changes.written = sink.files
    changes.new_frames = sink.rest()
    return changes, deleted


def _may_hold_keys(
    spec: DatasetSpec, schema: Schema, parts: list[SlicePart], tasks: list[FileScanTask]
) -> list[FileScanTask]:
    """`tasks` (files outside every slice) less those whose bounds of a one-column integer key
    lie outside the run's keys' min..max: they hold none of its keys, as `prune_by_keys` would
    find — cut without building the run's keys frame (ids growing with the day: every other
    day's file, each run)."""
    pk = spec.primary_key
    if len(pk) != 1 or not tasks:
        return tasks
    field = schema.find_field(pk[0])
    if not isinstance(field.field_type, (IntegerType, LongType)):
        return tasks
    frames = [p.keys.get_column(pk[0]) for p in parts if p.keys is not None and p.keys.height]
    if not frames:
        return tasks
    lows, highs = [f.min() for f in frames], [f.max() for f in frames]
    if not all(isinstance(v, int) for v in (*lows, *highs)):
        return tasks
    low, high = min(cast(list[int], lows)), max(cast(list[int], highs))
    fid, ftype = field.field_id, field.field_type
    kept = []
    for task in tasks:
        lower, upper = task.file.lower_bounds, task.file.upper_bounds
        lo_b, hi_b = (lower.get(fid) if lower else None), (upper.get(fid) if upper else None)
        if (
            lo_b is None
            or hi_b is None
            or not (
                cast(int, from_bytes(ftype, hi_b)) < low
                or cast(int, from_bytes(ftype, lo_b)) > high
            )
        ):
            kept.append(task)
    return kept


def _relation(task: FileScanTask, tests: list[Callable[[FileScanTask], str]]) -> int | str | None:
    """The index of the slice `task`'s file lies wholly inside (`tests`: each slice's
    `slice_test`), None when it lies outside every slice, `straddles` otherwise."""
    straddles = False
    for n, test in enumerate(tests):
        relation = test(task)
        if relation == "inside":
            return n
        straddles = straddles or relation == "straddles"
    return "straddles" if straddles else None
