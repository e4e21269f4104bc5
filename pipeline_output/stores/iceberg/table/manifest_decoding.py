"""Manifest lists and manifests decoded by fastavro's C reader into pyiceberg's own records.

pyiceberg reads each manifest (and manifest list) with its pure-Python Avro reader: the file's
schema converted to an Iceberg schema and a reader resolved against the read schema, per file,
then each record field by field. Here fastavro decodes the file and each record becomes the
`ManifestFile` / `ManifestEntry` + `DataFile` pyiceberg's reader would have built: the same
positional values (enums as pyiceberg's enums, Avro maps as dicts, partition values as
pyiceberg reads them: dates as days, timestamps as microseconds), fields absent from the file
at their initial default, fields pyiceberg's read schema does not know (e.g.
`referenced_data_file`) dropped, sequence numbers and spec id inherited from the manifest.

A layout not checked here (a partition value of a type not mapped below — decimal, time, uuid,
fixed —, a required field missing, as in a v1 manifest list) is decoded by pyiceberg instead:
same records, slower. `pipeline_output_tests/stores/test_scan_planning.py` compares both.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from threading import Lock
from typing import Any, cast

import fastavro
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record
from pyiceberg.types import ListType

from pipeline_output.errors import UndecodableManifestLayout

_DATA_FILE = DATA_FILE_TYPE[DEFAULT_READ_VERSION]
_MANIFEST_FILE = MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION]
_MAPS = frozenset((108, 109, 110, 137, 125, 128))  # column sizes, counts, bounds: int -> value
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def manifest_files(file_io: Any, snapshot: Snapshot) -> list[ManifestFile]:
    """The snapshot's manifest list, as pyiceberg's `snapshot.manifests(io)` returns it."""
    if not snapshot.manifest_list:
        return list(snapshot.manifests(file_io))
    reader = _reader(file_io, snapshot.manifest_list)
    convert = _cached(_LISTS, reader, _list_converter)
    if convert is None:
        return list(snapshot.manifests(file_io))
    return [convert(record) for record in reader]


def manifest_entries(file_io: Any, manifest: ManifestFile) -> list[ManifestEntry]:
    """The manifest's live entries, as pyiceberg's `fetch_manifest_entry(discard_deleted=True)`
    returns them (sequence numbers and spec id inherited from `manifest`)."""
    reader = _reader(file_io, manifest.manifest_path)
    convert = _cached(_ENTRIES, reader, _entry_converter)
    if convert is None:
        return manifest.fetch_manifest_entry(file_io, discard_deleted=True)
    out = []
    for record in reader:
        entry = convert(record)
        if entry.status != ManifestEntryStatus.DELETED:
            out.append(_inherit_from_manifest(entry, manifest))
    return out


def _reader(file_io: Any, path: str) -> Any:
    with file_io.new_input(path).open() as stream:
        data = stream.read()
    return fastavro.reader(io.BytesIO(data))


_Converter = Callable[[Any], Any]
_ENTRIES: dict[str, _Converter | None] = {}
_LISTS: dict[str, _Converter | None] = {}
_LOCK = Lock()


def _cached(
    cache: dict[str, _Converter | None], reader: Any, build: Callable[[Any], _Converter]
) -> _Converter | None:
    """The record conversion of the reader's writer schema (None: pyiceberg decodes)."""
    text = reader.metadata.get("avro.schema", "")
    with _LOCK:
        if text in cache:
            return cache[text]
    try:
        convert: _Converter | None = build(reader.writer_schema)
    except UndecodableManifestLayout:
        convert = None
    with _LOCK:
        cache[text] = convert
    return convert


def _fields(record_schema: Any) -> dict[int, tuple[str, Any]]:
    if isinstance(record_schema, list):  # ["null", record]
        rest = [k for k in record_schema if k != "null"]
        record_schema = rest[0] if len(rest) == 1 else None
    if not isinstance(record_schema, dict) or record_schema.get("type") != "record":
        raise UndecodableManifestLayout
    return {f["field-id"]: (f["name"], f["type"]) for f in record_schema["fields"]}


