"""The partition specs manifests are written with, and the producer of writes that only add files.

Owns `manifest_spec` (a spec whose partition struct has optional fields only, where a field is
`void`), `MergeAppend` (pyiceberg's merge-append with it): both producers of a native write
(`indexed_overwrite.IndexedOverwrite`, this one) write manifests through them; and `summary`, a
snapshot summary that describes each file's partition by the file's own spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyiceberg.manifest import DataFile, ManifestWriter
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.table.snapshots import SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update.snapshot import _MergeAppendFiles
from pyiceberg.transforms import VoidTransform
from pyiceberg.types import NestedField, StructType
from pyiceberg.utils.properties import property_as_int

from pipeline_output.stores.iceberg.snapshot.manifest_codec import manifest_writer


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


def summary(
    producer: Any, added_spec_id: Callable[[DataFile], int], properties: dict[str, str]
) -> Summary:
    """pyiceberg's snapshot summary of a producer's added and removed files, each file's
    partition summarised by its own spec (`added_spec_id` for added files).

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
    collector = SnapshotSummaryCollector(partition_summary_limit=limit or 0)
    for data_file in producer._added_data_files:
        spec = specs[added_spec_id(data_file)]
        collector.add_file(data_file=data_file, partition_spec=spec, schema=schema)
    for data_file in producer._deleted_data_files:
        spec = specs[data_file.spec_id]
        collector.remove_file(data_file=data_file, partition_spec=spec, schema=schema)
    parent = producer._parent_snapshot_id
    previous = metadata.snapshot_by_id(parent) if parent is not None else None
    return update_snapshot_summaries(
        summary=Summary(operation=producer._operation, **collector.build(), **properties),
        previous_summary=previous.summary if previous is not None else None,
    )
