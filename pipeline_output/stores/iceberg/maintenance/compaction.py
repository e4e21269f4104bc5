"""`compact`: small files (and files with delete files) rewritten into files near the target size,
in one `replace` commit, safe beside concurrent writers.

Owns the order of a compaction:

1. plan on the current snapshot (`compaction_plan.plan_bins`), without the table lock;
2. read each bin's files — with their positional deletes applied — sort the rows by the table's
   sort order (the primary key by default) and write each bin as one data file, still without the
   lock (writers keep writing meanwhile), registered as a write in flight (`commit.py`: no
   orphan removal deletes the bins before the commit);
3. under the per-table writer lock: reload the table and check that every input data file is
   still live, with exactly the delete files it was read with, and that the schema and partition
   spec the files were written against are unchanged; then commit one `replace` snapshot that
   removes the inputs and the delete files applying only to them and adds the new files. Files
   other writers committed after the plan are not touched.

If a concurrent writer removed or changed an input (or the commit lost a race), the written files
are deleted and the compaction starts over from a fresh plan, at most `max_attempts` times; then
it raises `MaintenanceConflict`. Nothing is ever committed from a stale plan, so no writer's row is
lost or duplicated. The rows are the same multiset before and after (deletes applied).

A table with an audit staged on a branch that can still publish (write-audit-publish
fast-forwards main to it, so main must not move meanwhile) is skipped, saying so.
"""

from __future__ import annotations

import io
import operator
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any, cast

import polars as pl
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import _read_deletes
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import DateType, DoubleType, FloatType, IntegerType, LongType, StringType

from pipeline_output.contract.checked_input import polars_schema
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.version import VERSION
from pipeline_output.errors import (
    DatasetNotWritten,
    FilesRemoved,
    InvalidArgument,
    MaintenanceConflict,
)
from pipeline_output.infra.collector import paused
from pipeline_output.infra.faults import fault_injection
from pipeline_output.stores.iceberg.maintenance.compaction_plan import (
    DEFAULT_MIN_INPUT_FILES,
    Bin,
    CompactionPlan,
    plan_bins,
    planned_files,
    sort_keys,
    unpacked_integers,
)
from pipeline_output.stores.iceberg.snapshot.commit import (
    ReplaceFiles,
    delete_quietly,
    verify_written,
    writing,
)
from pipeline_output.stores.iceberg.snapshot.files import DEFAULT_TARGET_BYTES, DataFileWriter
from pipeline_output.stores.iceberg.snapshot.manifests import (
    READ_MANIFESTS,
    FlatTransaction,
    ManifestIndex,
    read_index,
)
from pipeline_output.stores.iceberg.table.manifest_decoding import file_paths, files_statistics
from pipeline_output.stores.iceberg.table.native_scan import quiet, storage, target_schema, typed
from pipeline_output.stores.iceberg.table.partitions import partition_columns
from pipeline_output.stores.iceberg.table.scan_planning import FixedTable
from pipeline_output.stores.iceberg.table.tables import (
    AUDIT_PREFIX,
    PROPERTY_PREFIX,
    ancestor_ids,
    head,
)
from pipeline_output.stores.iceberg.write.frame_rows import align_to_schema

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables

