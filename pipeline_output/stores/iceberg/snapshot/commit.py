"""The single commit of a native write (with its conflict checks), streaming batches to data
files, deleting files quietly, and the test-only fault injection points.

`IndexedOverwrite`: the snapshot producer of every native write that removes or adds files.

pyiceberg's overwrite producer, planned from a `manifests.ManifestIndex` (read once per write)
instead of re-reading every manifest twice, and aware of delete files:

- it rewrites only the manifests that hold a removed file (a data manifest the write did not
  plan from is carried forward unread), from their entries' own bytes
  (`manifest_decoding.RawManifest`), packed near the merge target size, and drops manifests with
  no live file left; the removed data files' entries (DELETED) are written from the values read
  (`manifest_encoding.removed_manifest`: a planner's, the columns it decoded), the plan's files
  found among the entries by identity, whole manifests at a time, without a path matched;
- it merges small data manifests on commit with Iceberg's `commit.manifest-merge.*` semantics
  (pyiceberg's merge manager), and folds the delete manifests earlier writes left into one once
  there are as many as `min-count-to-merge`;
- added positional delete files go to a DELETES manifest (`manifests.manifest_writer`: with
  `referenced_data_file`); removing a data file also removes every delete file that applies to
  that data file only, so no delete file outlives the rows it deletes.

When the branch head is no longer the index's snapshot (not under our fenced commit) and the commit
touches no delete file, it falls back to pyiceberg's own reading.

Iceberg's `replace` operation: data files swapped for files holding the same rows.

Owns the snapshot producer of table maintenance (`ReplaceFiles`): the write path's
`IndexedOverwrite` (planned from a `ManifestIndex`, delete files in `deletes`
manifests, file-scoped delete files removed with their data file, manifests merged on commit)
whose snapshot says what it is — summary operation `replace`, so readers and engines know the
table's rows did not change — and that refuses to commit on a snapshot it was not planned on.

Writes in flight versus orphan removal: the rule that no sweep deletes the files of a write
still running, and no write commits a snapshot whose files are gone.

A write's files exist before its commit references them — data files written ahead of the lock,
files rewritten under it, manifests and the manifest list, the new `metadata.json` — so until the
commit they look exactly like orphans, whatever their age. Three parts:

1. **Writers register** (`writing`): every writer of the project (writes, streaming replaces,
   compactions; audited writes to a branch too) holds the table's *files lock*
   (`locks.iceberg_files`) **shared** from before its first file until its commit is over. Writers
   share it, so they never wait for each other on it; its session is also the one the writer
   takes the table's writer lock on (one connection per write).
2. **Orphan removal quiesces** (`quiesced`): after listing the table's files (no lock: listing
   a big table takes long) it takes the files lock **alone** — without queueing, so writers never
   wait behind it, for at most `wait_s`, else `LockUnavailable` and nothing deleted — and then the
   writer lock (no commit of any kind is under way), re-reads the table and keeps only what is
   still unreferenced. No write of the project is then between "files written" and "committed",
   and any later write only writes new files or references files the table already references,
   so what is left is deleted after both locks are released.
3. **Commits verify** (`verify_written`): right before the catalog swap, a commit no lock of the
   project covers (`lock=None`) checks that every file it wrote or is about to reference anew
   (data and delete files, new manifests, the manifest list) still exists, else `FilesRemoved`:
   nothing committed. A commit under the table's writer lock skips the check
   (`LockStats.covers_files`): its files were written under that lock, or before it under the
   files lock on the same session, and orphan removal takes both before it decides — so the
   lock's `verify()` right before the swap (a writer whose session ended fails with `LockLost`)
   proves no sweep of the project ran since its first file. That saves a request per new object
   on an object store (5 HEADs, ~12 ms, per upsert over S3). Sweeps outside the project (another
   engine's orphan removal) are held off by their grace period, as for any Iceberg writer.

A commit's new `metadata.json` (written by the catalog just before its swap) is never an orphan
while its version is above the table's current one (`orphans.table_orphans`): that also covers a
committer outside the project. Other files of writers outside the project's locks (other engines)
are protected by the grace period only.

The `pipeline-output.*` properties of a snapshot's summary: which dataset, strategy, write
mode, run and window (or Dagster partition) wrote it, and its row counts (`pipeline-output history` shows them; the
attempt marker of exactly-once repair is one of them).

A write's own change, recorded at write time for the change feed (`changes.read_changes` composes
these instead of diffing manifests): `CHANGE_FILE` names a small Parquet file under the table's
data location holding the rows the snapshot inserted, deleted, and the before and after of those
it updated (the table's columns and `_change_type`), written by `commit` before the swap — a
failure to write it fails the write with nothing committed; `CHANGE_COUNTS` its rows per change
type (read instead of counted when one snapshot's change is read); `CHANGE_ADDED` = `inserts` says the
snapshot's added data files are exactly its inserts (append, append_new: nothing to write).
Orphan removal counts a live snapshot's change file as referenced; expiry deletes those of the
snapshots it expires (`orphans.ManifestReader.metadata_of`).
"""

from __future__ import annotations

import io as io_module
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from operator import itemgetter, not_
from typing import TYPE_CHECKING, Any, cast

import polars as pl
from pydantic_core import to_json
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.exceptions import ValidationException
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    UpdatesAndRequirements,
)
from pyiceberg.table.update.snapshot import (
    _new_manifest_list_file_name,
    _OverwriteFiles,
    _SnapshotProducer,
)
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.utils.properties import property_as_bool, property_as_int

