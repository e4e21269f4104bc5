"""Merging small data manifests on commit without re-encoding their entries.

Owns `BytesMergeManager`: pyiceberg's manifest merge manager (Iceberg's
`commit.manifest-merge.*` semantics: bins of about the target size, the bin holding this commit's
new manifest merged only past `min-count-to-merge`), whose merged manifest is written from the
entries' own bytes (`manifest_bytes`) when every manifest of the bin can give them — a manifest
this commit rewrote, or one the write read — and their entries are all carried forward
(EXISTING). Otherwise (a bin with this commit's added or deleted entries, or a manifest nobody
read) pyiceberg re-encodes the bin as before.
"""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.manifest import ManifestEntry, ManifestFile
from pyiceberg.table.update.snapshot import _ManifestMergeManager

from pipeline_output.stores.iceberg.snapshot.manifest_bytes import RawManifest

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