LAST_COMPACTION = f"{PROPERTY_PREFIX}last-compaction"  # table property: when, and what it did
DEFAULT_MAX_ATTEMPTS = 3
READ_BATCH_ROWS = 131_072  # rows per batch a bin is read in
# input files read by one scan (bins of many partitions): 4 MiB read 20,000 files of 4 KB (200
# partitions) as fast as 16 MiB with ~50 MB less resident memory — polars' reader holds memory
# per file in flight, and two groups are held (`_read_and_write`;
# benchmarks/results/small-files-maintenance.md, "Peak memory of the partitioned compaction")
READ_GROUP_BYTES = 4 * 1024 * 1024
# and at most this many input files: what polars' reader holds grows with the files of a scan,
# not their bytes (~13 KB a file of 4 KB while the scan runs) — 4 MiB of 4 KB files was 1,000
# files a scan. 512 took ~8 MB off the peak of compacting 20,000 small files in 200 partitions
# at the same speed; 256, ~12 MB but ~10 % slower: each scan costs polars a few ms to start
# (benchmarks/results/small-files-maintenance.md, "Compaction's peak: files per scan")
READ_GROUP_FILES = 512
Progress = Callable[[int, int], None]  # (bins done, bins planned)


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did (or, with `dry_run`, would do)."""

    dataset: str
    table: str
    dry_run: bool
    files_before: int  # live data files of the snapshot it was planned on
    bins: int
    files_rewritten: int
    delete_files_removed: int
    files_added: int
    rows: int
    bytes_rewritten: int
    bytes_added: int
    snapshot_id: int | None
    attempts: int
    duration_s: float
    skipped: str | None = None  # why nothing was planned, when it is not "nothing to rewrite"

    @property
    def noop(self) -> bool:
        return self.bins == 0

    def describe(self) -> str:
        """One line for logs and the CLI."""
        if self.skipped:
            return f"compact: skipped ({self.skipped})"
        if self.noop:
            return "compact: nothing to rewrite"
        verb = "would rewrite" if self.dry_run else "rewrote"
        deletes = (
            f" and {self.delete_files_removed} delete file(s)" if self.delete_files_removed else ""
        )
        into = f"{self.bins} bin(s)" if self.dry_run else f"{self.files_added} file(s)"
        return f"compact: {verb} {self.files_rewritten} data file(s){deletes} into {into}"


def compact(
    store: HasTables,
    spec: DatasetSpec,
    *,
    target_file_size: int | None = None,
    min_input_files: int = DEFAULT_MIN_INPUT_FILES,
    where: str | BooleanExpression | None = None,
    dry_run: bool = False,
    run_id: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    progress: Progress | None = None,
) -> CompactionResult:
    """Bin-pack the table's small files (and files with delete files) into files near
    `target_file_size` bytes (default: the table's `write.target-file-size-bytes`), partition by
    partition, sorted by the table's sort order; one `replace` commit (module docstring).

    `min_input_files`: a partition with fewer small files (and no deletes, and less than a target
    size of them) is left alone. `where`: only files that may hold rows matching this filter (a
    pyiceberg expression or its string form) are rewritten. `dry_run`: plan only.
    """
    if min_input_files < 1 or max_attempts < 1:
        raise InvalidArgument("compact: min_input_files and max_attempts must be at least 1")
    if target_file_size is not None and target_file_size < 1:
        raise InvalidArgument("compact: target_file_size must be a positive number of bytes")
    started = time.perf_counter()
    with paused():  # tens of thousands of manifest entries decoded: no collection walks them
        return _attempts(
            store,
            spec,
            target_file_size,
            min_input_files,
            where,
            dry_run,
            run_id,
            max_attempts,
            progress,
            started,
        )


def _attempts(
    store: HasTables,
    spec: DatasetSpec,
    target_file_size: int | None,
    min_input_files: int,
    where: str | BooleanExpression | None,
    dry_run: bool,
    run_id: str | None,
    max_attempts: int,
    progress: Progress | None,
    started: float,
) -> CompactionResult:
    for attempt in range(1, max_attempts + 1):
        table = store.tables.load(spec)
        if table is None:
            raise DatasetNotWritten(f"dataset {spec.name!r} has no Iceberg table to compact")
        audit = publishable_audit(table)
        if audit is not None:  # committing on main now would make that audit's publish fail
            empty = CompactionPlan(snapshot_id=None, target_bytes=0, data_files=0)
            skipped = f"an audit is staged on branch {audit}; compact after it is published"
            return _result(
                store, spec, empty, dry_run, [], 0, None, attempt, started, skipped=skipped
            )
        plan, index = _plan(table, spec, target_file_size, min_input_files, where)
        if dry_run or not plan.bins:
            return _result(store, spec, plan, dry_run, [], 0, None, attempt, started)
        try:
            return _rewrite(store, spec, table, plan, index, run_id, attempt, started, progress)
        except MaintenanceConflict:
            if attempt == max_attempts:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _plan(
    table: Table,
    spec: DatasetSpec,
    target: int | None,
    min_input_files: int,
    where: str | BooleanExpression | None,
) -> tuple[CompactionPlan, ManifestIndex]:
    index = read_index(table, bounds=planned_bounds(table, spec))
    live, all_deletes = planned_files(index)
    files, deletes = live, all_deletes
    if where is not None and index.snapshot_id is not None:
        scan = table.scan(row_filter=where, snapshot_id=index.snapshot_id)
        wanted = {t.file.file_path for t in scan.plan_files()}
        kept = list(map(wanted.__contains__, file_paths(live)))
        files = list(compress(live, kept))
        deletes = None if all_deletes is None else list(compress(all_deletes, kept))
    props = table.metadata.properties
    target_bytes = target or int(props.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES))
    plan = plan_bins(
        files,
        deletes=deletes,
        live=live,
        schema=table.schema(),
        sort_columns=tuple(name for name, _, _ in sort_keys(table.metadata, spec)),
        target_bytes=target_bytes,
        min_input_files=min_input_files,
        snapshot_id=index.snapshot_id,
    )
    return plan, index


def planned_bounds(table: Table, spec: DatasetSpec) -> frozenset[int]:
    """The columns whose statistics the plan reads (field ids): the first sort key's — the
    bins are ordered by its lower bounds (`compaction_plan`) and a bin streams when its files'
    key ranges follow each other (`_ranges_in_order`). The manifests are decoded with these
    only (`manifests.ManifestIndex.read`); the commit writes the removed entries from the
    values the plan decoded (`manifest_encoding.removed_manifest`)."""
    keys = sort_keys(table.metadata, spec)
    schema = table.schema()
    names = {f.name for f in schema.fields}
    return frozenset(schema.find_field(k).field_id for k, _, _ in keys[:1] if k in names)


def _rewrite(
    store: HasTables,
    spec: DatasetSpec,
    table: Table,
    plan: CompactionPlan,
    planned: ManifestIndex,
    run_id: str | None,
    attempt: int,
    started: float,
    progress: Progress | None,
) -> CompactionResult:
    writer = DataFileWriter(
        table.metadata, table.io, write_id=uuid.uuid4(), target_bytes=2**62
    )  # one output file per bin (and partition of the current spec)
    # a write in flight from its first file until its commit (`commit.py`)
    with writing(store, store.tables.table_name(spec)) as held:
        added: list[DataFile] = []
        handed = False
        try:
            rows = _read_and_write(table, spec, plan, writer, added, progress)
            removable = _removable_deletes(table, plan)
            with store.tables.hold(spec, on=held) as stats:
                current = store.tables.load(spec)
                if current is None:
                    raise MaintenanceConflict(f"dataset {spec.name!r}: the table was dropped")
                index = _current_index(current, planned)
                moved = index is not planned  # else every input is live, with the same deletes
                _check_unchanged(spec, table, current, plan, index.tasks() if moved else None)
                audit = publishable_audit(current)
                if audit is not None:
                    raise MaintenanceConflict(
                        f"dataset {spec.name!r}: an audit was staged on branch {audit} meanwhile"
                    )
                tx = FlatTransaction(current)
                when = datetime.now(UTC).isoformat(timespec="seconds")
                tx.set_properties(
                    {
                        LAST_COMPACTION: f"{when} rewrote {len(plan.input_files)} file(s) into "
                        f"{len(added)}"
                    }
                )
                producer = ReplaceFiles(tx, index=index, snapshot_properties=_props(spec, run_id))
                for data_file in added:
                    producer.append_data_file(data_file)
                producer.delete_data_files([*plan.input_files, *removable])
                try:
                    tx._apply(*producer._commit())
                    fault_injection("in_commit")
                    stats.verify()
                    if not stats.covers_files():  # (`commit.py`, "Writes in flight")
                        verify_written(table.io, producer, writer.written, dataset=spec.name)
                    handed = True  # from here a failure may leave the commit's outcome unknown
                    new_table = tx.commit_transaction()
                    _forget_planned(planned)
                    producer.release()
                except (CommitFailedException, ValidationException, FilesRemoved) as exc:
                    handed = False  # certain: the catalog did not swap
                    with suppress(Exception):
                        producer._clean_all_uncommitted()
                    raise MaintenanceConflict(
                        f"dataset {spec.name!r}: the compaction's commit lost a race ({exc})"
                    ) from exc
        finally:
            if not handed:  # never delete files a commit of unknown outcome may reference
                for path in writer.written:
                    delete_quietly(table.io, path)
    snap = new_table.current_snapshot()
    return _result(
        store,
        spec,
        plan,
        False,
        added,
        len(removable),
        snap.snapshot_id if snap else None,
        attempt,
        started,
        rows=rows,
    )


def _forget_planned(planned: ManifestIndex) -> None:
    """Drop the planner's reads (entries with the sort key's statistics only) from the
    process's kept reads once the commit is in: they serve no write, only another compaction's
    plan — of the manifests this commit replaced, none. Dropped while the collector is still
    paused, the entries die with the plan; kept, the collector's first pass after the
    compaction walked them all (~80,000 objects for 20,000 files, ~8 ms)."""
    bounds = planned.live.bounds
    if bounds is not None:
        READ_MANIFESTS.forget(planned.read_manifests(), bounds=bounds)


def _read_and_write(
    table: Table,
    spec: DatasetSpec,
    plan: CompactionPlan,
    writer: DataFileWriter,
    added: list[DataFile],
    progress: Progress | None,
) -> int:
    """Read the plan's bins group by group (`read_groups`) and write each group's output files
    (one per bin) while the next group is read: polars' reader leaves a core idle on small
    files, and the writer (Parquet encoding, footers, Iceberg statistics) uses it. At most one
    group is being written while one is read: the memory held is two groups' rows
    (at most `READ_GROUP_BYTES` and `READ_GROUP_FILES` of input files each), whatever the
    table's size. The rows read."""
    rows = done = 0
    pending: Future[list[DataFile]] | None = None
    pending_bins = 0
    with ThreadPoolExecutor(1, "po-compact-write") as pool:
        try:
            for group in read_groups(table, plan.bins):
                streamed = _stream_bin(table, group, spec, writer)
                if streamed is None:  # read into memory, sorted if need be, then written
                    frame = _read_bins(table, group, spec)
                    rows += frame.height
                    write = partial(writer.write, frame)
                    del frame
                else:
                    data, nans, count = streamed
                    rows += count
                    write = partial(_register, writer, data, nans)
                    del data
                if pending is not None:
                    added.extend(pending.result())  # a file per partition: per bin
                    done += pending_bins
                    if progress is not None:
                        progress(done, len(plan.bins))
                pending, pending_bins = pool.submit(write), len(group)
                del write
            if pending is not None:
                added.extend(pending.result())
                done += pending_bins
                if progress is not None:
                    progress(done, len(plan.bins))
                pending = None
        finally:
            if pending is not None:  # a read failed: the write in flight ends before cleanup
                with suppress(Exception):
                    pending.result()
    return rows