from pipeline_output.contract.checked_input import check_keys, to_polars
from pipeline_output.contract.plan import RowCounts, WritePlan
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.version import VERSION
from pipeline_output.errors import (
    BadInput,
    CorruptManifest,
    FilesRemoved,
    LockUnavailable,
    MaintenanceConflict,
    UnsupportedWrite,
    WriteConflict,
)
from pipeline_output.infra.faults import fault_injection
from pipeline_output.infra.locks import (
    AdvisoryLock,
    HeldLock,
    LockStats,
    iceberg_files,
    iceberg_table,
)
from pipeline_output.stores.iceberg.snapshot.files import (
    DataFileWriter,
    DeleteFileWriter,
    referenced_path,
)
from pipeline_output.stores.iceberg.snapshot.manifests import (
    BytesMergeManager,
    Counted,
    ManifestIndex,
    MergeAppend,
    Sources,
    manifest_spec,
    manifest_writer,
    recorded,
    remember_commit,
    summary,
)
from pipeline_output.stores.iceberg.table.file_io import Uploads, uploading
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    EntryValues,
    RawManifest,
    entry_file_paths,
    entry_files,
    entry_kinds,
    file_paths,
    partition_values,
)
from pipeline_output.stores.iceberg.table.manifest_encoding import (
    Source,
    added_manifest,
    manifest_list_v2,
    packed,
    removed_manifest,
    rewrite_manifest,
)
from pipeline_output.stores.iceberg.table.tables import PROPERTY_PREFIX, READ_THREADS
from pipeline_output.stores.iceberg.write.frame_rows import align_to_schema
from pipeline_output.stores.schema import check_required

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables


CHANGE_FILE = f"{PROPERTY_PREFIX}change-file"
CHANGE_COUNTS = f"{PROPERTY_PREFIX}change-counts"  # the change file's rows per change type
CHANGE_ADDED = f"{PROPERTY_PREFIX}change"
CHANGE_TYPE = "_change_type"  # the change file's column of change types (`changes.CHANGE_TYPE`)
ADDED_ARE_INSERTS = "inserts"
CHANGE_DIR = "changes"  # under the table's data location


def change_path(location: str, commit_uuid: uuid.UUID) -> str:
    """Where the change file of the commit `commit_uuid` of the table at `location` goes."""
    return f"{location.rstrip('/')}/data/{CHANGE_DIR}/{commit_uuid}.parquet"


def summary_properties(
    spec: DatasetSpec, plan: WritePlan, run_id: str | None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The namespaced properties every snapshot of ours carries."""
    props = {
        f"{PROPERTY_PREFIX}dataset": spec.name,
        f"{PROPERTY_PREFIX}strategy": spec.strategy,
        f"{PROPERTY_PREFIX}write-mode": plan.write_mode,
        f"{PROPERTY_PREFIX}first-deploy": str(plan.first_deploy).lower(),
        f"{PROPERTY_PREFIX}run-id": run_id or "",
        f"{PROPERTY_PREFIX}version": VERSION,
    }
    if plan.window is not None:
        props[f"{PROPERTY_PREFIX}window"] = str(plan.window)
        props[f"{PROPERTY_PREFIX}window-key"] = plan.window.to_key()
    if plan.partition is not None:
        props[f"{PROPERTY_PREFIX}partition"] = plan.partition.key
    for key, value in (extra or {}).items():
        props[f"{PROPERTY_PREFIX}{key}"] = value
    return props


def row_properties(counts: RowCounts, *, added_are_inserts: bool = False) -> dict[str, str]:
    """The row counters of a write, kept in its snapshot summary (`pipeline-output history`
    shows them: Iceberg's own added/deleted records count rewritten files' rows too); with
    `added_are_inserts` (a first deploy, an append that removed no file) also `CHANGE_ADDED`, so
    the change feed reads the snapshot's added files as its inserts."""
    props = {
        f"{PROPERTY_PREFIX}rows-inserted": str(counts.inserted),
        f"{PROPERTY_PREFIX}rows-updated": str(counts.updated),
        f"{PROPERTY_PREFIX}rows-deleted": str(counts.deleted),
    }
    if added_are_inserts:
        props[CHANGE_ADDED] = ADDED_ARE_INSERTS
    return props


DEFAULT_WAIT_S = 300.0  # how long orphan removal waits for the writes in flight to end


def writing(store: HasTables, table: str) -> AbstractContextManager[HeldLock | None]:
    """Register a write of `table` (`namespace.name`) from before its first file until its commit
    ended: the files lock held shared. Pass the held lock to `store.tables.hold(..., on=)`. A store
    without an advisory lock registers nothing."""
    lock = store.tables.advisory()
    if not isinstance(lock, AdvisoryLock):
        return nullcontext(None)
    return lock.share(iceberg_files(table))


@contextmanager
def quiesced(store: HasTables, table: str, *, dataset: str, wait_s: float) -> Iterator[float]:
    """No write of `table` between its files and its commit, and no commit, for the block: the
    files lock alone (waiting at most `wait_s` for the writes in flight), then the writer lock.
    Yields the seconds waited. A store without an advisory lock quiesces nothing."""
    lock = store.tables.advisory()
    if not isinstance(lock, AdvisoryLock):
        yield 0.0
        return
    with ExitStack() as stack:
        try:
            held = stack.enter_context(lock.alone(iceberg_files(table), wait_s=wait_s))
        except LockUnavailable as exc:
            raise LockUnavailable(
                f"dataset {dataset!r}: writes of {table} were still in progress after "
                f"{wait_s:g}s; no orphan was removed — run it again"
            ) from exc
        stats = stack.enter_context(lock.hold(iceberg_table(table), on=held))
        yield held.wait_s + stats.wait_s


def verify_written(
    io: FileIO, producer: _SnapshotProducer[Any], written: Iterable[str], *, dataset: str
) -> None:
    """`FilesRemoved` unless every path in `written` and the manifests and manifest list the
    snapshot `producer` staged wrote still exist (checked right before the catalog swap)."""
    paths = [*written, *producer._written_manifests, *producer._written_manifest_lists]
    missing = _missing(io, paths)
    if missing:
        raise FilesRemoved(
            f"dataset {dataset!r}: {len(missing)} file(s) this write had written were deleted "
            f"before its commit (e.g. {missing[0]}; an orphan removal while the write held no "
            "lock?); nothing was committed — run it again"
        )


def _missing(io: FileIO, paths: list[str]) -> list[str]:
    def gone(path: str) -> bool:
        try:
            return not io.new_input(path).exists()
        except (OSError, ValueError):
            return True

    if len(paths) <= 4:
        return [p for p in paths if gone(p)]
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(paths))) as pool:
        return [p for p, g in zip(paths, pool.map(gone, paths), strict=True) if g]


