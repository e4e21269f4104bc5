"""Keeping a write's metadata work flat as a table's history grows.

Owns the manifest side of a native write:

- `ManifestIndex`: the current snapshot's manifests and their live entries, each manifest read
  at most ONCE per write (in parallel), and only the manifests a write plans from: a keyed write
  on a partitioned table skips the data manifests whose partition summaries rule its keys out. The merge plans its candidate files from it (`tasks`), and the commit's
  producer uses it again instead of re-reading every manifest twice (pyiceberg's overwrite reads
  all manifests once to find the deleted entries and once more to rewrite them).
  (`commit.IndexedOverwrite`, the commit's producer, is built on it.)
- `FlatTransaction`: a pyiceberg `Transaction` whose `table_metadata` is computed once per staged
  update instead of on every access (each access deep-copies the whole metadata, every snapshot
  of the table's history; one write made ~20 of them).
- `upgrade_properties`: the maintenance-free defaults of `tables.TABLE_PROPERTIES` (manifest
  merging, bounded `metadata.json` history) added, in the write's own commit, to tables created
  before they existed. A property the table already has is never changed.

The partition specs manifests are written with, and the producer of writes that only add files.

Owns `manifest_spec` (a spec whose partition struct has optional fields only, where a field is
`void`), `MergeAppend` (pyiceberg's merge-append with it): both producers of a native write
(`commit.IndexedOverwrite`, this one) write manifests through them; and `summary`, a
snapshot summary that describes each file's partition by the file's own spec.

Manifest files encoded by a native Avro codec (`fastavro`), not pyiceberg's per-entry Python.

pyiceberg writes every manifest entry through its pure-Python `BinaryEncoder`, one Avro block per
entry: rewriting the manifests of a table of 20,000 small files spent about half of an upsert
there. `FastManifestWriter` is pyiceberg's v2 manifest writer (the same counters, partition
summaries and `ManifestFile`) that buffers the entries and encodes them in one pass with
fastavro's C encoder, in blocks, with the same Avro schema (from pyiceberg's own Iceberg-to-Avro
conversion), file metadata and codec.

The entries carry what Iceberg's spec (and Java's writers) put there beyond pyiceberg 0.12's v2
schema: `referenced_data_file` (field 143) on a positional delete file that applies to one data
file (ours are file-scoped: `files.referenced_path`), so readers associate it without
reading its bounds.

A manifest fastavro cannot encode (a partition value of a type this module does not map) is
written by pyiceberg's writer instead (`write_entries` returns False): same contents, slower.

Merging small data manifests on commit without re-encoding their entries.

Owns `BytesMergeManager`: pyiceberg's manifest merge manager (Iceberg's
`commit.manifest-merge.*` semantics: bins of about the target size, the bin holding this commit's
new manifest merged only past `min-count-to-merge`), whose merged manifest is written from the
entries' own bytes (`manifest_decoding.RawManifest`) when every manifest of the bin can give them —
a manifest this commit rewrote, or one the write read — and their entries are all carried forward
(EXISTING). Otherwise (a bin with this commit's added or deleted entries, or a manifest nobody
read) pyiceberg re-encodes the bin as before.
"""

from __future__ import annotations

import functools
import io
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from copy import copy
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from threading import Lock
from typing import Any, cast

import fastavro
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
    write_manifest,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, TableProperties, Transaction
from pyiceberg.table.delete_file_index import DeleteFileIndex
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import (
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    UpdateMetrics,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.snapshot import _ManifestMergeManager, _MergeAppendFiles
from pyiceberg.transforms import VoidTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    UUIDType,
)
from pyiceberg.utils.datetime import datetime_to_millis
from pyiceberg.utils.properties import property_as_int
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from pipeline_output.errors import CorruptManifest, UnsupportedWrite
from pipeline_output.stores.iceberg.snapshot.files import referenced_path
from pipeline_output.stores.iceberg.table.file_io import is_local
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    PartialDataFile,
    RawManifest,
    entry_contents,
    entry_files,
    file_contents,
    file_partitions,
    file_rows,
    file_sizes,
    file_spec_ids,
    manifest_bytes,
    manifest_list,
    partition_values,
    read_manifest,
)
from pipeline_output.stores.iceberg.table.tables import (
    MAINTENANCE_FREE_PROPERTIES,
    READ_THREADS,
)

_INITIAL_SEQUENCE_NUMBER = 0


_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = Lock()