def _stream_bin(
    table: Table, bins: list[Bin], spec: DatasetSpec, writer: DataFileWriter
) -> tuple[bytes, dict[int, int], int] | None:
    """One bin of an unpartitioned table whose files are in key order — their key ranges, in
    the order the plan lists them, do not overlap — read and encoded as one Parquet file in a
    single streaming query of polars (the floor's own `scan_parquet(...).sink_parquet(...)`:
    reading and encoding overlap, and no row passes through Python), into memory: (the
    file's bytes, its NaN counts, its rows). The key column is read back from the bytes: a
    file that was not sorted inside (another engine's) makes it None, as does any bin this
    does not apply to (partitioned tables, several sort columns, files `_plain_files` refuses);
    `_read_bins` and the writer then do it. Memory: the encoded file, not the bin's rows."""
    metadata = table.metadata
    keys = sort_keys(metadata, spec)
    if len(bins) != 1 or metadata.spec().fields or len(keys) > 1 or any(d for _, d, _ in keys):
        return None
    (bin_,) = bins
    schema = table.schema()
    if bin_.spec_id != metadata.default_spec_id or not _plain_files(table, bins):
        return None
    if keys and not _ranges_in_order(schema, bin_.files, keys[0]):
        return None
    buffer = io.BytesIO()
    try:  # (the scan's schema reads the first file: a vanished one fails here too)
        rows = typed(_scan(table, bins, direct=True), target_schema(schema))
        have = rows.collect_schema()
        if not {f.name for f in schema.fields} <= set(have):
            return None  # a column the files do not hold (read the Iceberg way)
        with quiet():
            _aligned(rows, schema, have).sink_parquet(buffer, **writer.parquet_options())
    except (OSError, pl.exceptions.PolarsError) as exc:
        if not all(_exists(table.io, path) for path in bin_.paths):
            raise MaintenanceConflict(
                f"dataset {spec.name!r}: an input file of the compaction vanished: {exc}"
            ) from exc
        return None
    data = buffer.getvalue()
    floats = [f for f in schema.fields if isinstance(f.field_type, (FloatType, DoubleType))]
    check = pl.read_parquet(
        io.BytesIO(data), columns=[*(k for k, _, _ in keys), *(f.name for f in floats)]
    )
    if keys:
        name, descending, nulls_last = keys[0]
        if not check.get_column(name).is_sorted(descending=descending, nulls_last=nulls_last):
            return None
    if not check.height:
        return None
    nans = {f.field_id: int(check.get_column(f.name).is_nan().sum()) for f in floats}
    return data, nans, check.height


