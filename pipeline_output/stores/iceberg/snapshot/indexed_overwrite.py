"""`IndexedOverwrite`: the snapshot producer of every native write that removes or adds files.

pyiceberg's overwrite producer, planned from a `manifests.ManifestIndex` (read once per write)
instead of re-reading every manifest twice, and aware of delete files:

- it rewrites only the manifests that hold a removed file (a data manifest the write did not
  plan from is carried forward unread) and drops manifests with no live file left (pyiceberg
  carries the DELETED-only manifest of every overwrite forward for ever);
- it merges small data manifests on commit with Iceberg's `commit.manifest-merge.enabled`,
  `commit.manifest.min-count-to-merge` and `commit.manifest.target-size-bytes` semantics (the same
  merge manager as pyiceberg's merge-append), and folds the delete manifests earlier writes left
  into one once there are as many as `min-count-to-merge`;
- added positional delete files (merge-on-read) go to a DELETES manifest; a removed delete file
  is recorded as DELETED in one;
- removing a data file also removes every delete file that applies to that data file only
  (file-scoped), so no delete file outlives the rows it deletes.

When the branch head is no longer the index's snapshot (it cannot be under our fenced commit, but
a caller may reuse a producer) and the commit touches no delete file, it falls back to pyiceberg's
own reading.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update.snapshot import (
    _ManifestMergeManager,
    _MergeAppendFiles,
    _OverwriteFiles,
)
from pyiceberg.transforms import VoidTransform
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.types import NestedField, StructType
from pyiceberg.utils.properties import property_as_bool, property_as_int

from pipeline_output.errors import UnsupportedWrite
from pipeline_output.stores.iceberg.snapshot.delete_files import referenced_path
from pipeline_output.stores.iceberg.snapshot.manifest_codec import manifest_writer
from pipeline_output.stores.iceberg.snapshot.manifests import ManifestIndex


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
    manifests encoded by `manifest_codec`."""

    def spec(self, spec_id: int) -> PartitionSpec:
        return manifest_spec(super().spec(spec_id))

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return manifest_writer(self, spec)


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
        props = transaction.table_metadata.properties
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
        self._merge = _ManifestMergeManager(
            target_size_bytes=property_as_int(  # type: ignore[arg-type]
                props,
                TableProperties.MANIFEST_TARGET_SIZE_BYTES,
                TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
            ),
            min_count_to_merge=self._min_count,  # type: ignore[arg-type]
            merge_enabled=self._merge_enabled,
            snapshot_producer=self,
        )

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
        gone = {f.file_path for f in self._deleted_data_files if f.content == DataFileContent.DATA}
        if not gone:
            return
        deletes = [m for m in index.manifests if m.content == ManifestContent.DELETES]
        index.live.load(deletes)  # already read when the write planned with `tasks`
        for manifest in deletes:
            for entry in index.live[manifest.manifest_path]:
                if referenced_path(entry.data_file) in gone:
                    self._deleted_data_files.add(entry.data_file)

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
        for entry in self._deleted_entries():
            groups[(_content_of(entry.data_file), entry.data_file.spec_id)].append(entry)
        new: list[ManifestFile] = []
        for (content, spec_id), entries in groups.items():
            with self._writer(content, spec_id) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            new.append(writer.to_manifest_file())
        return self._process_manifests(new + self._existing_manifests())

    def _added_spec_id(self, data_file: DataFile) -> int:
        """The partition spec an added file is recorded under: a new data file is written by
        the table's current spec; a delete file carries the spec of the data file it deletes
        from (which may be an older one)."""
        if data_file.content == DataFileContent.DATA:
            return self._transaction.table_metadata.default_spec_id
        return data_file.spec_id

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        """pyiceberg's summary, with each file's partition summarised by its own spec.

        pyiceberg summarises every added file by the current spec: a delete file for a data file
        written under an older spec (fewer fields, or others) failed with a raw `IndexError`, or
        was summarised under the wrong partition path."""
        metadata = self._transaction.table_metadata
        schema, specs = metadata.schema(), metadata.specs()
        limit = property_as_int(
            metadata.properties,
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
        )
        collector = SnapshotSummaryCollector(partition_summary_limit=limit or 0)
        for data_file in self._added_data_files:
            spec = specs[self._added_spec_id(data_file)]
            collector.add_file(data_file=data_file, partition_spec=spec, schema=schema)
        for data_file in self._deleted_data_files:
            spec = specs[data_file.spec_id]
            collector.remove_file(data_file=data_file, partition_spec=spec, schema=schema)
        parent = self._parent_snapshot_id
        previous = metadata.snapshot_by_id(parent) if parent is not None else None
        return update_snapshot_summaries(
            summary=Summary(operation=self._operation, **collector.build(), **snapshot_properties),
            previous_summary=previous.summary if previous is not None else None,
        )

    def _existing_manifests(self) -> list[ManifestFile]:
        index = self._indexed()
        if index is None:
            kept = super()._existing_manifests()
        else:
            kept = []
            for manifest in index.manifests:
                if not index.live.is_read(manifest.manifest_path):
                    kept.append(manifest)  # not planned from: nothing of it is removed
                    continue
                live = index.live[manifest.manifest_path]
                remaining = [e for e in live if e.data_file not in self._deleted_data_files]
                if len(remaining) == len(live) and live:
                    kept.append(manifest)  # untouched: carried forward as it is
                elif remaining:
                    kept.append(self._rewrite(manifest, remaining))
                # else: no live file left (all deleted now or before): dropped
        # pyiceberg's own path keeps manifests whose entries are all DELETED: drop them too
        return [m for m in kept if m.has_added_files() or m.has_existing_files()]

    def _writer(self, content: ManifestContent, spec_id: int) -> ManifestWriter:
        return manifest_writer(self, self.spec(spec_id), content)

    def _rewrite(self, manifest: ManifestFile, entries: list[ManifestEntry]) -> ManifestFile:
        return self._rewrite_entries(manifest.content, manifest.partition_spec_id, entries)

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        return self._merge.merge_manifests(data) + self._merged_deletes(deletes)

    def _merged_deletes(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        """The delete manifests, the earlier snapshots' ones folded into one per partition spec
        once there are `min-count-to-merge` of them (each write that deletes by position adds
        one: without folding, every later write would read them all)."""
        index = self._indexed()
        mine = [m for m in manifests if m.added_snapshot_id == self._snapshot_id]
        earlier = [m for m in manifests if m.added_snapshot_id != self._snapshot_id]
        if index is None or not self._merge_enabled or len(earlier) < max(2, self._min_count or 2):
            return manifests
        by_spec: dict[int, list[ManifestEntry]] = defaultdict(list)
        for manifest in earlier:  # carried forward untouched: its live entries are indexed
            by_spec[manifest.partition_spec_id].extend(index.live[manifest.manifest_path])
        folded = [
            self._rewrite_entries(ManifestContent.DELETES, spec_id, entries)
            for spec_id, entries in by_spec.items()
            if entries
        ]
        return mine + folded

    def _rewrite_entries(
        self, content: ManifestContent, spec_id: int, entries: list[ManifestEntry]
    ) -> ManifestFile:
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


def _content_of(data_file: DataFile) -> ManifestContent:
    if data_file.content == DataFileContent.DATA:
        return ManifestContent.DATA
    return ManifestContent.DELETES