def _columns(
    struct: Any, written: dict[int, tuple[str, Any]], special: dict[int, _Converter]
) -> list[tuple[str | None, _Converter | None, Any]]:
    """Per field of pyiceberg's read `struct`: (written name or None, conversion, default)."""
    out: list[tuple[str | None, _Converter | None, Any]] = []
    for field in struct.fields:
        if field.field_id not in written:
            if field.required:
                raise UndecodableManifestLayout
            out.append((None, None, field.initial_default))
            continue
        out.append((written[field.field_id][0], special.get(field.field_id), None))
    return out


def _values(
    columns: list[tuple[str | None, _Converter | None, Any]], raw: dict[str, Any]
) -> list[Any]:
    values = []
    for name, convert, default in columns:
        if name is None:
            values.append(default)
            continue
        value = raw.get(name)
        values.append(convert(value) if convert is not None and value is not None else value)
    return values


def _list_converter(writer: Any) -> _Converter:
    written = _fields(writer)
    summaries = written.get(507)
    special: dict[int, _Converter] = {517: ManifestContent}
    if summaries is not None:
        items = summaries[1]
        items = next((k for k in items if k != "null"), None) if isinstance(items, list) else items
        if not isinstance(items, dict) or items.get("type") != "array":
            raise UndecodableManifestLayout
        element = cast(ListType, _MANIFEST_FILE.find_field(507).field_type).element_type
        summary = _columns(element, _fields(items["items"]), {})
        special[507] = lambda parts: [PartitionFieldSummary(*_values(summary, p)) for p in parts]
    columns = _columns(_MANIFEST_FILE.as_struct(), written, special)
    return lambda record: ManifestFile(*_values(columns, record))


def _entry_converter(writer: Any) -> _Converter:
    top = _fields(writer)
    if any(i not in top for i in (0, 2)):
        raise UndecodableManifestLayout
    names = [top[i][0] if i in top else None for i in (0, 1, 3, 4)]
    written = _fields(top[2][1])
    special: dict[int, _Converter] = {134: DataFileContent, 101: FileFormat}
    special.update(dict.fromkeys(_MAPS, _as_dict))
    if 102 in written:
        special[102] = _partition(written[102][1])
    columns = _columns(_DATA_FILE, written, special)
    status, snapshot, sequence, file_sequence = names
    data_file = top[2][0]
    assert status is not None

    def entry(record: Any) -> ManifestEntry:
        return ManifestEntry(
            ManifestEntryStatus(record[status]),
            record.get(snapshot) if snapshot else None,
            record.get(sequence) if sequence else None,
            record.get(file_sequence) if file_sequence else None,
            DataFile(*_values(columns, record[data_file])),
        )

    return entry


def _as_dict(pairs: list[dict[str, Any]]) -> dict[Any, Any]:
    return {pair["key"]: pair["value"] for pair in pairs}


def _partition(avro: Any) -> Callable[[Any], Any]:
    """The partition record as pyiceberg reads it: a `Record` of the values in written order,
    dates as days and timestamps as microseconds since the epoch (fastavro gives objects)."""
    if not isinstance(avro, dict) or avro.get("type") != "record":
        raise UndecodableManifestLayout
    parts = []
    for field in avro["fields"]:
        kind = field["type"]
        if isinstance(kind, list):  # ["null", T]
            rest = [k for k in kind if k != "null"]
            if len(rest) != 1:
                raise UndecodableManifestLayout
            kind = rest[0]
        parts.append((field["name"], _partition_value(kind)))

    def convert(values: dict[str, Any]) -> Record:
        return Record(
            *(
                value if (value := values.get(name)) is None or to is None else to(value)
                for name, to in parts
            )
        )

    return convert


def _partition_value(kind: Any) -> Callable[[Any], Any] | None:
    if isinstance(kind, str):
        if kind in ("int", "long", "string", "boolean", "float", "double", "bytes"):
            return None
        raise UndecodableManifestLayout
    if not isinstance(kind, dict):
        raise UndecodableManifestLayout
    logical, base = kind.get("logicalType"), kind.get("type")
    if logical is None and base in ("int", "long", "string", "boolean", "float", "double"):
        return None
    if logical == "date" and base == "int":
        return _days
    if logical == "timestamp-micros" and base == "long":
        return _micros
    raise UndecodableManifestLayout  # time, uuid, decimal, fixed, ...: pyiceberg decodes


def _days(value: date) -> int:
    return (value - _EPOCH_DAY).days


def _micros(value: datetime) -> int:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _MICRO