def _ranges_in_order(
    schema: Schema, files: tuple[DataFile, ...], key: tuple[str, bool, bool]
) -> bool:
    """Whether the files' key ranges (their lower and upper bounds of `key`), in this order,
    follow each other in ascending order without overlapping; unknown bounds, nulls, or a key
    of another kind of type: False."""
    name = key[0]
    field_ = schema.find_field(name)
    decode = _BOUND_DECODERS.get(type(field_.field_type))
    if decode is None:
        return False
    column = field_.field_id
    # (each file's bounds and null count taken once, by C-level getters, decoded without
    # pyiceberg's dispatch per value: 20,000 files' checks ran ~40 ms before the stream could
    # start)
    kinds = ("lower_bounds", "upper_bounds", "null_value_counts")
    lowers, uppers, nulls = files_statistics(files, kinds, column)
    if None in lowers or None in uppers:
        return False
    if any(nulls):
        return False
    starts: list[Any] | None = None
    ends: list[Any] | None = None
    if decode is _INTEGER:  # (all of one width, the usual case: one C call each)
        starts = unpacked_integers(cast(list[bytes], lowers))
        ends = unpacked_integers(cast(list[bytes], uppers))
    if starts is None or ends is None:
        starts = list(map(decode, cast(list[bytes], lowers)))
        ends = list(map(decode, cast(list[bytes], uppers)))
    return all(map(operator.gt, starts[1:], ends[:-1]))