def _reader_pool() -> ThreadPoolExecutor:
    """The process's manifest readers (READ_THREADS threads, started as needed and kept: a write
    reading two manifests paid more to start threads than to read them). A forked child, whose
    copy has no threads, gets its own."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(READ_THREADS, "po-manifest-read"))
        return _POOL[1]


class ReadManifests:
    """The live entries of the manifests this process read, and the manifest lists it read, kept
    for its later writes, within a memory bound: the kept manifests' Avro bytes (their
    `manifest_length`) at most `max_bytes`, the least recently read dropped first, a manifest
    over a quarter of it never kept. Decoded entries take ~8x their Avro bytes (measured: ~4 KB
    an entry of a five-column table, 475 B of Avro), so the default 8 MiB keeps ~70 MB at most,
    whatever the tables' widths — a bound by entries would let a wide table's grow tenfold in a
    long-lived process (a code server's sensors, an in-process executor).

    A manifest file is never rewritten in place (a new one gets a new name), so what its path
    read once is what it reads again; the key is also its length, sequence number and adding
    snapshot (what the entries inherit). The entries are shared, not copied: every reader builds
    new entries (`_restamped`, ManifestEntry.from_args) instead of changing them. A table
    written again by the same process (one run per partition, a sensor's windows) re-reads only
    the manifests its last commit wrote."""

    LISTS = 64

    def __init__(self, *, max_bytes: int = 8 << 20) -> None:
        self.max_bytes = max_bytes
        self._kept: dict[tuple[Any, ...], tuple[list[ManifestEntry], RawManifest | None]] = {}
        self._lists: dict[str, tuple[ManifestFile, ...]] = {}
        self._written: set[tuple[Any, ...]] = set()  # kept by `remember`: no raw bytes yet
        self._bytes = 0
        self._lock = Lock()

    def read(
        self,
        manifest: ManifestFile,
        io: FileIO,
        *,
        bounds: frozenset[int] | None = None,
        data: bytes | None = None,
    ) -> tuple[list[ManifestEntry], RawManifest | None]:
        """The manifest's live entries and raw bytes (`read_manifest`); with `bounds`, a
        planner's read (statistics of those columns only), which a whole read kept serves too —
        a planner's entries never serve a whole read. `data`: its bytes, already fetched."""
        keys = self._keys(manifest, bounds)
        with self._lock:
            for key in keys:
                kept = self._kept.pop(key, None)
                if kept is not None:
                    self._kept[key] = kept  # the most recently read last
                    return kept
        key = keys[-1]
        if bounds is None:
            entries, raw = read_manifest(manifest, io)
        else:
            entries, raw = read_manifest(manifest, io, bounds=bounds, data=data)
        self._keep(key, entries, raw)
        return entries, raw

    def _keep(
        self, key: tuple[Any, ...], entries: list[ManifestEntry], raw: RawManifest | None
    ) -> None:
        size = key[1]  # the manifest's length
        if size > self.max_bytes // 4:  # a huge manifest would evict everything
            return
        with self._lock:
            if key not in self._kept:
                self._kept[key] = (entries, raw)
                self._bytes += size
            while self._bytes > self.max_bytes:
                dropped = next(iter(self._kept))
                del self._kept[dropped]
                self._written.discard(dropped)
                self._bytes -= dropped[1]

    def remember(
        self,
        manifest_list: str,
        manifests: list[ManifestFile],
        entries: Mapping[str, list[ManifestEntry]],
    ) -> None:
        """Keep what this process's commit wrote as if it had read it back: the snapshot's
        manifest list (`manifests`, sequence numbers as the list assigned them) and the live
        entries of the manifests it encoded itself (`entries`, by path: as written, DELETED
        ones dropped, sequence numbers and snapshot inherited from the manifest as a read
        does). The next write of the table in this process then decodes neither again (~2 ms of
        CPU a one-partition run). Their raw entry bytes are read from the file when first
        asked for (`written`: a merge or rewrite from bytes)."""
        for manifest in manifests:
            written = entries.get(manifest.manifest_path)
            if written is None:
                continue
            live = [_inherited(e, manifest) for e in written]
            key = self._keys(manifest, None)[0]
            with self._lock:
                if key in self._kept:
                    continue
            self._keep(key, [e for e in live if e is not None], None)
            with self._lock:
                if key in self._kept:
                    self._written.add(key)
        with self._lock:
            self._lists[manifest_list] = tuple(manifests)
            while len(self._lists) > self.LISTS:
                self._lists.pop(next(iter(self._lists)))

    def forget(self, manifests: Iterable[ManifestFile], *, bounds: frozenset[int]) -> None:
        """Drop the planner's reads (`bounds`) kept of those manifests: a compaction's, once its
        commit replaced them. Kept, ~80,000 objects for 20,000 entries outlived the compaction,
        and the collector's first pass after it (`collector.paused`) walked them all."""
        with self._lock:
            for manifest in manifests:
                key = self._keys(manifest, bounds)[-1]
                if self._kept.pop(key, None) is not None:
                    self._written.discard(key)
                    self._bytes -= key[1]

    def written(self, manifest: ManifestFile) -> bool:
        """Whether `read` answers for `manifest` from what `remember` kept (no raw bytes)."""
        with self._lock:
            return self._keys(manifest, None)[0] in self._written

    @staticmethod
    def _keys(manifest: ManifestFile, bounds: frozenset[int] | None) -> list[tuple[Any, ...]]:
        full = (
            manifest.manifest_path,
            manifest.manifest_length,
            manifest.sequence_number,
            manifest.added_snapshot_id,
            None,
        )
        return [full] if bounds is None else [full, (*full[:4], bounds)]

    def kept(self, manifest: ManifestFile, *, bounds: frozenset[int] | None = None) -> bool:
        """Whether `read` would answer from what is kept."""
        with self._lock:
            return any(key in self._kept for key in self._keys(manifest, bounds))

    @property
    def kept_bytes(self) -> int:
        """The Avro bytes of the manifests kept now (at most `max_bytes`)."""
        return self._bytes

    def manifests(self, snapshot: Snapshot, io: FileIO) -> list[ManifestFile]:
        """The snapshot's manifest list (a manifest list is never rewritten either: each
        snapshot writes its own); the last `LISTS` read are kept."""
        path = snapshot.manifest_list
        with self._lock:
            kept = self._lists.pop(path, None)
            if kept is not None:
                self._lists[path] = kept
                return list(kept)
        read = tuple(manifest_list(io, snapshot))
        with self._lock:
            self._lists[path] = read
            while len(self._lists) > self.LISTS:
                self._lists.pop(next(iter(self._lists)))
        return list(read)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._lists.clear()
            self._written.clear()
            self._bytes = 0


def _inherited(entry: ManifestEntry, manifest: ManifestFile) -> ManifestEntry | None:
    """A written entry as `read_manifest` reads it back from `manifest` (None: DELETED, which a
    read skips): snapshot id and, for an ADDED entry, sequence numbers from the manifest, the
    file's spec id the manifest's (pyiceberg's `_inherit_from_manifest`, on a new entry)."""
    if entry.status == ManifestEntryStatus.DELETED:
        return None
    added = entry.status == ManifestEntryStatus.ADDED
    seq = manifest.sequence_number
    sequence_number = entry.sequence_number
    if sequence_number is None and (seq == 0 or added):
        sequence_number = seq
    file_sequence_number = entry.file_sequence_number
    if file_sequence_number is None and (seq == 0 or added):
        file_sequence_number = seq
    entry.data_file.spec_id = manifest.partition_spec_id
    return ManifestEntry.from_args(
        status=entry.status,
        snapshot_id=manifest.added_snapshot_id if entry.snapshot_id is None else entry.snapshot_id,
        sequence_number=sequence_number,
        file_sequence_number=file_sequence_number,
        data_file=entry.data_file,
    )


def remember_commit(producer: Any, committed: Table) -> None:
    """After `producer`'s snapshot was committed (`committed`: the table as the catalog left
    it): `ReadManifests.remember` (of `READ_MANIFESTS`) its manifest list and the manifests it
    encoded. Only a v2 table's; nothing when the producer did not record its list (`MergeAppend`
    and `commit.IndexedOverwrite` record it when they compute it)."""
    listed: list[ManifestFile] | None = getattr(producer, "_po_listed", None)
    metadata = committed.metadata
    if listed is None or metadata.format_version != 2:
        return
    snapshot = metadata.snapshot_by_id(producer._snapshot_id)
    if snapshot is None or snapshot.sequence_number is None:
        return
    seq, snapshot_id = snapshot.sequence_number, snapshot.snapshot_id
    manifests = []
    for manifest in listed:  # as `ManifestListWriterV2.prepare_manifest` writes them
        if manifest.added_snapshot_id == snapshot_id and UNASSIGNED_SEQ in (
            manifest.sequence_number,
            manifest.min_sequence_number,
        ):
            manifest = copy(manifest)
            if manifest.sequence_number == UNASSIGNED_SEQ:
                manifest.sequence_number = seq
            if manifest.min_sequence_number == UNASSIGNED_SEQ:
                manifest.min_sequence_number = seq
        elif UNASSIGNED_SEQ in (manifest.sequence_number, manifest.min_sequence_number):
            return  # not a list this snapshot could have written
        manifests.append(manifest)
    READ_MANIFESTS.remember(snapshot.manifest_list, manifests, recorded(producer))


def recorded(producer: Any) -> dict[str, list[ManifestEntry]]:
    """The entries each manifest `producer` encoded was given, by path (`manifest_writer`)."""
    found: dict[str, list[ManifestEntry]] = vars(producer).setdefault("_po_recorded", {})
    return found  # (setdefault: writers of one producer run on several threads)


READ_MANIFESTS = ReadManifests()
"""The process's manifests read (`ReadManifests`)."""


class LiveEntries(Mapping[str, list[ManifestEntry]]):
    """The live entries of a snapshot's manifests (manifest path -> entries), each manifest read
    on first access and kept: a write reads only the manifests it plans from and rewrites."""

    def __init__(
        self, manifests: list[ManifestFile], io: FileIO, *, bounds: frozenset[int] | None = None
    ) -> None:
        self._manifests = {m.manifest_path: m for m in manifests}
        self._io = io
        self.bounds = bounds  # a planner's index: only these columns' statistics
        self._read: dict[str, list[ManifestEntry]] = {}
        self._raw: dict[str, RawManifest] = {}
        self._unread: set[str] = set()  # served from what a commit wrote: no raw bytes yet
        self._lock = Lock()

    def __getitem__(self, path: str) -> list[ManifestEntry]:
        entries = self._read.get(path)
        if entries is None:
            entries = self._fetch(self._manifests[path])
            with self._lock:
                entries = self._read.setdefault(path, entries)
        return entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._manifests)

    def __len__(self) -> int:
        return len(self._manifests)

    def is_read(self, path: str) -> bool:
        return path in self._read

    def load(self, manifests: list[ManifestFile]) -> None:
        """Read the entries of those `manifests` not read yet, in parallel."""
        todo = [m for m in manifests if m.manifest_path not in self._read]
        if any(map(_holds_none, todo)):
            with self._lock:
                for m in filter(_holds_none, todo):
                    self._read.setdefault(m.manifest_path, [])
            todo = [m for m in todo if not _holds_none(m)]
        if len(todo) > 1 and self.bounds is not None:
            # a planner's read: the bytes fetched in parallel, decoded on this thread one after
            # the other — decoded on the pool's threads, each thread's allocator arena kept its
            # buffers: ~30 MB more resident for 20,000 entries, no faster
            # (benchmarks/results/small-files-maintenance.md, "The planner's read decoded on one
            # thread")
            fetched = list(_reader_pool().map(self._prefetch, todo))
            read = [self._fetch(m, data=data) for m, data in zip(todo, fetched, strict=True)]
        elif len(todo) > 1 and not _small_local(todo):
            read = list(_reader_pool().map(self._fetch, todo))
        else:
            read = [self._fetch(m) for m in todo]
        with self._lock:
            for manifest, entries in zip(todo, read, strict=True):
                self._read.setdefault(manifest.manifest_path, entries)

    def whole(self, entries: list[ManifestEntry]) -> list[ManifestEntry]:
        """`entries` with each `PartialDataFile` (a planner's index) replaced by the whole file,
        its manifest decoded whole: what re-encoding an entry needs."""
        if not any(isinstance(e.data_file, PartialDataFile) for e in entries):
            return entries
        files: dict[str, DataFile] = {}
        for path, read in list(self._read.items()):
            if any(isinstance(e.data_file, PartialDataFile) for e in read):
                full, _ = READ_MANIFESTS.read(self._manifests[path], self._io)
                files.update((e.data_file.file_path, e.data_file) for e in full)
        return [
            ManifestEntry.from_args(
                status=e.status,
                snapshot_id=e.snapshot_id,
                sequence_number=e.sequence_number,
                file_sequence_number=e.file_sequence_number,
                data_file=files[e.data_file.file_path],
            )
            if isinstance(e.data_file, PartialDataFile)
            else e
            for e in entries
        ]

    def raw(self, path: str) -> RawManifest | None:
        """The read manifest's raw entry bytes (`manifest_decoding.RawManifest`), when reusable
        — of a manifest served from what this process's commit wrote, read from its file now."""
        raw = self._raw.get(path)
        if raw is None and path in self._unread:
            _, raw = read_manifest(self._manifests[path], self._io)
            with self._lock:
                self._unread.discard(path)
                if raw is not None:
                    self._raw[path] = raw
        return raw

    def _prefetch(self, manifest: ManifestFile) -> bytes | None:
        """A planner's data manifest's bytes, unless kept decoded (`ReadManifests.kept`)."""
        if manifest.content != ManifestContent.DATA or READ_MANIFESTS.kept(
            manifest, bounds=self.bounds
        ):
            return None
        return manifest_bytes(self._io, manifest)

    def _fetch(self, manifest: ManifestFile, *, data: bytes | None = None) -> list[ManifestEntry]:
        if _holds_none(manifest):
            return []
        entries, raw = READ_MANIFESTS.read(manifest, self._io, bounds=self.bounds, data=data)
        if raw is not None:
            with self._lock:
                self._raw[manifest.manifest_path] = raw
        elif READ_MANIFESTS.written(manifest):
            with self._lock:
                self._unread.add(manifest.manifest_path)
        return entries


INLINE_BYTES = 256 << 10
"""Local manifests of at most this many bytes in all are read on the calling thread: their
decode holds the GIL, so the pool's threads overlap nothing but their own start and hand-offs
(a one-partition write's two manifests, 11 KB: ~0.3 ms of CPU more on the pool)."""


def _small_local(manifests: list[ManifestFile]) -> bool:
    """Whether `manifests` are local files of at most `INLINE_BYTES` in all."""
    return all(is_local(m.manifest_path) for m in manifests) and (
        sum(m.manifest_length for m in manifests) <= INLINE_BYTES
    )


def _holds_none(manifest: ManifestFile) -> bool:
    """Whether the manifest list says the manifest holds no live entry (every one DELETED: what
    a snapshot that removes files writes): nothing to read. Counts a list does not record (v1)
    say nothing."""
    return manifest.added_files_count == 0 and manifest.existing_files_count == 0


_NO_DELETES = cast(set[DataFile], frozenset())  # a task's delete files when none apply
_DATA_ONLY = frozenset((int(DataFileContent.DATA),))


@dataclass
class ManifestIndex:
    """The manifests of one snapshot with their live entries (data and delete files).

    Reading it reads the manifest list only; a manifest's entries are read when first needed
    (`tasks` reads the ones it plans from, in parallel). A write whose candidates lie in a few
    partitions plans with `admit` (the data manifests whose partition summaries can hold them)
    and never reads the other data manifests: the commit carries them forward untouched."""

    snapshot_id: int | None
    table_name: str = ""
    manifests: list[ManifestFile] = field(default_factory=list)
    live: LiveEntries = field(default_factory=lambda: LiveEntries([], PyArrowFileIO()))

    @classmethod
    def read(
        cls,
        metadata: TableMetadata,
        io: FileIO,
        *,
        table_name: str = "",
        bounds: frozenset[int] | None = None,
    ) -> ManifestIndex:
        """Read the current snapshot's manifest list (entries are read as they are needed).
        `bounds`: a planner's index, its data files' statistics cut to those columns
        (`manifest_decoding.read_planned`) — enough to plan and commit from, never to write a
        live file's entry from anything but its own bytes (a removed file's is written from
        its values: `manifest_encoding.removed_manifest`)."""
        snapshot = metadata.current_snapshot()
        if snapshot is None:
            return cls(snapshot_id=None, table_name=table_name)
        manifests = READ_MANIFESTS.manifests(snapshot, io)
        return cls(
            snapshot_id=snapshot.snapshot_id,
            table_name=table_name,
            manifests=manifests,
            live=LiveEntries(manifests, io, bounds=bounds),
        )

    def read_manifests(self) -> list[ManifestFile]:
        """The manifests whose entries have been read."""
        return [m for m in self.manifests if self.live.is_read(m.manifest_path)]

    def fully_read(self) -> bool:
        """Whether every manifest's entries have been read."""
        return all(self.live.is_read(m.manifest_path) for m in self.manifests)

    def live_rows(self) -> int | None:
        """The snapshot's live rows from the manifest list alone (data files' rows minus the
        positions delete files delete); None when a manifest does not record its counts (v1)."""
        rows = 0
        for m in self.manifests:
            if m.added_rows_count is None or m.existing_rows_count is None:
                return None
            count = m.added_rows_count + m.existing_rows_count
            rows += count if m.content == ManifestContent.DATA else -count
        return rows

    def tasks(self, *, admit: Callable[[ManifestFile], bool] | None = None) -> list[FileScanTask]:
        """One scan task per live data file, with the positional delete files that apply to it
        (the same association as pyiceberg's `plan_files`; equality deletes are refused there
        and here). With `admit`, only the data manifests it admits are read (and every delete
        manifest: an admitted manifest may hold files of partitions the predicate rules out,
        and each task must carry all its delete files)."""
        chosen = [
            m
            for m in self.manifests
            if admit is None or m.content != ManifestContent.DATA or admit(m)
        ]
        self.live.load(chosen)
        data: list[ManifestEntry] = []
        deletes = DeleteFileIndex()
        for manifest in chosen:
            entries = self.live[manifest.manifest_path]
            # a data manifest holds data files only (the spec's `content`); of others, no Python
            # per entry either (20,000 here)
            if manifest.content == ManifestContent.DATA or entry_contents(entries) <= _DATA_ONLY:
                data.extend(entries)
                continue
            for entry in entries:
                content = entry.data_file.content
                if content == DataFileContent.DATA:
                    data.append(entry)
                elif content == DataFileContent.POSITION_DELETES:
                    deletes.add_delete_file(entry, partition_key=entry.data_file.partition)
                else:
                    raise UnsupportedWrite(
                        f"table {self.table_name!r} carries an equality delete file "
                        f"({entry.data_file.file_path}), which pyiceberg cannot read; rewrite "
                        "the table with the engine that wrote it before writing here"
                    )
        if deletes.is_empty():  # no delete file applies: one shared empty set for each
            tasks = list(map(FileScanTask, entry_files(data)))
            for task in tasks:
                task.delete_files = _NO_DELETES
            return tasks
        tasks = []
        for e in data:
            found = deletes.for_data_file(
                e.sequence_number or _INITIAL_SEQUENCE_NUMBER,
                e.data_file,
                partition_key=e.data_file.partition,
            )
            task = FileScanTask(e.data_file, delete_files=found)
            if not found:  # one shared empty set, not 20,000 (~220 bytes each)
                task.delete_files = _NO_DELETES
            tasks.append(task)
        return tasks


class FlatTransaction(Transaction):
    """A `Transaction` whose staged metadata is computed once per staged update, without copies.

    pyiceberg's `Transaction.table_metadata` replays the staged updates onto the table's metadata
    and deep-copies the result on every access; the snapshot producer and our writer access it a
    few dozen times per commit, and each copy costs time proportional to the table's history
    (every snapshot). The metadata objects are frozen pydantic models and every update builds new
    ones (`model_copy(update=...)`), so the result is shared instead of copied; the cache is keyed
    on the base metadata and the staged-updates tuple (both replaced, never mutated, when they
    change). The catalog validates the final metadata at commit as before.
    """

    _po_cache: tuple[Any, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        cached = self._po_cache
        base, updates = self._table.metadata, self._updates
        if cached is None or cached[0] is not base or cached[1] is not updates:
            cached = (base, updates, _staged(base, updates))
            self._po_cache = cached
        return cached[2]


def _staged(base: TableMetadata, updates: tuple[TableUpdate, ...]) -> TableMetadata:
    """`update_table_metadata(base, updates)` without its final deep copy."""
    return staged_metadata(base, updates)


def staged_metadata(
    base: TableMetadata,
    updates: tuple[TableUpdate, ...],
    *,
    metadata_location: str | None = None,
) -> TableMetadata:
    """pyiceberg's `update_table_metadata` (not validating) without the final deep copy of the
    whole metadata: the updates build new frozen models and never mutate `base`. With
    `metadata_location` (a catalog commit) the previous file joins the metadata log."""
    if not updates:
        return base
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if context.has_changes():
        if metadata_location:
            metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            now = datetime_to_millis(datetime.now().astimezone())
            metadata = metadata.model_copy(update={"last_updated_ms": now})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


def upgrade_properties(tx: Transaction) -> None:
    """Stage the maintenance-free defaults the table does not set yet (none: nothing staged)."""
    current = tx.table_metadata.properties
    missing = {k: v for k, v in MAINTENANCE_FREE_PROPERTIES.items() if k not in current}
    if missing:
        tx.set_properties(missing)


def live_data_files(index: ManifestIndex) -> list[DataFile]:
    """Every live data file of the index's snapshot (a full replace deletes them all)."""
    index.live.load(index.manifests)
    return [
        e.data_file
        for m in index.manifests
        for e in index.live[m.manifest_path]
        if e.data_file.content == DataFileContent.DATA
    ]


def read_index(table: Table, *, bounds: frozenset[int] | None = None) -> ManifestIndex:
    """The manifest index of the table's current snapshot (`bounds`: `ManifestIndex.read`)."""
    return ManifestIndex.read(
        table.metadata, table.io, table_name=".".join(table.name()), bounds=bounds
    )


class _NullablePartitions(PartitionSpec):
    """A partition spec whose partition struct has optional fields only, as Iceberg's spec (and
    Java) has it. pyiceberg 0.12 makes a field required when its source column is, so a v1
    table's `void` field (always null, what removing a field leaves in a v1 spec) on a required
    column, such as a bucket of the key, could not be written to a manifest."""

    def partition_type(self, schema: Schema) -> StructType:
        struct = super().partition_type(schema)
        return StructType(
            *(NestedField(f.field_id, f.name, f.field_type, required=False) for f in struct.fields)
        )


def manifest_spec(spec: PartitionSpec) -> PartitionSpec:
    """The spec a manifest of `spec`'s files is written with (`_NullablePartitions` where a
    field is `void`; `spec` itself otherwise)."""
    if not any(isinstance(f.transform, VoidTransform) for f in spec.fields):
        return spec
    return _NullablePartitions(*spec.fields, spec_id=spec.spec_id)  # type: ignore[call-arg]


class MergeAppend(_MergeAppendFiles):
    """pyiceberg's merge-append (a write that only adds files), with `manifest_spec`, its
    manifests encoded by `manifest_writer`."""

    def spec(self, spec_id: int) -> PartitionSpec:
        return manifest_spec(super().spec(spec_id))

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return manifest_writer(self, spec)

    def _existing_manifests(self) -> list[ManifestFile]:
        """pyiceberg's (the parent snapshot's manifests that still hold files), its manifest
        list read through `READ_MANIFESTS` — the one this process's last commit kept, or read
        once — not decoded again by pyiceberg at every append."""
        parent = self._parent_snapshot_id
        if parent is None:
            return []
        previous = self._transaction.table_metadata.snapshot_by_id(parent)
        if previous is None:
            # (pyiceberg raises ValueError here; CorruptManifest is one)
            raise CorruptManifest(
                f"the table's metadata has no snapshot {parent}, the append's parent"
            )
        return [
            m
            for m in READ_MANIFESTS.manifests(previous, self._io)
            if m.has_added_files()
            or m.has_existing_files()
            or m.added_snapshot_id == self._snapshot_id
        ]

    def fetch_manifest_entry(
        self, manifest: ManifestFile, discard_deleted: bool = True
    ) -> list[ManifestEntry]:
        """A carried-forward manifest's entries for a merge (pyiceberg's `_create_manifest`),
        through `READ_MANIFESTS`: its live ones — the DELETED entries of an earlier snapshot,
        which a read skips, are what the merge drops. This commit's own new manifest (sequence
        number not assigned yet) is read by pyiceberg."""
        if manifest.added_snapshot_id == self._snapshot_id:
            return super().fetch_manifest_entry(manifest, discard_deleted)
        entries, _ = READ_MANIFESTS.read(manifest, self._io)
        return entries

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        listed: list[ManifestFile] = super()._process_manifests(manifests)
        self._po_listed = listed  # the snapshot's manifest list (`remember_commit`)
        return listed


Counted = tuple[int, Record, DataFileContent, int, int, int]
"""Removed files counted at once: their spec id, partition, content, count, bytes and rows."""


def summary(
    producer: Any,
    added_spec_id: Callable[[DataFile], int],
    properties: dict[str, str],
    *,
    removed: tuple[Iterable[DataFile], Sequence[Counted]] | None = None,
) -> Summary:
    """pyiceberg's snapshot summary of a producer's added and removed files, each file's
    partition summarised by its own spec (`added_spec_id` for added files). `removed`: the
    producer's removed files as some files and some counted already (a commit's removed
    entries' columns: `commit.IndexedOverwrite`), instead of its `_deleted_data_files`.

    pyiceberg summarises every added file by the current spec: a delete file for a data file
    written under an older spec (fewer fields, or others) failed with a raw `IndexError`, or was
    summarised under the wrong partition path."""
    metadata = producer._transaction.table_metadata
    schema, specs = metadata.schema(), metadata.specs()
    limit = property_as_int(
        metadata.properties,
        TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
        TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
    )
    collector = _Collector(partition_summary_limit=limit or 0)
    for data_file in producer._added_data_files:
        spec = specs[added_spec_id(data_file)]
        collector.add_file(data_file=data_file, partition_spec=spec, schema=schema)
    files, counted = (producer._deleted_data_files, ()) if removed is None else removed
    collector.remove_files(files, specs, schema, counted=counted)
    parent = producer._parent_snapshot_id
    previous = metadata.snapshot_by_id(parent) if parent is not None else None
    return update_snapshot_summaries(
        summary=Summary(operation=producer._operation, **collector.build(), **properties),
        previous_summary=previous.summary if previous is not None else None,
    )


class _Collector(SnapshotSummaryCollector):
    """pyiceberg's summary collector, each partition's path formatted once: it formats and
    quotes every file's partition values, half a second for a compaction of 20,000 files in 200
    partitions."""

    def __init__(self, partition_summary_limit: int = 0) -> None:
        super().__init__(partition_summary_limit=partition_summary_limit)
        self._paths: dict[tuple[int, tuple[Any, ...]], str] = {}

    def remove_files(
        self,
        files: Iterable[DataFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
        *,
        counted: Iterable[Counted] = (),
    ) -> None:
        """`remove_file` of each of `files` (under its own spec), counted by partition and
        content first, then added to the metrics once per partition: a compaction removes
        tens of thousands of files. `counted`: more removed files, counted already (their
        partition values hashable)."""
        totals: dict[tuple[int, tuple[Any, ...], DataFileContent], list[int]] = {}
        partitions: dict[tuple[int, tuple[Any, ...]], Record] = {}
        counted = list(counted)
        files = list(files)
        group = _one_group(files)
        if group is not None:  # one partition (unpartitioned): counted at once
            first, count, size, rows = group
            counted.append((first.spec_id, first.partition, first.content, count, size, rows))
            files = []
        for spec_id, partition, content, count, size, rows in counted:
            key = (spec_id, partition_values(partition))
            sums = totals.setdefault((*key, content), [0, 0, 0])
            sums[0] += count
            sums[1] += size
            sums[2] += rows
            partitions.setdefault(key, partition)
        for data_file in files:
            partition = data_file.partition
            values = partition_values(partition)
            key = (data_file.spec_id, values)
            try:
                total = totals.get((*key, data_file.content))
            except TypeError:  # an unhashable partition value: one file at a time
                spec = specs[data_file.spec_id]
                self.remove_file(data_file=data_file, partition_spec=spec, schema=schema)
                continue
            if total is None:
                total = totals[(*key, data_file.content)] = [0, 0, 0]
                partitions.setdefault(key, partition)
            total[0] += 1
            total[1] += data_file.file_size_in_bytes
            total[2] += data_file.record_count
        for (spec_id, values, content), (count, size, rows) in totals.items():
            _removed(self.metrics, content, count, size, rows)
            if values:
                spec = specs[spec_id]
                path = self._path(spec, partitions[(spec_id, values)], schema)
                _removed(self.partition_metrics[path], content, count, size, rows)

    def _path(self, spec: PartitionSpec, partition: Record, schema: Schema) -> str:
        key = (spec.spec_id, partition_values(partition))
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = spec.partition_to_path(partition, schema)
        return path

    def update_partition_metrics(
        self, partition_spec: PartitionSpec, file: DataFile, is_add_file: bool, schema: Schema
    ) -> None:
        partition = file.partition
        key = (partition_spec.spec_id, partition_values(partition))
        try:
            path = self._paths.get(key)
        except TypeError:  # an unhashable partition value: formatted each time
            path = partition_spec.partition_to_path(partition, schema)
        if path is None:
            path = self._paths[key] = partition_spec.partition_to_path(partition, schema)
        metrics = self.partition_metrics[path]
        if is_add_file:
            metrics.add_file(file)
        else:
            metrics.remove_file(file)


def _one_group(files: list[DataFile]) -> tuple[DataFile, int, int, int] | None:
    """When all the files are of one partition spec, partition value and content (an
    unpartitioned table's data files): (the first file, files, bytes, rows), taken by C-level
    getters — a planner's files share one partition record per manifest, so the values are
    compared once per distinct record; else None (counted file by file)."""
    if not files:
        return None
    if partition_values(files[0].partition) != partition_values(files[-1].partition):
        return None  # (a partitioned table's files: the first and the last differ, as a rule)
    partitions = file_partitions(files)
    by_id = dict(zip(map(id, partitions), partitions, strict=True))
    if len(by_id) > _GROUP_RECORDS:
        return None
    try:
        if len({partition_values(p) for p in by_id.values()}) != 1:
            return None
    except TypeError:  # an unhashable partition value
        return None
    if len(set(file_spec_ids(files))) != 1 or len(set(file_contents(files))) != 1:
        return None
    return files[0], len(files), sum(file_sizes(files)), sum(file_rows(files))


_GROUP_RECORDS = 64  # distinct partition records `_one_group` compares


def _removed(
    metrics: UpdateMetrics, content: DataFileContent, count: int, size: int, rows: int
) -> None:
    """pyiceberg's UpdateMetrics.remove_file of `count` files of `content` (`size` bytes,
    `rows` rows) at once."""
    metrics.removed_file_size += size
    if content == DataFileContent.DATA:
        metrics.removed_data_files += count
        metrics.deleted_records += rows
    elif content == DataFileContent.POSITION_DELETES:
        metrics.removed_delete_files += count
        metrics.removed_pos_delete_files += count
        metrics.removed_pos_deletes += rows
    else:  # equality deletes (the third and last kind of content)
        metrics.removed_delete_files += count
        metrics.removed_eq_delete_files += count
        metrics.removed_eq_deletes += rows


REFERENCED_DATA_FILE = NestedField(
    field_id=143,
    name="referenced_data_file",
    field_type=StringType(),
    required=False,
    doc="Fully qualified location (URI with FS scheme) of a data file that all deletes reference",
)
BLOCK_ENTRIES = 1000  # entries per Avro block
_CODECS = {"null", "deflate", "snappy", "zstandard"}


class _Buffered:
    """Stands in for pyiceberg's `AvroOutputFile`: collects the entries `add_entry` writes."""

    def __init__(self) -> None:
        self.entries: list[ManifestEntry] = []
        self.output_file = _Length()

    def write_block(self, objects: list[ManifestEntry]) -> None:
        self.entries.extend(objects)


class _Length:
    def __init__(self) -> None:
        self.size = 0

    def __len__(self) -> int:
        return self.size


class _Recording(ManifestWriterV2):
    """pyiceberg's v2 manifest writer that keeps the entries it is given (`po_entries`), for
    `remember_commit` to keep them as read back."""

    po_entries: list[ManifestEntry]

    def add_entry(self, entry: ManifestEntry) -> ManifestWriter:
        super().add_entry(entry)
        self.po_entries.append(entry)
        return self


class FastManifestWriter(_Recording):
    """pyiceberg's v2 manifest writer (data or delete entries), encoded with fastavro on close."""

    def __init__(
        self,
        spec: PartitionSpec,
        schema: Schema,
        output_file: OutputFile,
        snapshot_id: int,
        avro_compression: Any,
        *,
        content: ManifestContent = ManifestContent.DATA,
    ) -> None:
        super().__init__(spec, schema, output_file, snapshot_id, avro_compression)
        self._content = content

    def content(self) -> ManifestContent:
        return self._content

    @property
    def _meta(self) -> dict[str, str]:
        meta = super()._meta
        if self._content == ManifestContent.DELETES:
            meta["content"] = "deletes"
        return meta

    def __enter__(self) -> FastManifestWriter:
        self._writer = _Buffered()  # type: ignore[assignment]
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if exc_type is not None:
            return
        buffered: _Buffered = self._writer  # type: ignore[assignment]
        if not buffered.entries:
            raise CorruptManifest(f"manifest {self._output_file.location}: no entry to write")
        self.closed = True
        data = self._encode(buffered.entries)
        with self._output_file.create(overwrite=True) as stream:
            stream.write(data)
        buffered.output_file.size = len(data)

    def _encode(self, entries: list[ManifestEntry]) -> bytes:
        parsed, to_dict = _entry_encoding(self._spec.partition_type(self._schema))
        meta = {k: v for k, v in self._meta.items() if k != AVRO_CODEC_KEY}
        codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(self._compression, self._compression)
        out = io.BytesIO()
        records = (_with_reference(to_dict(e), e) for e in entries)
        fastavro.writer(
            out,
            parsed,
            records,
            codec=codec,
            metadata=meta,
            sync_interval=16 * 1024,
            validator=False,
        )
        return out.getvalue()


def manifest_writer(
    producer: Any, spec: PartitionSpec, content: ManifestContent = ManifestContent.DATA
) -> ManifestWriter:
    """The manifest writer a snapshot producer of ours uses for `spec`'s entries: fastavro's
    for format-version 2 tables' delete manifests with a codec fastavro has; pyiceberg's own
    otherwise. A v2 writer records its entries in `recorded(producer)`."""
    metadata = producer._transaction.table_metadata
    codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(producer._compression, producer._compression)
    if content == ManifestContent.DATA and metadata.format_version != 2:
        writer: ManifestWriter = write_manifest(
            format_version=metadata.format_version,
            spec=spec,
            schema=producer.schema(),
            output_file=producer.new_manifest_output(),
            snapshot_id=producer._snapshot_id,
            avro_compression=producer._compression,
        )
        return writer
    output = producer.new_manifest_output()
    args = (spec, producer.schema(), output, producer._snapshot_id, producer._compression)
    recording: _Recording
    if content == ManifestContent.DATA:
        recording = _Recording(*args)  # pyiceberg's v2 data manifest writer, recording
    elif metadata.format_version == 2 and codec in _CODECS:
        recording = FastManifestWriter(*args, content=content)
    else:
        recording = _DeleteManifestWriter(*args)
    recording.po_entries = recorded(producer).setdefault(output.location, [])
    return recording


class _DeleteManifestWriter(_Recording):
    """pyiceberg's v2 manifest writer for delete files (0.12 writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


@functools.lru_cache(maxsize=64)
def _entry_encoding(partition_type: StructType) -> tuple[Any, Callable[[Any], dict[str, Any]]]:
    """fastavro's parsed v2 manifest-entry schema for entries of `partition_type`, and the
    converter of an entry to its record: the same for every manifest of that partition type,
    made once (building the Iceberg and Avro schemas and the converter took ~1.5-2 ms of every
    delete manifest: a quarter of an upsert's manifests-and-list step)."""
    data_file = data_file_with_partition(format_version=2, partition_type=partition_type)
    schema = _entry_schema(
        manifest_entry_schema_with_data_file(format_version=2, data_file=data_file)
    )
    avro = AvroSchemaConversion().iceberg_to_avro(schema, schema_name="manifest_entry")
    return fastavro.parse_schema(avro), _converter(schema.as_struct(), avro)


def _entry_schema(schema: Schema) -> Schema:
    """The v2 manifest-entry schema with `referenced_data_file` in the data file struct."""
    fields = []
    for entry_field in schema.fields:
        if entry_field.field_id == 2 and isinstance(entry_field.field_type, StructType):
            data_file = entry_field.field_type
            extended = StructType(*data_file.fields, REFERENCED_DATA_FILE)
            entry_field = NestedField(2, entry_field.name, extended, required=True)
        fields.append(entry_field)
    return Schema(*fields)


def _with_reference(record: dict[str, Any], entry: ManifestEntry) -> dict[str, Any]:
    data_file = entry.data_file
    if data_file.content == DataFileContent.POSITION_DELETES:
        record["data_file"]["referenced_data_file"] = referenced_path(data_file)
    return record


def _converter(struct: StructType, avro: Any) -> Callable[[Any], dict[str, Any]]:
    """A function turning a pyiceberg `Record` of `struct` (whose Avro record schema is `avro`)
    into fastavro's dict: maps of non-string keys as arrays of key/value records (as Iceberg
    writes them), and every value of a nullable field tagged with its union branch — fastavro
    then writes it as it is, instead of validating it against each branch (the record's whole
    bounds and counts, for every entry)."""
    parts = []
    for i, (struct_field, spec) in enumerate(zip(struct.fields, avro["fields"], strict=True)):
        branch, tag = spec["type"], None
        if isinstance(branch, list):
            branch = next(b for b in branch if b != "null")
            tag = _branch_name(branch)
        parts.append((i, str(spec["name"]), _value(struct_field.field_type, branch), tag))

    def convert(record: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, name, value, tag in parts:
            try:
                raw = record[i]
            except IndexError:
                raw = None  # a field the record's own struct lacks (referenced_data_file)
            if raw is None:
                out[name] = None
            elif tag is None:
                out[name] = value(raw)
            else:
                out[name] = (tag, value(raw))
        return out

    return convert


def _branch_name(branch: Any) -> str:
    """The name fastavro's tuple notation gives a union branch."""
    if isinstance(branch, str):
        return branch
    if branch.get("type") in ("record", "fixed", "enum"):
        return str(branch["name"])
    return _branch_name(branch["type"])


def _value(field_type: IcebergType, avro: Any) -> Callable[[Any], Any]:
    if isinstance(field_type, StructType):
        return _converter(field_type, avro)
    if isinstance(field_type, ListType):
        element = _value(field_type.element_type, _non_null(avro["items"]))
        return lambda items: [None if v is None else element(v) for v in items]
    if isinstance(field_type, MapType):
        if isinstance(field_type.key_type, StringType) and avro.get("type") == "map":
            val = _value(field_type.value_type, _non_null(avro["values"]))
            return lambda m: {k: None if v is None else val(v) for k, v in dict(m).items()}
        item = avro["items"]
        key = _value(field_type.key_type, item["fields"][0]["type"])
        val = _value(field_type.value_type, _non_null(item["fields"][1]["type"]))
        return lambda m: [
            {"key": key(k), "value": None if v is None else val(v)} for k, v in dict(m).items()
        ]
    if isinstance(field_type, UUIDType):
        return lambda v: v.bytes if isinstance(v, uuid.UUID) else v
    if isinstance(field_type, (IntegerType, LongType)):
        return int  # enums (status, content) as plain ints
    if isinstance(field_type, StringType):
        return _text
    return _identity


def _non_null(avro: Any) -> Any:
    return next(b for b in avro if b != "null") if isinstance(avro, list) else avro


def _text(value: Any) -> str:
    return value.value if isinstance(value, Enum) else str(value)


def _identity(value: Any) -> Any:
    return value


Sources = list[tuple[RawManifest, list[tuple[ManifestEntry, bytes]]]]


class BytesMergeManager(_ManifestMergeManager):  # type: ignore[type-arg]
    """pyiceberg's merge manager, merging from bytes where every manifest of a bin has them."""

    def __init__(
        self,
        *,
        target_size_bytes: int,
        min_count_to_merge: int,
        merge_enabled: bool,
        snapshot_producer: object,
        sources: Callable[[ManifestFile], Sources | None],
        write: Callable[[int, Sources], ManifestFile | None],
    ) -> None:
        super().__init__(
            target_size_bytes=target_size_bytes,
            min_count_to_merge=min_count_to_merge,
            merge_enabled=merge_enabled,
            snapshot_producer=snapshot_producer,  # type: ignore[arg-type]
        )
        self._sources = sources
        self._write = write

    def _create_manifest(self, spec_id: int, manifest_bin: list[ManifestFile]) -> ManifestFile:
        every: Sources = []
        for manifest in manifest_bin:
            found = self._sources(manifest)
            if found is None:
                return super()._create_manifest(spec_id, manifest_bin)
            every.extend(found)
        written = self._write(spec_id, every) if every else None
        return written or super()._create_manifest(spec_id, manifest_bin)