@dataclass(frozen=True)
class CommitRequest:
    """One native snapshot to commit (`commit`): what it adds and removes, and how it is fenced."""

    tx: Transaction  # the write's transaction (schema and spec changes already staged on it)
    dataset: str
    properties: Mapping[str, str]  # the snapshot summary's `pipeline-output.*` properties
    frames: Sequence[pl.DataFrame] = ()  # rows the commit writes to new data files
    ready: Sequence[DataFile] = ()  # data files already written (pre-written, merge rewrites)
    deleted: Sequence[DataFile] = ()  # data files (and their delete files) the snapshot removes
    positional: Sequence[tuple[DataFile, pl.Series]] = ()  # merge-on-read: positions deleted
    force: bool = False  # an overwrite snapshot even when it adds and removes nothing
    blind_retry: bool = False  # plain appends: pyiceberg may retry them on a new head
    fence: LockStats | None = None  # the writer lock: `verify()`ed right before the swap
    index: ManifestIndex | None = None  # the manifests the write was planned from
    branch: str = MAIN_BRANCH  # the ref committed to (an audited write: its run's branch)
    # the write's own change (table columns + `_change_type`): written as the `CHANGE_FILE`
    change: pl.DataFrame | None = None
    # paths of `ready` files a certainly refused commit leaves in place: the caller's to commit
    # again (a range run planned from memory plans again on the table loaded) or to delete
    keep: frozenset[str] = frozenset()


def commit(request: CommitRequest) -> Table:
    """Write the request's `frames` as data files and commit them and the `ready` (already
    written) files with `deleted` removed: exactly one snapshot.

    The commit is fenced to the snapshot the write was planned against: the snapshot producer
    asserts the branch head it started from, and unless `blind_retry` is set (plain appends, whose
    rows do not depend on the table's state) a concurrent commit is NOT retried on top of the new
    head — pyiceberg's retry re-applies a fast append without re-checking keys, which duplicated
    keys when a writer outside the lock committed in between. The commit then fails as
    `WriteConflict` and nothing is committed. `fence` (the writer lock's `verify`) runs right
    before the catalog swap: a writer whose lock ended fails with `LockLost`; then every file the
    snapshot adds must still exist (`commit.verify_written`), else `FilesRemoved`.

    `index` (the manifests the write was planned from) spares the producer re-reading every
    manifest; manifests are merged on commit as the table's properties say (`manifests.py`).
    `positional` (merge-on-read) pairs a kept data file with every position it no longer holds:
    one file-scoped delete file each, written here and committed in the same snapshot. `branch`
    is the ref the snapshot is committed to (an audited write: its run's branch).
    """
    # the commit's new files (change file, data and delete files, manifests, manifest list) are
    # uploaded at the same time, each from when it is complete (`file_io.Uploads`)
    with uploading(request.tx._table.io) as io:
        return _commit(request, io)


def _commit(request: CommitRequest, io: Uploads) -> Table:
    from pyiceberg.exceptions import CommitFailedException

    tx, dataset, props = request.tx, request.dataset, dict(request.properties)
    index, branch, fence = request.index, request.branch, request.fence
    deleted, frames, ready, positional = (
        request.deleted,
        request.frames,
        request.ready,
        request.positional,
    )
    producer: _SnapshotProducer[Any]
    commit_uuid = uuid.uuid4()
    change_written: list[str] = []
    if request.change is not None:
        path = change_path(tx.table_metadata.location, commit_uuid)
        try:
            write_change_file(io, path, request.change)
        except BaseException:  # the write fails whole: nothing committed, its files go
            for data_file in ready:
                delete_quietly(io, data_file.file_path)
            raise
        change_written.append(path)
        props[CHANGE_FILE] = path
        props[CHANGE_COUNTS] = change_counts(request.change)
    if deleted or request.force or positional:
        producer = IndexedOverwrite(tx, io, index=index, snapshot_properties=props, branch=branch)
    else:  # an append: pyiceberg's merge-append honours the same manifest-merge properties
        producer = MergeAppend(
            operation=Operation.APPEND,
            transaction=tx,
            io=io,
            branch=branch,
            snapshot_properties=props,
        )
    for data_file in ready:
        producer.append_data_file(data_file)
    writer = DataFileWriter(tx.table_metadata, io, write_id=producer.commit_uuid)
    deletes = DeleteFileWriter(tx.table_metadata, io, write_id=producer.commit_uuid)
    try:
        added, removing = write_files(writer, frames, deletes, positional)
        for data_file in [*added, *removing]:
            producer.append_data_file(data_file)
    except BaseException:
        for path in [*writer.written, *deletes.written, *change_written]:
            delete_quietly(io, path)
        raise
    for data_file in deleted:
        producer.delete_data_file(data_file)
    fault_injection("before_commit")
    try:
        if request.blind_retry:
            producer.commit()  # registers the producer: pyiceberg rebuilds it on a new head
        else:
            tx._apply(*producer._commit())  # staged without retry registration: fenced
        io.wait()  # every file of the commit uploaded
        fault_injection("in_commit")  # manifests and manifest list written too
        if fence is not None:
            fence.verify()
        if fence is None or not fence.covers_files():
            verify_written(  # none of its files removed meanwhile (`commit.py`)
                io,
                producer,
                [*writer.written, *deletes.written, *(f.file_path for f in ready), *change_written],
                dataset=dataset,
            )
        committed = tx.commit_transaction()
    except (CommitFailedException, ValidationException, WriteConflict) as exc:
        # certain: the catalog did not swap, so the files written for this commit are garbage
        with suppress(Exception):
            producer._clean_all_uncommitted()
        kept = request.keep
        written = [
            *writer.written,
            *deletes.written,
            *(f.file_path for f in ready if f.file_path not in kept),
        ]
        for path in [*written, *change_written]:
            delete_quietly(io, path)
        if isinstance(exc, WriteConflict):
            raise
        raise WriteConflict(
            f"dataset {dataset!r}: the table changed after this write was planned "
            f"({type(exc).__name__}: {exc}); nothing was committed — run it again"
        ) from exc
    if not request.blind_retry:  # (a retried append's producer may be rebuilt: not kept)
        # what the commit wrote, kept as read back: the next write in this process decodes
        # neither its manifest list nor its manifests again; a failure to keep them only costs
        # that read, never the committed write
        with suppress(Exception):
            remember_commit(producer, committed)
    return committed


def change_counts(change: pl.DataFrame) -> str:
    """`CHANGE_COUNTS` of a change frame: `<change type>=<rows>` per type present, comma
    separated — the change feed reads them instead of counting the file's rows again."""
    counted = change.get_column(CHANGE_TYPE).value_counts()
    return ",".join(f"{kind}={n}" for kind, n in sorted(counted.iter_rows()))