# an Iceberg bound's single-value serialization decoded (as `pyiceberg.conversions.from_bytes`:
# little-endian integers, a long's 4 bytes when promoted from an int; UTF-8 strings), by C calls
_INTEGER = partial(int.from_bytes, byteorder="little", signed=True)
_BOUND_DECODERS: dict[type, Callable[[bytes], Any]] = {
    IntegerType: _INTEGER,
    DateType: _INTEGER,
    LongType: _INTEGER,
    StringType: partial(str, encoding="utf-8"),
}


def _aligned(rows: pl.LazyFrame, schema: Schema, have: pl.Schema) -> pl.LazyFrame:
    """`rows` (of schema `have`) with exactly the schema's columns in order, cast to the
    schema's polars types (`write.frame_rows.align_to_schema`, lazily)."""
    exprs = []
    for name, dtype in polars_schema(schema.as_arrow()).items():
        exprs.append(pl.col(name) if have[name] == dtype else pl.col(name).cast(dtype))
    return rows.select(exprs)


def _register(writer: DataFileWriter, data: bytes, nans: dict[int, int]) -> list[DataFile]:
    return [writer.register(data, record=None, nan_counts=nans)]


def _plain_files(table: Table, bins: list[Bin]) -> bool:
    """Whether the bins' files can be read as plain Parquet files by the names of the table's
    schema (`_scan`): local files without delete files, of a table that has had one schema only
    and no name mapping — every file then holds the schema's columns under their names."""
    metadata = table.metadata
    return (
        len(metadata.schemas) == 1
        and "schema.name-mapping.default" not in metadata.properties
        and not any(b.with_deletes for b in bins)
        and all(all(map(str.startswith, b.paths, repeat("file:///"))) for b in bins)
    )


