"""Keeping a write's metadata work flat as a table's history grows.

Owns the manifest side of a native write:

- `ManifestIndex`: the current snapshot's manifests and their live entries, each manifest read
  at most ONCE per write (in parallel), and only the manifests a write plans from: a keyed write
  on a partitioned table skips the data manifests whose partition summaries rule its keys out. The merge plans its candidate files from it (`tasks`), and the commit's
  producer uses it again instead of re-reading every manifest twice (pyiceberg's overwrite reads
  all manifests once to find the deleted entries and once more to rewrite them).
  (`indexed_overwrite.IndexedOverwrite`, the commit's producer, is built on it.)
- `FlatTransaction`: a pyiceberg `Transaction` whose `table_metadata` is computed once per staged
  update instead of on every access (each access deep-copies the whole metadata, every snapshot
  of the table's history; one write made ~20 of them).
- `upgrade_properties`: the maintenance-free defaults of `properties.TABLE_PROPERTIES` (manifest
  merging, bounded `metadata.json` history) added, in the write's own commit, to tables created
  before they existed. A property the table already has is never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from threading import Lock
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
)
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.delete_file_index import DeleteFileIndex
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis

from pipeline_output.errors import UnsupportedWrite
from pipeline_output.stores.iceberg.snapshot.manifest_bytes import RawManifest, read_manifest
from pipeline_output.stores.iceberg.table.properties import (
    MAINTENANCE_FREE_PROPERTIES,
    READ_THREADS,
)

_INITIAL_SEQUENCE_NUMBER = 0


class LiveEntries(Mapping[str, list[ManifestEntry]]):
    """The live entries of a snapshot's manifests (manifest path -> entries), each manifest read
    on first access and kept: a write reads only the manifests it plans from and rewrites."""

    def __init__(self, manifests: list[ManifestFile], io: FileIO) -> None:
        self._manifests = {m.manifest_path: m for m in manifests}
        self._io = io
        self._read: dict[str, list[ManifestEntry]] = {}
        self._raw: dict[str, RawManifest] = {}
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
        if len(todo) > 1:
            with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(todo))) as pool:
                read = list(pool.map(self._fetch, todo))
        else:
            read = [self._fetch(m) for m in todo]
        with self._lock:
            for manifest, entries in zip(todo, read, strict=True):
                self._read.setdefault(manifest.manifest_path, entries)

    def raw(self, path: str) -> RawManifest | None:
        """The read manifest's raw entry bytes (`manifest_bytes`), when they can be reused."""
        return self._raw.get(path)

    def _fetch(self, manifest: ManifestFile) -> list[ManifestEntry]:
        entries, raw = read_manifest(manifest, self._io)
        if raw is not None:
            with self._lock:
                self._raw[manifest.manifest_path] = raw
        return entries


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
    def read(cls, metadata: TableMetadata, io: FileIO, *, table_name: str = "") -> ManifestIndex:
        """Read the current snapshot's manifest list (entries are read as they are needed)."""
        snapshot = metadata.current_snapshot()
        if snapshot is None:
            return cls(snapshot_id=None, table_name=table_name)
        manifests = list(snapshot.manifests(io))
        return cls(
            snapshot_id=snapshot.snapshot_id,
            table_name=table_name,
            manifests=manifests,
            live=LiveEntries(manifests, io),
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
            for entry in self.live[manifest.manifest_path]:
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
        return [
            FileScanTask(
                e.data_file,
                delete_files=deletes.for_data_file(
                    e.sequence_number or _INITIAL_SEQUENCE_NUMBER,
                    e.data_file,
                    partition_key=e.data_file.partition,
                ),
            )
            for e in data
        ]


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


def read_index(table: Table) -> ManifestIndex:
    """The manifest index of the table's current snapshot."""
    return ManifestIndex.read(table.metadata, table.io, table_name=".".join(table.name()))
