"""`IndexedOverwrite`: the snapshot producer of every native write that removes or adds files.

pyiceberg's overwrite producer, planned from a `manifests.ManifestIndex` (read once per write)
instead of re-reading every manifest twice, and aware of delete files:

- it rewrites only the manifests that hold a removed file (a data manifest the write did not
  plan from is carried forward unread), from their entries' own bytes (`manifest_bytes`), packed
  near the merge target size, and drops manifests with no live file left;
- it merges small data manifests on commit with Iceberg's `commit.manifest-merge.*` semantics
  (pyiceberg's merge manager), and folds the delete manifests earlier writes left into one once
  there are as many as `min-count-to-merge`;
- added positional delete files go to a DELETES manifest (`manifest_codec`: with
  `referenced_data_file`); removing a data file also removes every delete file that applies to
  that data file only, so no delete file outlives the rows it deletes.

When the branch head is no longer the index's snapshot (not under our fenced commit) and the commit
touches no delete file, it falls back to pyiceberg's own reading."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

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
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
    Summary,
)
from pyiceberg.table.update.snapshot import (
    _OverwriteFiles,
)
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.utils.properties import property_as_bool, property_as_int

from pipeline_output.errors import UnsupportedWrite
from pipeline_output.stores.iceberg.snapshot.delete_files import referenced_path
from pipeline_output.stores.iceberg.snapshot.manifest_bytes import (
    RawManifest,
    Source,
    packed,
    rewrite_manifest,
)
from pipeline_output.stores.iceberg.snapshot.manifest_codec import manifest_writer
from pipeline_output.stores.iceberg.snapshot.manifest_merge import BytesMergeManager, Sources
from pipeline_output.stores.iceberg.snapshot.manifest_specs import manifest_spec, summary
from pipeline_output.stores.iceberg.snapshot.manifests import ManifestIndex


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
        self._target = (
            property_as_int(
                props,
                TableProperties.MANIFEST_TARGET_SIZE_BYTES,
                TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
            )
            or TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT
        )
        self._written: dict[str, Sources] = {}  # manifests written from bytes, by path
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

    def _deleted_with_bytes(
        self, index: ManifestIndex
    ) -> list[tuple[ManifestEntry, RawManifest | None, bytes | None]]:
        """`_deleted_entries`, each with its source manifest's bytes (`manifest_bytes`)."""
        deleted = self._deleted_data_files
        out: list[tuple[ManifestEntry, RawManifest | None, bytes | None]] = []
        for manifest in index.read_manifests():
            live = index.live[manifest.manifest_path]
            raw = index.live.raw(manifest.manifest_path)
            for i, entry in enumerate(live):
                if entry.data_file in deleted:
                    gone = _restamped(entry, ManifestEntryStatus.DELETED, self._snapshot_id)
                    out.append((gone, raw, raw.data_files[i] if raw is not None else None))
        self._validate_required_deletes([entry for entry, _, _ in out])
        return out

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
        # removed files' entries (DELETED) from their own bytes, one manifest per source layout
        as_bytes: dict[tuple[ManifestContent, int, str], Any] = defaultdict(list)
        for entry, raw, data in self._deleted_with_bytes(index):
            key = (_content_of(entry.data_file), entry.data_file.spec_id)
            if raw is None or data is None:
                groups[key].append(entry)
            else:
                as_bytes[(*key, raw.schema_text)].append((raw, entry, data))
        for (content, spec_id, _), items in as_bytes.items():
            sources = [(raw, [(entry, data)]) for raw, entry, data in items]
            written = self._raw_rewrite(
                content, spec_id, sources, status=ManifestEntryStatus.DELETED
            )
            if written is None:
                groups[(content, spec_id)].extend(entry for _, entry, _ in items)
            else:
                new.append(written)
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
        """pyiceberg's summary, each file's partition summarised by its own spec
        (`manifest_specs.summary`)."""
        return summary(self, self._added_spec_id, snapshot_properties)

    def _existing_manifests(self) -> list[ManifestFile]:
        index = self._indexed()
        if index is None:
            kept = super()._existing_manifests()
        else:
            kept = []
            # the rewritten manifests' kept entries, by layout: packed into manifests near the
            # target size from their own bytes (no merge has to re-encode them after)
            packs: dict[tuple[ManifestContent, int, str], list[Source]] = defaultdict(list)
            gone = {f.file_path for f in self._deleted_data_files}
            for manifest in index.manifests:
                if not index.live.is_read(manifest.manifest_path):
                    kept.append(manifest)  # not planned from: nothing of it is removed
                    continue
                live = index.live[manifest.manifest_path]
                stays = [e.data_file.file_path not in gone for e in live]
                remaining = [e for e, ok in zip(live, stays, strict=True) if ok]
                raw = index.live.raw(manifest.manifest_path)
                if len(remaining) == len(live) and live:
                    kept.append(manifest)  # untouched: carried forward as it is
                elif remaining and raw is None:
                    spec_id = manifest.partition_spec_id
                    kept.append(self._rewrite_entries(manifest.content, spec_id, remaining))
                elif remaining and raw is not None:
                    pairs = zip(live, raw.data_files, strict=True)
                    key = (manifest.content, manifest.partition_spec_id, raw.schema_text)
                    packs[key].append(
                        Source(
                            raw,
                            [pair for pair, ok in zip(pairs, stays, strict=True) if ok],
                            manifest.manifest_length / len(live),
                        )
                    )
                # else: no live file left (all deleted now or before): dropped
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
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        return self._merge.merge_manifests(data) + gone + self._merged_deletes(deletes)

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