def _scan(table: Table, bins: list[Bin], *, direct: bool) -> pl.LazyFrame:
    """The bins' rows: `direct`, polars' plain multi-file Parquet scan of their files' local
    paths (`_plain_files`; a file that does not hold the schema's columns fails it, and the
    caller reads again the other way); else polars' Iceberg scan planned to exactly those files
    (`scan_planning.FixedTable`: columns by field id, positional deletes applied). The plain
    scan skips the Iceberg scan's per-file work: ~10 % of reading 20,000 small files."""
    if direct:
        paths = chain.from_iterable(b.paths for b in bins)
        return pl.scan_parquet(
            list(map(str.removeprefix, paths, repeat("file://"))),
            glob=False,
            hive_partitioning=False,
        )
    tasks = tuple(t for b in bins for t in b.tasks)
    return pl.scan_iceberg(FixedTable.of(table, tasks), storage_options=storage(table))


def _current_index(current: Table, planned: ManifestIndex) -> ManifestIndex:
    """The manifest index of `current`'s snapshot: the one planned with when the table has not
    moved since (its manifests are already read), else read again."""
    snapshot = current.current_snapshot()
    if snapshot is not None and snapshot.snapshot_id == planned.snapshot_id:
        return planned
    return read_index(current)


def publishable_audit(table: Table) -> str | None:
    """An audit branch that can still publish — its history contains main's current snapshot,
    and publishing fast-forwards main there (`audit.publish_audit`) — if there is one."""
    main = head(table)
    if main is None:
        return None
    for name, ref in sorted(table.metadata.refs.items()):
        if name.startswith(AUDIT_PREFIX) and main in ancestor_ids(table, ref.snapshot_id):
            return name
    return None


def read_groups(table: Table, bins: list[Bin]) -> list[list[Bin]]:
    """The bins in groups read by one scan each: bins of distinct partitions of the table's
    current partition spec, up to `READ_GROUP_BYTES` and `READ_GROUP_FILES` input files together
    (a partitioned table's bins are small: one scan per bin spent most of its time starting the
    scan; a bin over either bound is a group of its own). The writer splits a group's rows by
    partition again: one file per bin. A bin of an older spec is read alone (the current spec
    may split or merge its rows differently)."""
    current = table.metadata.default_spec_id
    groups: list[list[Bin]] = []
    size = files = 0
    seen: set[Any] = set()
    for bin_ in bins:
        alone = bin_.spec_id != current
        key = bin_.partition
        if (
            not groups
            or alone
            or groups[-1][0].spec_id != current
            or key in seen
            or size + bin_.bytes > READ_GROUP_BYTES
            or files + len(bin_.files) > READ_GROUP_FILES
        ):
            groups.append([])
            size = files = 0
            seen = set()
        groups[-1].append(bin_)
        size += bin_.bytes
        files += len(bin_.files)
        seen.add(key)
    return groups