def write_change_file(io: FileIO, path: str, change: pl.DataFrame) -> None:
    """Write a snapshot's change rows to `path`: one small Parquet file, read whole, so without
    statistics and in one row group — read back as one chunk per column, which the downstream's
    first group-by or join would otherwise rechunk (~6 ms of a 150,000-row group-by's 23) —,
    uncompressed on a local filesystem — read through a memory map, decompressing costs more than
    the extra bytes (a fresh process's read of 150,000 rows: ~4 ms CPU less of ~20) — and lz4 on
    an object store, where the bytes cost more (benchmarks/results/change-feed.md)."""
    local = path.startswith(("file:", "/"))
    buffer = io_module.BytesIO()
    change.write_parquet(
        buffer,
        compression="uncompressed" if local else "lz4",
        statistics=False,
        row_group_size=max(change.height, 1),
    )
    with io.new_output(path).create(overwrite=True) as out:
        out.write(buffer.getvalue())


def stream_batches(
    spec: DatasetSpec,
    first: pl.DataFrame,
    rest: Iterator[pl.DataFrame],
    writer: DataFileWriter,
    schema: Schema,
    *,
    sink: list[DataFile],
) -> int:
    """Check, align and write `first` and then every batch of `rest`; the files go to `sink`.

    Returns the rows written. Every batch must have the first batch's columns.
    """
    rows = 0
    columns = first.columns
    batch: pl.DataFrame | None = first
    while batch is not None:
        if batch.columns != columns:
            raise BadInput(
                f"dataset {spec.name!r}: batch columns {batch.columns} differ from the first "
                f"batch's {columns}; nothing was written"
            )
        batch = check_keys(spec, to_polars(spec, batch))
        check_required(spec, batch, schema)
        batch = align_to_schema(batch, schema)
        sink.extend(writer.write(batch))
        rows += batch.height
        batch = next(rest, None)
    return rows


def write_files(
    writer: DataFileWriter,
    frames: Sequence[pl.DataFrame],
    deletes: DeleteFileWriter,
    positional: Sequence[tuple[DataFile, pl.Series]],
) -> tuple[list[DataFile], list[DataFile]]:
    """The `frames` written as data files and the `positional` deletes as delete files: both at
    once when a commit has both (an upsert's new rows and its merge-on-read deletes — on an object
    store two uploads in parallel, not one after the other). Returns only when both are done, so a
    failure of either leaves every written path in the writers' `written` lists for cleanup."""
    if not frames or not positional:
        added = [data_file for frame in frames for data_file in writer.write(frame)]
        return added, deletes.write_many(positional)
    with ThreadPoolExecutor(max_workers=1) as pool:
        removing = pool.submit(deletes.write_many, positional)
        added = [data_file for frame in frames for data_file in writer.write(frame)]
    return added, removing.result()


def delete_quietly(file_io: FileIO, path: str) -> None:
    """Delete a data file nobody references (best effort: doctor lists what is left)."""
    with suppress(OSError, ValueError):
        file_io.delete(path)


