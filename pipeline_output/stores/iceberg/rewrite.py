"""Iceberg's `replace` operation: data files swapped for files holding the same rows.

Owns the snapshot producer of table maintenance (`ReplaceFiles`), built on the write path's
`manifests.IndexedOverwrite` (planned from a `ManifestIndex`, merging manifests on commit): it
removes the rewritten data files and the positional delete files that applied only to them, adds
the new data files, and commits a snapshot whose summary operation is `replace` — readers and
engines know the table's rows did not change. Delete files live in `deletes` manifests, which
pyiceberg cannot write: `DeleteManifestWriter` is its manifest writer with `deletes` content.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.manifest import (
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.typedef import EMPTY_DICT

from pipeline_output.errors import MaintenanceConflict
from pipeline_output.stores.iceberg.manifests import IndexedOverwrite, ManifestIndex


class DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest writer for delete files (manifest content `deletes`)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class ReplaceFiles(IndexedOverwrite):
    """The `replace` producer: `delete_data_file` takes data files and positional delete files.

    It needs the index of the snapshot it commits on (the caller re-reads it under the table lock),
    and refuses to run on another head: a replace planned on stale files would lose rows.
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

    def _validate_required_deletes(self, deleted_entries: list[ManifestEntry]) -> None:
        """Every file to remove must be live in the snapshot the replace is planned on."""
        index = self._indexed()
        assert index is not None  # checked at construction; the head cannot move under us
        live = {e.data_file for entries in index.live.values() for e in entries}
        missing = sorted(f.file_path for f in self._deleted_data_files if f not in live)
        if missing:
            raise MaintenanceConflict(
                f"table {index.table_name!r}: files to replace are no longer live: "
                f"{', '.join(missing[:5])}"
            )

    def _rewrite(self, manifest: ManifestFile, entries: list[ManifestEntry]) -> ManifestFile:
        if manifest.content == ManifestContent.DATA:
            return super()._rewrite(manifest, entries)
        writer = DeleteManifestWriter(
            self.spec(manifest.partition_spec_id),
            self.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )
        with writer:
            for entry in entries:
                writer.add_entry(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.EXISTING,
                        snapshot_id=entry.snapshot_id,
                        sequence_number=entry.sequence_number,
                        file_sequence_number=entry.file_sequence_number,
                        data_file=entry.data_file,
                    )
                )
        return writer.to_manifest_file()