def _read_bins(table: Table, bins: list[Bin], spec: DatasetSpec) -> pl.DataFrame:
    """The bins' rows, deletes applied, aligned to the table schema and sorted.

    Read by polars' native Iceberg scan (`native_scan`) planned to exactly the bins' files
    (`scan_planning.FixedTable`): its multithreaded Parquet reader reads every file of the bin
    outside the GIL, applies their positional delete files and deletion vectors, and projects
    each file (whatever schema it was written with) onto the table's schema by field id; local
    files that need none of that are read by its plain Parquet scan (`_scan`). It is collected
    in batches of `READ_BATCH_ROWS`, each made contiguous: collected at once, a bin of 20,000
    small files became a frame of 20,000 chunks holding 2.5 times its data. Files already sorted
    and in key order (what windows of increasing keys leave) read back sorted: the sort is
    skipped then.

    Per scan, polars is asked little besides the read (a partitioned table's groups are many,
    `READ_GROUP_FILES`): the scan's schema resolved once, the sort checked in one query
    (`_sorted`), the frame kept as read when it has the table's types already."""
    schema = table.schema()
    target = target_schema(schema)
    for direct in (True, False) if _plain_files(table, bins) else (False,):
        try:
            scan = _scan(table, bins, direct=direct)
            have = scan.collect_schema()
            if direct and not {f.name for f in schema.fields} <= set(have):
                continue  # a column the files do not hold (an identity partition's source)
            rows = typed(scan, target, schema=have)
            with quiet():
                parts = [b.rechunk() for b in rows.collect_batches(chunk_size=READ_BATCH_ROWS)]
            frame = pl.concat(parts, rechunk=False) if parts else rows.collect()
            break
        except (OSError, pl.exceptions.PolarsError) as exc:
            if not all(_exists(table.io, path) for b in bins for path in b.paths):
                raise MaintenanceConflict(
                    f"dataset {spec.name!r}: an input file of the compaction vanished: {exc}"
                ) from exc
            if not direct:
                raise
    keys = sort_keys(table.metadata, spec)
    if keys and frame.height > 1 and not _sorted(frame, keys, _partition_values(table, frame)):
        frame = frame.sort(
            [k for k, _, _ in keys],
            descending=[d for _, d, _ in keys],
            nulls_last=[n for _, _, n in keys],
            maintain_order=True,
        )
    if list(frame.schema.items()) == list(target.items()):  # what `align_to_schema` returns
        return frame
    return align_to_schema(frame, schema)


def _partition_values(table: Table, frame: pl.DataFrame) -> pl.Series | None:
    """Each row's partition of the table's current spec (one value per partition), or None
    when the table is unpartitioned."""
    if not table.metadata.spec().fields:
        return None
    parts = partition_columns(frame, table.metadata)
    if len(parts) == 1:
        return parts[0]
    return pl.struct(parts, eager=True)


def _sorted(
    frame: pl.DataFrame, keys: list[tuple[str, bool, bool]], partitions: pl.Series | None
) -> bool:
    """Whether each partition's rows of `frame` are already in the order of `keys` (checked for
    a single key only), which the writer keeps when it splits the frame by partition: a group
    of bins of many partitions is sorted within each bin, not across them. With `partitions`,
    each partition's rows must be one run and the key non-decreasing within each run (a key
    with nulls is sorted instead)."""
    if len(keys) != 1:
        return False
    name, descending, nulls_last = keys[0]
    column = frame.get_column(name)
    if partitions is None:
        return column.is_sorted(descending=descending, nulls_last=nulls_last)
    key, part = pl.col("key"), pl.col("part")
    starts = (part != part.shift(1)).fill_null(True)
    ordered = (key <= key.shift(1)) if descending else (key >= key.shift(1))
    nulls, runs, distinct, in_order = (
        pl.DataFrame([column.alias("key"), partitions.alias("part")])
        .select(  # one query, not a Series operation each
            key.null_count(),
            starts.sum().alias("runs"),
            part.n_unique().alias("distinct"),
            (ordered.fill_null(True) | starts).all().alias("in_order"),
        )
        .row(0)
    )
    # a partition's rows in two runs, or a key with nulls: sorted instead
    return not nulls and runs == distinct and bool(in_order)