class IndexedOverwrite(_OverwriteFiles):
    """pyiceberg's overwrite producer, planned from a `ManifestIndex`, merging manifests."""

    def __init__(
        self,
        transaction: Transaction,
        io: FileIO,
        *,
        index: ManifestIndex | None,
        snapshot_properties: dict[str, str],
        commit_uuid: uuid.UUID | None = None,
        branch: str = MAIN_BRANCH,
    ) -> None:
        has_parent = transaction.table_metadata.current_snapshot() is not None
        super().__init__(
            operation=Operation.OVERWRITE if has_parent else Operation.APPEND,
            transaction=transaction,
            io=io,
            commit_uuid=commit_uuid,
            snapshot_properties=snapshot_properties,
            branch=branch,
        )
        self._index = index
        metadata = transaction.table_metadata  # replays the transaction's updates: read once
        self._default_spec_id = metadata.default_spec_id
        props = metadata.properties
        self._min_count = property_as_int(
            props,
            TableProperties.MANIFEST_MIN_MERGE_COUNT,
            TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT,
        )
        self._merge_enabled = property_as_bool(
            props,
            TableProperties.MANIFEST_MERGE_ENABLED,
            TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
        )
        self._target = (
            property_as_int(
                props,
                TableProperties.MANIFEST_TARGET_SIZE_BYTES,
                TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
            )
            or TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT
        )
        self._written: dict[str, Sources] = {}  # manifests written from bytes, by path
        self._removals: tuple[ManifestIndex, list[_Removal]] | None = None  # (`_removal`)
        self._merge = BytesMergeManager(
            target_size_bytes=self._target,
            min_count_to_merge=self._min_count,  # type: ignore[arg-type]
            merge_enabled=self._merge_enabled,
            snapshot_producer=self,
            sources=self._bytes_of,
            write=lambda spec_id, sources: self._raw_rewrite(
                ManifestContent.DATA, spec_id, sources
            ),
        )

    def release(self) -> None:
        """Drop what this committed producer holds. A snapshot producer is a reference cycle
        (pyiceberg's merge manager holds its producer), so what it references — the planned
        index with its entries, the removed files — outlives its commit until the collector's
        next pass: a compaction of 20,000 files left ~80,000 objects for a ~12 ms pass inside
        its call. Released while the collector is paused, they are freed by reference count."""
        vars(self).clear()

    def spec(self, spec_id: int) -> PartitionSpec:
        return manifest_spec(super().spec(spec_id))

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return manifest_writer(self, spec)

    # -- what the commit removes

    def _indexed(self) -> ManifestIndex | None:
        index = self._index
        if index is None or index.snapshot_id != self._parent_snapshot_id:
            return None
        return index

    def delete_data_files(self, files: Iterable[DataFile]) -> None:
        """`delete_data_file` of each of `files`, in one call (a compaction removes 20,000)."""
        self._deleted_data_files.update(files)

    def _touches_deletes(self) -> bool:
        return any(
            f.content != DataFileContent.DATA
            for f in (*self._added_data_files, *self._deleted_data_files)
        )

    def _build_delete_files_partition_predicate(self) -> None:
        if self._indexed() is None:  # only pyiceberg's own reading prunes by it
            super()._build_delete_files_partition_predicate()

    def _removed_with_their_data(self, index: ManifestIndex) -> None:
        """Add to the removed files every file-scoped delete file of a removed data file."""
        deletes = [m for m in index.manifests if m.content == ManifestContent.DELETES]
        if not deletes:  # (then no removed path is needed: 20,000 of a compaction's)
            return
        gone = {f.file_path for f in self._deleted_data_files if f.content == DataFileContent.DATA}
        if not gone:
            return
        index.live.load(deletes)  # already read when the write planned with `tasks`
        for manifest in deletes:
            for entry in index.live[manifest.manifest_path]:
                if referenced_path(entry.data_file) in gone:
                    self._deleted_data_files.add(entry.data_file)

    def _removal(self, index: ManifestIndex) -> list[_Removal]:
        """The read manifests holding removed files, each with which of its live entries are
        removed (as read: `removed_manifest` writes them DELETED by this snapshot from their
        values; `rewrite_manifest` from their bytes, `_removed` where re-encoded). No new
        entry per removed file: a compaction removes tens of thousands.

        The removed files are, as a rule, the index's own objects (a plan's files): a
        manifest whose every live file is one of them is removed whole, and when those
        manifests hold as many files as are removed, every removed file is found — no path
        matched, no entry picked (one C-level pass of identities per such manifest). Else
        matched by path (a data file's identity), manifest by manifest."""
        files = self._deleted_data_files
        read = [(m, index.live[m.manifest_path]) for m in index.read_manifests()]
        ids = set(map(id, files))
        whole = [
            (m, live) for m, live in read if live and ids.issuperset(map(id, entry_files(live)))
        ]
        if sum(len(live) for _, live in whole) == len(ids):  # (a file's entry is one object)
            return [_Removal(m, live, index.live.raw(m.manifest_path), None) for m, live in whole]
        gone = set(file_paths(files))
        out: list[_Removal] = []
        found: set[str] = set()
        for manifest, live in read:
            # matched by C-level calls, no Python per entry (a compaction's 20,000)
            paths = entry_file_paths(live)
            hits = list(map(gone.__contains__, paths))
            if any(hits):
                found.update(compress(paths, hits))
                raw = index.live.raw(manifest.manifest_path)
                out.append(_Removal(manifest, live, raw, None if all(hits) else hits))
        if missing := sorted(gone - found):  # pyiceberg's `_validate_required_deletes`, by path
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
        return out

    def _removals_of(self, index: ManifestIndex) -> list[_Removal]:
        """`_removal` of `index`, worked out once per index (the DELETED manifests and the
        kept ones are both made from it)."""
        if self._removals is None or self._removals[0] is not index:
            self._removals = (index, self._removal(index))
        return self._removals[1]

    def _deleted_entries(self) -> list[ManifestEntry]:
        index = self._indexed()
        if index is None:
            return super()._deleted_entries()
        deleted = self._deleted_data_files
        # the removed files are in the manifests the write planned from (read); a file found in
        # none fails the commit (`_validate_required_deletes`) instead of outliving its removal
        entries = [
            _restamped(entry, ManifestEntryStatus.DELETED, self._snapshot_id)
            for manifest in index.read_manifests()
            for entry in index.live[manifest.manifest_path]
            if entry.data_file in deleted
        ]
        self._validate_required_deletes(entries)
        return entries

    # -- the manifests of the new snapshot

    def _manifests(self) -> list[ManifestFile]:
        index = self._indexed()
        if index is None:
            if self._touches_deletes():
                raise UnsupportedWrite(
                    "a commit that adds or removes delete files must be planned from the "
                    "table's current manifests"
                )
            return super()._manifests()
        self._removed_with_their_data(index)  # before the summary counts the removed files
        # one manifest per (content, partition spec) for this snapshot's added AND removed files
        # (pyiceberg writes them apart: one more manifest file per write, kept by every snapshot)
        groups: dict[tuple[ManifestContent, int], list[ManifestEntry]] = defaultdict(list)
        for data_file in self._added_data_files:
            key = (_content_of(data_file), self._added_spec_id(data_file))
            groups[key].append(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=self._snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=data_file,
                )
            )
        new: list[ManifestFile] = []
        # removed data files' entries (DELETED) from their values, one manifest per source
        # layout; those of delete files (and where that cannot be done) from their own bytes
        self._removals = None  # (the removed files as they are now: `_removed_with_their_data`)
        as_values: dict[tuple[int, str], list[_Removal]] = defaultdict(list)
        as_bytes: dict[tuple[ManifestContent, int, str], Sources] = defaultdict(list)
        for removal in self._removals_of(index):
            raw = removal.raw
            if raw is not None and removal.manifest.content == ManifestContent.DATA:
                # a data manifest's files: data files of its spec (as read: `read_manifest`)
                spec_id = removal.manifest.partition_spec_id
                as_values[(spec_id, raw.schema_text)].append(removal)
            else:
                self._removing_by_bytes(removal, groups, as_bytes)
        for (spec_id, _), removing in as_values.items():
            written = removed_manifest(
                self.new_manifest_output(),
                cast(RawManifest, removing[0].raw),
                [removal.values() for removal in removing],
                spec=self.spec(spec_id),
                schema=self.schema(),
                snapshot_id=self._snapshot_id,
            )
            if written is not None:
                new.append(written)
                continue
            for removal in removing:  # (a layout or value it does not encode): as bytes
                self._removing_by_bytes(removal, groups, as_bytes)
        for (content, spec_id, _), sources in as_bytes.items():
            written = self._raw_rewrite(
                content, spec_id, sources, status=ManifestEntryStatus.DELETED
            )
            if written is None:
                groups[(content, spec_id)].extend(
                    _removed(e, self._snapshot_id) for _, kept in sources for e, _ in kept
                )
            else:
                new.append(written)
        for (content, spec_id), entries in groups.items():
            entries = index.live.whole(entries)
            added = self._added_manifest(content, spec_id, entries)
            if added is not None:
                new.append(added)
                continue
            with self._writer(content, spec_id) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            new.append(writer.to_manifest_file())
        return self._process_manifests(new + self._existing_manifests())

    def _added_manifest(
        self, content: ManifestContent, spec_id: int, entries: list[ManifestEntry]
    ) -> ManifestFile | None:
        """The new data manifest of this snapshot's ADDED `entries`, encoded from their values
        (`manifest_encoding.added_manifest`) under the Avro layout of a data manifest this
        commit removes files from — when that manifest's metadata is what pyiceberg's v2 writer
        writes for this snapshot (table schema, partition spec, format version, codec: the same
        layout) —, else None (pyiceberg's writer then): pyiceberg's writer builds the
        manifest's Iceberg and Avro schemas and its writer tree for every manifest it writes,
        ~1 ms of a fresh process's one-file commit."""
        index = self._indexed()
        if (
            content != ManifestContent.DATA
            or index is None
            or self._transaction.table_metadata.format_version != 2
        ):
            return None
        raws = [
            r.raw
            for r in self._removals_of(index)
            if r.raw is not None
            and r.manifest.content == ManifestContent.DATA
            and r.manifest.partition_spec_id == spec_id
        ]
        if not raws:
            return None
        spec, schema = self.spec(spec_id), self.schema()
        expected = {
            "schema": schema.model_dump_json(),
            "partition-spec": to_json(spec.fields).decode("utf-8"),
            "partition-spec-id": str(spec.spec_id),
            "format-version": "2",
            AVRO_CODEC_KEY: CODEC_MAPPING_ICEBERG_TO_AVRO.get(self._compression, self._compression),
            "content": "data",
        }
        layout = next((r for r in raws if _header_of(r.meta) == expected), None)
        if layout is None:
            return None
        written = added_manifest(
            self.new_manifest_output,
            layout,
            entries,
            spec=spec,
            schema=schema,
            snapshot_id=self._snapshot_id,
        )
        if written is not None:  # kept as read back after the commit (`remember_commit`)
            recorded(self).setdefault(written.manifest_path, []).extend(entries)
        return written

    def _commit(self) -> UpdatesAndRequirements:
        """pyiceberg's snapshot producer's own commit step, a v2 table's manifest list encoded
        from its records (`manifest_encoding.manifest_list_v2`: no Avro schema converted nor
        writer tree resolved per commit); pyiceberg's writer when that cannot encode it."""
        if self._transaction.table_metadata.format_version != 2:
            return super()._commit()
        new_manifests = self._manifests()
        metadata = self._transaction.table_metadata
        next_sequence_number = metadata.next_sequence_number()
        summary = self._summary(self.snapshot_properties)
        file_name = _new_manifest_list_file_name(
            snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid
        )
        location_provider = self._transaction._table.location_provider()
        manifest_list_file_path = location_provider.new_metadata_location(file_name)
        self._written_manifest_lists.append(manifest_list_file_path)
        if not manifest_list_v2(
            self._io.new_output(manifest_list_file_path),
            new_manifests,
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            sequence_number=next_sequence_number,
            codec=CODEC_MAPPING_ICEBERG_TO_AVRO.get(self._compression, self._compression),
        ):
            with write_manifest_list(
                format_version=2,
                output_file=self._io.new_output(manifest_list_file_path),
                snapshot_id=self._snapshot_id,
                parent_snapshot_id=self._parent_snapshot_id,
                sequence_number=next_sequence_number,
                avro_compression=self._compression,
            ) as writer:
                writer.add_manifests(new_manifests)
        snapshot = Snapshot(  # type: ignore[call-arg]
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=manifest_list_file_path,
            sequence_number=next_sequence_number,
            summary=summary,
            schema_id=metadata.current_schema_id,
        )
        add_snapshot_update = AddSnapshotUpdate(snapshot=snapshot)
        if self._target_branch is None:
            return (add_snapshot_update,), ()
        ref = metadata.refs.get(self._target_branch)
        return (
            (
                add_snapshot_update,
                SetSnapshotRefUpdate(  # type: ignore[call-arg]
                    snapshot_id=self._snapshot_id,
                    parent_snapshot_id=self._parent_snapshot_id,
                    ref_name=self._target_branch,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (
                AssertRefSnapshotId(  # type: ignore[call-arg]
                    snapshot_id=ref.snapshot_id if ref is not None else None,
                    ref=self._target_branch,
                ),
            ),
        )

    def _removing_by_bytes(
        self,
        removal: _Removal,
        groups: dict[tuple[ManifestContent, int], list[ManifestEntry]],
        as_bytes: dict[tuple[ManifestContent, int, str], Sources],
    ) -> None:
        """The removed entries of `removal` to write DELETED from their own bytes
        (`as_bytes`, by content, spec and layout), or re-encoded (`groups`) where their
        manifest's bytes are not kept."""
        raw = removal.raw
        kinds = entry_kinds(removal.removed()) if raw is not None else None
        if raw is not None and kinds is not None and len(kinds) == 1:
            # one kind of file (a manifest's entries, as a rule): no Python per entry
            ((content, spec_id),) = kinds
            layout = (_content_of_kind(content), spec_id, raw.schema_text)
            as_bytes[layout].append((raw, removal.with_bytes()))
            return
        by_key: dict[tuple[ManifestContent, int], list[tuple[ManifestEntry, bytes]]] = {}
        for pair in removal.pairs():
            entry, data = pair
            key = (_content_of(entry.data_file), entry.data_file.spec_id)
            if raw is None or data is None:
                groups[key].append(_removed(entry, self._snapshot_id))
            else:  # the pair itself (tens of thousands: not copied)
                by_key.setdefault(key, []).append(cast(tuple[ManifestEntry, bytes], pair))
        for key, kept in by_key.items():
            assert raw is not None
            as_bytes[(*key, raw.schema_text)].append((raw, kept))

    def _added_spec_id(self, data_file: DataFile) -> int:
        """The partition spec an added file is recorded under: a new data file is written by
        the table's current spec; a delete file carries the spec of the data file it deletes
        from (which may be an older one)."""
        if data_file.content == DataFileContent.DATA:
            return self._default_spec_id
        return data_file.spec_id

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """pyiceberg's summary, each file's partition summarised by its own spec
        (`manifests.summary`); the removed files of a data manifest of one partition counted
        from their columns (`_counted`)."""
        return summary(self, self._added_spec_id, snapshot_properties, removed=self._counted())

    def _counted(self) -> tuple[Iterable[DataFile], Sequence[Counted]] | None:
        """The removed files as the summary counts them (`manifests.summary`): of each data
        manifest whose removed files share one partition (an unpartitioned table's), their
        count, bytes and rows from the columns they were written DELETED from
        (`_Removal.values`: sums, no pass over the files); the others file by file. None
        (every removed file counted by the summary) unless `_manifests` worked out the
        removals of this commit's index."""
        index = self._indexed()
        if index is None or self._removals is None or self._removals[0] is not index:
            return None
        files: list[DataFile] = []
        counted: list[Counted] = []
        for removal in self._removals[1]:
            values = removal.values() if removal.manifest.content == ManifestContent.DATA else None
            group = values.group() if values is not None else None
            if values is None or group is None:
                files.extend(entry_files(removal.removed()))
                continue
            partition, content = group
            try:
                hash(partition_values(partition))
            except TypeError:  # an unhashable partition value: counted file by file
                files.extend(entry_files(removal.removed()))
                continue
            spec_id = removal.manifest.partition_spec_id
            counted.append((spec_id, partition, content, len(values), *values.totals()))
        if len(files) + sum(c[3] for c in counted) != len(self._deleted_data_files):
            return None  # (not every removed file among them: counted one by one)
        return files, counted

    def _existing_manifests(self) -> list[ManifestFile]:
        index = self._indexed()
        if index is None:
            kept = super()._existing_manifests()
        else:
            kept = []
            # the rewritten manifests' kept entries, by layout: packed into manifests near the
            # target size from their own bytes (no merge has to re-encode them after)
            packs: dict[tuple[ManifestContent, int, str], list[Source]] = defaultdict(list)
            removing = {r.manifest.manifest_path: r for r in self._removals_of(index)}
            for manifest in index.manifests:
                if not index.live.is_read(manifest.manifest_path):
                    kept.append(manifest)  # not planned from: nothing of it is removed
                    continue
                live = index.live[manifest.manifest_path]
                removal = removing.get(manifest.manifest_path)
                if removal is None and live:
                    kept.append(manifest)  # untouched: carried forward as it is
                    continue
                if removal is None or removal.hits is None:
                    continue  # no live file left (all deleted now or before): dropped
                stays = list(map(not_, removal.hits))
                remaining = list(compress(live, stays))
                raw = removal.raw
                if raw is None:
                    spec_id = manifest.partition_spec_id
                    kept.append(self._rewrite_entries(manifest.content, spec_id, remaining))
                else:
                    pairs = zip(live, raw.data_files, strict=True)
                    key = (manifest.content, manifest.partition_spec_id, raw.schema_text)
                    packs[key].append(
                        Source(
                            raw,
                            [pair for pair, ok in zip(pairs, stays, strict=True) if ok],
                            manifest.manifest_length / len(live),
                        )
                    )
            for (content, spec_id, _), sources in packs.items():
                kept.extend(self._packed(content, spec_id, sources))
        # pyiceberg's own path keeps manifests whose entries are all DELETED: drop them too
        return [m for m in kept if m.has_added_files() or m.has_existing_files()]

    def _writer(self, content: ManifestContent, spec_id: int) -> ManifestWriter:
        return manifest_writer(self, self.spec(spec_id), content)

    def _packed(
        self, content: ManifestContent, spec_id: int, sources: list[Source]
    ) -> list[ManifestFile]:
        """The sources' kept entries in manifests of about the merge target size, from their
        own bytes (re-encoded only if their codecs differ)."""
        out: list[ManifestFile] = []
        for batch in packed(sources, self._target):
            written = self._raw_rewrite(content, spec_id, batch)
            entries = [e for _, pairs in batch for e, _ in pairs]
            out.append(written or self._rewrite_entries(content, spec_id, entries))
        return out

    def _raw_rewrite(
        self,
        content: ManifestContent,
        spec_id: int,
        sources: list[tuple[RawManifest, list[tuple[ManifestEntry, bytes]]]],
        *,
        status: ManifestEntryStatus = ManifestEntryStatus.EXISTING,
    ) -> ManifestFile | None:
        written = rewrite_manifest(
            self.new_manifest_output(),
            sources,
            spec=self.spec(spec_id),
            schema=self.schema(),
            snapshot_id=self._snapshot_id,
            content=content,
            status=status,
        )
        if written is not None and status == ManifestEntryStatus.EXISTING:
            self._written[written.manifest_path] = sources
        return written

    def _bytes_of(self, manifest: ManifestFile) -> Sources | None:
        """A manifest's entries with their bytes, when all are carried forward (EXISTING)."""
        if manifest.manifest_path in self._written:
            return self._written[manifest.manifest_path]
        index = self._indexed()
        raw = index.live.raw(manifest.manifest_path) if index is not None else None
        if index is None or raw is None or manifest.added_snapshot_id == self._snapshot_id:
            return None
        return [(raw, list(zip(index.live[manifest.manifest_path], raw.data_files, strict=True)))]

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        # this commit's DELETED-only manifests are not merged (gone with the next commit)
        gone = [m for m in manifests if not (m.has_added_files() or m.has_existing_files())]
        data = [m for m in manifests if m.content == ManifestContent.DATA and m not in gone]
        # (a DELETED-only delete manifest is in `gone`: listed once, not again with the deletes)
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES and m not in gone]
        listed = self._merge.merge_manifests(data) + gone + self._merged_deletes(deletes)
        self._po_listed = listed  # the snapshot's manifest list (`manifests.remember_commit`)
        return listed

    def _merged_deletes(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        """The delete manifests, the earlier snapshots' ones folded into one per partition spec
        once there are `min-count-to-merge` of them (each write that deletes by position adds
        one: without folding, every later write would read them all)."""
        index = self._indexed()
        mine = [m for m in manifests if m.added_snapshot_id == self._snapshot_id]
        earlier = [m for m in manifests if m.added_snapshot_id != self._snapshot_id]
        if index is None or not self._merge_enabled or len(earlier) < max(2, self._min_count or 2):
            return manifests
        by_spec: dict[int, list[ManifestFile]] = defaultdict(list)
        for manifest in earlier:  # carried forward untouched: its live entries are indexed
            by_spec[manifest.partition_spec_id].append(manifest)
        folded = []
        for spec_id, group in by_spec.items():
            entries = [e for m in group for e in index.live[m.manifest_path]]
            if not entries:
                continue
            raws = [index.live.raw(m.manifest_path) for m in group]
            written = None
            if all(r is not None for r in raws):
                sources = [
                    (r, list(zip(index.live[m.manifest_path], r.data_files, strict=True)))
                    for m, r in zip(group, raws, strict=True)
                    if r is not None
                ]
                written = self._raw_rewrite(ManifestContent.DELETES, spec_id, sources)
            folded.append(
                written or self._rewrite_entries(ManifestContent.DELETES, spec_id, entries)
            )
        return mine + folded

    def _rewrite_entries(
        self, content: ManifestContent, spec_id: int, entries: list[ManifestEntry]
    ) -> ManifestFile:
        index = self._indexed()
        if index is not None:  # a planner's index: its files' statistics decoded whole first
            entries = index.live.whole(entries)
        with self._writer(content, spec_id) as writer:
            for entry in entries:
                writer.add_entry(_restamped(entry, ManifestEntryStatus.EXISTING, entry.snapshot_id))
        return writer.to_manifest_file()


def _restamped(
    entry: ManifestEntry, status: ManifestEntryStatus, snapshot_id: int | None
) -> ManifestEntry:
    """`entry` with another status (and snapshot), keeping its sequence numbers: a delete
    file's data sequence number decides which data files it applies to."""
    return ManifestEntry.from_args(
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )


def _removed(entry: ManifestEntry, snapshot_id: int) -> ManifestEntry:
    """`entry` DELETED by `snapshot_id`, re-encoded: a data file without its column metrics
    (empty maps), as `rewrite_manifest` writes the removed entries it copies from their bytes
    (`manifest_encoding.unmeasured`); a delete file whole (its path bounds name its data file)."""
    data_file = entry.data_file
    if data_file.content == DataFileContent.DATA:
        bare = DataFile.from_args(
            content=data_file.content,
            file_path=data_file.file_path,
            file_format=data_file.file_format,
            partition=data_file.partition,
            record_count=data_file.record_count,
            file_size_in_bytes=data_file.file_size_in_bytes,
            column_sizes={},
            value_counts={},
            null_value_counts={},
            nan_value_counts={},
            lower_bounds={},
            upper_bounds={},
            key_metadata=data_file.key_metadata,
            split_offsets=data_file.split_offsets,
            equality_ids=data_file.equality_ids,
            sort_order_id=data_file.sort_order_id,
        )
        bare.spec_id = data_file.spec_id
        entry = ManifestEntry.from_args(
            status=entry.status,
            snapshot_id=entry.snapshot_id,
            sequence_number=entry.sequence_number,
            file_sequence_number=entry.file_sequence_number,
            data_file=bare,
        )
    return _restamped(entry, ManifestEntryStatus.DELETED, snapshot_id)


def _header_of(meta: Mapping[str, str]) -> dict[str, str] | None:
    """A manifest's Avro metadata but its Avro schema (None: it has none)."""
    if "avro.schema" not in meta:
        return None
    return {k: v for k, v in meta.items() if k != "avro.schema"}


def _content_of(data_file: DataFile) -> ManifestContent:
    if data_file.content == DataFileContent.DATA:
        return ManifestContent.DATA
    return ManifestContent.DELETES


def _content_of_kind(content: int) -> ManifestContent:
    """`_content_of` a data file of `content` (`DataFileContent`'s value)."""
    return ManifestContent.DATA if content == DataFileContent.DATA else ManifestContent.DELETES


_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@dataclass(frozen=True)
class _Removal:
    """A read manifest holding files a commit removes: its live entries as read, its
    `RawManifest` (None: not kept) and which of the entries are removed (None: all)."""

    manifest: ManifestFile
    live: list[ManifestEntry]
    raw: RawManifest | None
    hits: list[bool] | None

    def removed(self) -> list[ManifestEntry]:
        """The removed entries, as read (the live list itself when all are)."""
        return self.live if self.hits is None else list(compress(self.live, self.hits))

    @cached_property
    def _values(self) -> EntryValues:
        planned = self.raw.values if self.raw is not None else None
        if planned is None or len(planned) != len(self.live):
            planned = EntryValues.of(self.live)
        return planned if self.hits is None else planned.picked(self.hits)

    def values(self) -> EntryValues:
        """The removed entries' values: the columns a planner decoded them from (`raw`), else
        taken from the entries."""
        return self._values

    def pairs(self) -> list[tuple[ManifestEntry, bytes | None]]:
        """The removed entries, each with its `data_file` bytes (None: not kept)."""
        live = self.live
        datas: Sequence[bytes | None] = (
            self.raw.data_files if self.raw is not None else [None] * len(live)
        )
        if len(datas) != len(live):
            raise CorruptManifest(
                f"manifest {self.manifest.manifest_path}: its entries and their bytes differ "
                "in number"
            )
        pairs = zip(live, datas, strict=True)
        return list(pairs) if self.hits is None else list(compress(pairs, self.hits))

    def with_bytes(self) -> list[tuple[ManifestEntry, bytes]]:
        """`pairs` of a manifest whose bytes are kept (`raw`)."""
        return cast(list[tuple[ManifestEntry, bytes]], self.pairs())


class ReplaceFiles(IndexedOverwrite):
    """The `replace` producer: `delete_data_file` takes data files and delete files alike.

    It needs the index of the snapshot it commits on (the caller re-reads it under the table lock);
    a replace planned on other files would lose rows, so another head is a `MaintenanceConflict`.
    """

    def __init__(
        self,
        transaction: Transaction,
        *,
        index: ManifestIndex,
        snapshot_properties: dict[str, str],
    ) -> None:
        super().__init__(
            transaction,
            transaction._table.io,
            index=index,
            snapshot_properties=snapshot_properties,
        )
        if self._indexed() is None:
            raise MaintenanceConflict(
                f"table {index.table_name!r}: the replace was planned on snapshot "
                f"{index.snapshot_id}, the table is at {self._parent_snapshot_id}"
            )

    def _summary(self, snapshot_properties: Mapping[str, str] = EMPTY_DICT) -> Summary:
        # pyiceberg's totals only know append/overwrite/delete: compute them as an overwrite
        # (the same file accounting), then name the operation for what it is.
        summary = super()._summary(dict(snapshot_properties))
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)
