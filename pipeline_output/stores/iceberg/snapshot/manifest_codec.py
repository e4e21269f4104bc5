"""Manifest files encoded by a native Avro codec (`fastavro`), not pyiceberg's per-entry Python.

pyiceberg writes every manifest entry through its pure-Python `BinaryEncoder`, one Avro block per
entry: rewriting the manifests of a table of 20,000 small files spent about half of an upsert
there. `FastManifestWriter` is pyiceberg's v2 manifest writer (the same counters, partition
summaries and `ManifestFile`) that buffers the entries and encodes them in one pass with
fastavro's C encoder, in blocks, with the same Avro schema (from pyiceberg's own Iceberg-to-Avro
conversion), file metadata and codec.

The entries carry what Iceberg's spec (and Java's writers) put there beyond pyiceberg 0.12's v2
schema: `referenced_data_file` (field 143) on a positional delete file that applies to one data
file (ours are file-scoped: `delete_files.referenced_path`), so readers associate it without
reading its bounds.

A manifest fastavro cannot encode (a partition value of a type this module does not map) is
written by pyiceberg's writer instead (`write_entries` returns False): same contents, slower.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from enum import Enum
from typing import Any

import fastavro
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestWriter,
    ManifestWriterV2,
    write_manifest,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
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
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from pipeline_output.errors import CorruptManifest
from pipeline_output.stores.iceberg.snapshot.delete_files import referenced_path

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


class FastManifestWriter(ManifestWriterV2):
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
        schema = _entry_schema(self._with_partition(2))
        avro = AvroSchemaConversion().iceberg_to_avro(schema, schema_name="manifest_entry")
        to_dict = _converter(schema.as_struct(), avro)
        meta = {k: v for k, v in self._meta.items() if k != AVRO_CODEC_KEY}
        codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(self._compression, self._compression)
        out = io.BytesIO()
        records = (_with_reference(to_dict(e), e) for e in entries)
        fastavro.writer(
            out,
            fastavro.parse_schema(avro),
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
    for format-version 2 tables with a codec fastavro has; pyiceberg's own otherwise."""
    metadata = producer._transaction.table_metadata
    codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(producer._compression, producer._compression)
    if content == ManifestContent.DELETES and metadata.format_version == 2 and codec in _CODECS:
        return FastManifestWriter(
            spec,
            producer.schema(),
            producer.new_manifest_output(),
            producer._snapshot_id,
            producer._compression,
            content=content,
        )
    if content == ManifestContent.DATA:
        writer: ManifestWriter = write_manifest(
            format_version=metadata.format_version,
            spec=spec,
            schema=producer.schema(),
            output_file=producer.new_manifest_output(),
            snapshot_id=producer._snapshot_id,
            avro_compression=producer._compression,
        )
        return writer
    return _DeleteManifestWriter(
        spec,
        producer.schema(),
        producer.new_manifest_output(),
        producer._snapshot_id,
        producer._compression,
    )


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer for delete files (0.12 writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


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
    for i, (field, spec) in enumerate(zip(struct.fields, avro["fields"], strict=True)):
        branch, tag = spec["type"], None
        if isinstance(branch, list):
            branch = next(b for b in branch if b != "null")
            tag = _branch_name(branch)
        parts.append((i, str(spec["name"]), _value(field.field_type, branch), tag))

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