def _exists(io: FileIO, path: str) -> bool:
    try:
        return io.new_input(path).exists()
    except (OSError, ValueError):
        return False


def _removable_deletes(table: Table, plan: CompactionPlan) -> list[DataFile]:
    """Delete files that apply to no live data file other than the rewritten ones."""
    if not plan.delete_files:
        return []
    inputs = {f.file_path for f in plan.input_files}
    others = plan.live_paths - inputs
    out = []
    for delete_file in plan.delete_files:
        referenced = getattr(delete_file, "referenced_data_file", None)
        paths = {referenced} if referenced else set(_read_deletes(table.io, delete_file))
        if not paths & others:
            out.append(delete_file)
    return out


def _check_unchanged(
    spec: DatasetSpec,
    planned: Table,
    current: Table,
    plan: CompactionPlan,
    tasks: list[FileScanTask] | None,
) -> None:
    """Every input still live with the same delete files (`tasks`: the current snapshot's; None:
    the snapshot planned on); same schema and partition spec."""
    before, now = planned.metadata, current.metadata
    if (
        before.table_uuid != now.table_uuid
        or before.current_schema_id != now.current_schema_id
        or before.default_spec_id != now.default_spec_id
    ):
        raise MaintenanceConflict(
            f"dataset {spec.name!r}: the table was recreated or its schema or partitioning "
            "changed while compacting"
        )
    if tasks is None:
        return
    live: dict[str, FileScanTask] = {t.file.file_path: t for t in tasks}
    for bin_ in plan.bins:
        for path, read_with in zip(bin_.paths, bin_.deletes or repeat(()), strict=False):
            found = live.get(path)
            if found is None:
                raise MaintenanceConflict(
                    f"dataset {spec.name!r}: a concurrent write removed {path}, "
                    "which the compaction rewrote"
                )
            if {d.file_path for d in found.delete_files} != {d.file_path for d in read_with}:
                raise MaintenanceConflict(
                    f"dataset {spec.name!r}: a concurrent write deleted rows of "
                    f"{path}, which the compaction rewrote"
                )


def _props(spec: DatasetSpec, run_id: str | None) -> dict[str, str]:
    return {
        f"{PROPERTY_PREFIX}dataset": spec.name,
        f"{PROPERTY_PREFIX}maintenance": "compact",
        f"{PROPERTY_PREFIX}run-id": run_id or "",
        f"{PROPERTY_PREFIX}version": VERSION,
    }


def _result(
    store: HasTables,
    spec: DatasetSpec,
    plan: CompactionPlan,
    dry_run: bool,
    added: list[DataFile],
    deletes_removed: int,
    snapshot_id: int | None,
    attempts: int,
    started: float,
    *,
    rows: int | None = None,
    skipped: str | None = None,
) -> CompactionResult:
    return CompactionResult(
        dataset=spec.name,
        table=store.tables.table_name(spec),
        dry_run=dry_run,
        files_before=plan.data_files,
        bins=len(plan.bins),
        files_rewritten=len(plan.input_files),
        delete_files_removed=deletes_removed if not dry_run else len(plan.delete_files),
        files_added=len(added),
        rows=rows if rows is not None else sum(b.records for b in plan.bins),
        bytes_rewritten=plan.input_bytes,
        bytes_added=sum(f.file_size_in_bytes for f in added),
        snapshot_id=snapshot_id,
        attempts=attempts,
        duration_s=time.perf_counter() - started,
        skipped=skipped,
    )
