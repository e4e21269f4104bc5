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

What a write reuses of what it read: of a manifest laid out as Iceberg's v2 `manifest_entry`
(status, snapshot_id, sequence_number, file_sequence_number as `["null", "long"]` unions, then
data_file), `read_manifest` keeps each live entry's `data_file` record as the bytes it was
written as (`RawManifest`, with the file's Avro schema, metadata and codec); of others, no
bytes. Everything that writes manifest or manifest-list bytes — the rewrite from those bytes,
removed entries and new manifests encoded from their values — is `manifest_encoding`'s, which
builds on this module (its Avro primitives `avro_long` and `avro_metadata` are here: this
module writes Avro headers and blocks of its own, for polars to read).

A write's whole read without pyiceberg's reader tree.

`read_manifest` decodes a manifest of the standard v2 layout (`_native_layout`: the prefix
above, the data file's fields in the spec's order, partition values of plain types) field by
field on pyiceberg's C decoder (`_native_entries`): the same entries, value types and bytes as
pyiceberg's reader, without converting the file's schema and resolving a reader tree for it
(~1 ms per schema in a fresh process) or its per-field Python (~12 µs an entry; here ~5). The
manifest list is decoded by fastavro (`manifest_list`). Other layouts: pyiceberg's reader,
resolved once per schema (`ResolvedAvroFile`).

A planner's read: the entries with only the statistics it uses.

A compaction plans 20,000 small files from their paths, sizes, row counts, partitions and the
first sort column's bounds; decoding every column's sizes, counts and bounds cost most of its
plan, and the commit writes the removed entries without their metrics anyway. `read_manifest`
with `bounds` (`read_planned`) cuts each one-entry Avro block (pyiceberg's writer: every
append's manifest) out of the file, decompresses it, and decodes them all at once with polars'
native Avro reader: the entries' files are `PartialDataFile`s (the asked columns' bounds and
null counts; the other statistics None), with the same raw `data_file` bytes and the columns
they were made of (`EntryValues`: what removes them, `manifest_encoding.removed_manifest`).
Such an index never serves a whole read (`manifests.ReadManifests`), and an entry re-encoded
from it is decoded whole first (`manifests.LiveEntries.whole`). Other layouts are decoded whole.
"""

from __future__ import annotations

import io
import json
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import compress, repeat
from operator import attrgetter, getitem, itemgetter
from threading import Lock
from typing import Any, cast, overload

import fastavro
import polars as pl
from pyiceberg.avro.codecs import KNOWN_CODECS
from pyiceberg.avro.codecs.codec import Codec
from pyiceberg.avro.codecs.deflate import DeflateCodec
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import MAGIC, META_SCHEMA, SYNC_SIZE, AvroFile, AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
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
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record
from pyiceberg.types import ListType
from pyiceberg.utils.lazydict import LazyDict

from pipeline_output.errors import CorruptManifest, UndecodableManifestLayout

_DATA_FILE = DATA_FILE_TYPE[DEFAULT_READ_VERSION]
_MANIFEST_FILE = MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION]
# the column metrics' field ids (sizes, counts, bounds: int -> value maps)
METRIC_MAPS = frozenset((108, 109, 110, 137, 125, 128))
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


def live_paths(file_io: Any, manifest: ManifestFile) -> list[str]:
    """The file paths of the manifest's live (added or existing) entries (`entry_paths`)."""
    deleted = int(ManifestEntryStatus.DELETED)
    return [path for status, _, path in entry_paths(file_io, manifest) if status != deleted]


def entry_paths(file_io: Any, manifest: ManifestFile) -> list[tuple[int, int | None, str]]:
    """(status, snapshot id, file path) of each entry of the manifest, in order, the snapshot id
    inherited from the manifest when the entry has none: what reachability (snapshot expiry,
    orphan removal) needs of it (`entry_columns`, entry by entry)."""
    return list(zip(*entry_columns(file_io, manifest), strict=True))


EntryColumns = tuple[list[int], list[int | None], list[str]]


def entry_columns(file_io: Any, manifest: ManifestFile) -> EntryColumns:
    """`entry_paths` as three columns (status, snapshot id, file path), no tuple built per entry
    (a compaction's 20,000 removed entries: ~5 ms less before expiry's first delete). A manifest
    of big blocks is decoded by polars, the data file's fields read as columns of their own
    (`_flat_schema`: the statistics skipped undecoded); the others by fastavro against a reader
    schema projected to these three fields, skipping the rest of the entry (partition, counts,
    bounds) undecoded; a layout it cannot project is decoded by pyiceberg."""
    with file_io.new_input(manifest.manifest_path).open() as stream:
        data = stream.read()
    buffer = io.BytesIO(data)
    writer = fastavro.reader(buffer)
    first_block = _varint(data, buffer.tell())  # entries in the first block (after the header)
    text = writer.metadata.get("avro.schema", "")
    with _LOCK:
        known = text in _PATHS
        projected = _PATHS.get(text)
    if not known:
        try:
            projected = _path_projection(writer.writer_schema)
            projected["flat"] = _flat_schema(text)
        except UndecodableManifestLayout:
            projected = None
        with _LOCK:
            _PATHS[text] = projected
    inherited = manifest.added_snapshot_id
    if projected is None:
        entries = manifest.fetch_manifest_entry(file_io, discard_deleted=False)
        return (
            [int(e.status) for e in entries],
            [e.snapshot_id for e in entries],
            [e.data_file.file_path for e in entries],
        )
    status, snapshot, data_file, path = projected["names"]
    columns = None
    if first_block >= NATIVE_BLOCK:
        start = buffer.tell()
        flat = projected["flat"]
        if flat is not None:  # the statistics skipped undecoded (`_flat_schema`)
            codec = writer.metadata.get("avro.codec", "null")
            codec = codec if isinstance(codec, str) else bytes(codec).decode()
            head = MAGIC + avro_metadata({"avro.schema": flat, "avro.codec": codec})
            head += data[start - SYNC_SIZE : start]
            names = (status, snapshot, None, path)
            columns = _native_halves(head + data[start:], len(head), names, inherited)
        if columns is None:
            columns = _native_halves(data, start, projected["names"], inherited)
    if columns is not None:
        return columns
    records: Any = fastavro.reader(io.BytesIO(data), reader_schema=projected["schema"])
    statuses: list[int] = []
    owners: list[int | None] = []
    paths: list[str] = []
    for record in records:
        own = record.get(snapshot) if snapshot else None
        statuses.append(record[status])
        owners.append(inherited if own is None else own)
        paths.append(record[data_file][path])
    return statuses, owners, paths


_PATHS: dict[str, dict[str, Any] | None] = {}


# Blocks of at least this many entries are decoded by polars: it pays per block (~0.5 ms), fastavro
# per entry (~20 µs). pyiceberg's writer puts each entry in a block of its own; ours
# (`manifest_encoding.rewrite_manifest`, a commit's removed entries) up to
# `manifest_encoding.BLOCK_ENTRIES`.
NATIVE_BLOCK = 100


def _varint(data: bytes, at: int) -> int:
    """The zigzag varint at `at` in `data` (-1: none there)."""
    shift = value = 0
    while at < len(data):
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1)
        at += 1
        shift += 7
    return -1


def _native_paths(
    data: bytes, names: tuple[str, str | None, str | None, str], inherited: int | None = None
) -> EntryColumns | None:
    """The status, snapshot id (`inherited` where an entry has none) and file path columns of
    the manifest `data`, decoded by polars' native Avro reader (~10x fastavro's projected
    decode: a compaction's 20,000 removed entries in ~0.05 s, and without the GIL); None when
    polars cannot read it (fastavro then). The data file's name None: `data`'s schema has the
    data file's fields inline (`_flat_schema`), the path a column of its own."""
    status, snapshot, data_file, path = names
    wanted = [status, *([snapshot] if snapshot else []), data_file or path]
    try:
        frame = pl.read_avro(io.BytesIO(data), columns=wanted)
        statuses = frame.get_column(status)
        if data_file is None:
            paths = frame.get_column(path)
        else:
            paths = frame.get_column(data_file).struct.field(path)
        owners = frame.get_column(snapshot) if snapshot else pl.Series([None] * frame.height)
    except Exception:  # a layout or codec polars does not read: fastavro decodes it
        return None
    if (
        not statuses.dtype.is_integer()
        or not (owners.dtype.is_integer() or owners.dtype == pl.Null)
        or paths.dtype != pl.String
        or statuses.null_count()
        or paths.null_count()
    ):
        return None
    if inherited is not None and (owners.dtype == pl.Null or owners.null_count()):
        owners = owners.cast(pl.Int64).fill_null(inherited)
    return statuses.to_list(), owners.to_list(), paths.to_list()


# A manifest of at least this many blocks is decoded as two halves, each in its own thread
# (polars decodes without the GIL): a compaction's 20,000 removed entries in ~0.04 s, not ~0.07.
PARALLEL_BLOCKS = 4


def _native_halves(
    data: bytes,
    header: int,
    names: tuple[str, str | None, str | None, str],
    inherited: int | None = None,
) -> EntryColumns | None:
    """`_native_paths` of the Avro file `data` (its header `header` bytes long), the two halves
    of its blocks decoded at the same time when it has `PARALLEL_BLOCKS` or more."""
    ends = _block_ends(data, header)
    if len(ends) < PARALLEL_BLOCKS:
        return _native_paths(data, names, inherited)
    middle = ends[len(ends) // 2 - 1]
    halves = [data[:middle], data[:header] + data[middle:]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(lambda half: _native_paths(half, names, inherited), halves)
    if first is None or second is None:
        return None
    return first[0] + second[0], first[1] + second[1], first[2] + second[2]


def _block_ends(data: bytes, header: int) -> list[int]:
    """Where each Avro block of `data` after its header ends (sync marker included); [] when
    a block does not parse (its decoder then reports it)."""
    ends: list[int] = []
    at = header
    try:
        while at < len(data):
            at = _skip_varint(data, at)  # the block's entry count
            size = _varint(data, at)  # its bytes
            end = _skip_varint(data, at) + size + SYNC_SIZE
            if size < 0 or end > len(data):
                return []
            ends.append(end)
            at = end
    except IndexError:  # cut short
        return []
    return ends


def _path_projection(writer: Any) -> dict[str, Any]:
    """The manifest entry schema `writer` cut down to the entry's status, snapshot id and data
    file path (field ids 0, 1, 2 and 100), under the writer's own names (schema resolution
    matches them)."""
    if not isinstance(writer, dict) or writer.get("type") != "record":
        raise UndecodableManifestLayout
    top = {f.get("field-id"): f for f in writer["fields"]}
    status, snapshot, data_file = top.get(0), top.get(1), top.get(2)
    if status is None or data_file is None or status.get("type") != "int":
        raise UndecodableManifestLayout
    record = data_file["type"]
    if not isinstance(record, dict) or record.get("type") != "record":
        raise UndecodableManifestLayout
    path = next((f for f in record["fields"] if f.get("field-id") == 100), None)
    if path is None or path.get("type") != "string":
        raise UndecodableManifestLayout
    cut = {**data_file, "type": {"type": "record", "name": record["name"], "fields": [path]}}
    fields = [status, *([snapshot] if snapshot is not None else []), cut]
    schema = {"type": "record", "name": writer["name"], "fields": fields}
    names = (
        status["name"],
        snapshot["name"] if snapshot else None,
        data_file["name"],
        path["name"],
    )
    return {"schema": fastavro.parse_schema(schema), "names": names}


def _flat_schema(text: str) -> str | None:
    """The manifest entry schema `text` with its data file's fields in the data file's place:
    the same bytes (an Avro record is its fields one after the other, nothing around them) read
    as top-level columns, so polars' reader skips the fields not asked for — the column
    statistics, ~90 % of an entry's bytes — undecoded instead of building them into the data
    file's struct (a compaction's 20,000 removed entries: ~0.035 s, not ~0.08). None when a
    data file field's name is also an entry field's."""
    try:
        schema = json.loads(text)
        top = schema["fields"]
        data_file = next(f for f in top if f.get("field-id") == 2)
        inner = data_file["type"]["fields"]
        names = [f["name"] for f in top if f is not data_file] + [f["name"] for f in inner]
    except (ValueError, KeyError, TypeError, StopIteration):
        return None
    if len(set(names)) != len(names):
        return None
    fields = [field for f in top for field in (inner if f is data_file else [f])]
    return json.dumps({**schema, "fields": fields})


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
        # (the field found among the list's own: `find_field` indexes the whole schema by a
        # visitor first, ~0.5 ms in a fresh process)
        summaries_field = next(f for f in _MANIFEST_FILE.fields if f.field_id == 507)
        element = cast(ListType, summaries_field.field_type).element_type
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
    special.update(dict.fromkeys(METRIC_MAPS, _as_dict))
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


_PREFIX = [(0, "int"), (1, ["null", "long"]), (3, ["null", "long"]), (4, ["null", "long"])]


@dataclass(frozen=True)
class RawManifest:
    """A manifest's Avro header and each live entry's `data_file` bytes (in entry order); of a
    planner's read, also the values it decoded, column by column (`EntryValues`)."""

    meta: dict[str, str]
    codec: type[Codec] | None
    data_files: Sequence[bytes]
    values: EntryValues | None = None

    @property
    def schema_text(self) -> str:
        """The Avro schema the entries were written with (entries of one schema mix)."""
        return self.meta.get("avro.schema", "")


def read_manifest(
    manifest: ManifestFile,
    io: FileIO,
    *,
    bounds: frozenset[int] | None = None,
    data: bytes | None = None,
) -> tuple[list[ManifestEntry], RawManifest | None]:
    """The manifest's live entries (sequence numbers inherited, as pyiceberg's
    `fetch_manifest_entry`), and their raw `data_file` bytes when its layout allows reuse.

    With `bounds` (field ids), a planner's read: a data manifest whose entries can be cut from
    its blocks (`read_planned`) is decoded natively with only those columns' statistics — the
    entries' files are `PartialDataFile`s; any other manifest is decoded whole. `data`: the
    manifest's bytes, when the caller fetched them (a planner's read). A manifest of the
    standard v2 layout is decoded by `_native_entries`, any other by pyiceberg's reader."""
    if bounds is not None:
        if data is None:
            data = manifest_bytes(io, manifest)
        planned = read_planned(manifest, data, bounds, cut=False)
        if planned is not None:
            return _bytes_later(manifest, io, *planned)
    if data is None:  # (the whole read's own, as pyiceberg's reader opens it)
        with io.new_input(manifest.manifest_path).open() as stream:
            data = stream.read()
    try:
        native = _native_entries(manifest, data)
    except (EOFError, ValueError, IndexError, KeyError, UnicodeDecodeError):
        native = None  # damaged, or not what its schema says: pyiceberg's reader reports it
    if native is not None:
        return native
    entries: list[ManifestEntry] = []
    raws: list[bytes] = []
    with ResolvedAvroFile(
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        meta = dict(reader.header.meta)
        reusable = _standard_prefix(meta.get("avro.schema", ""))
        codec = reader.header.compression_codec()
        decoder, sync, first = reader.decoder, reader.header.sync, True
        while True:
            if not first and decoder.read(SYNC_SIZE) != sync:
                raise CorruptManifest(f"manifest {manifest.manifest_path}: bad Avro sync marker")
            first = False
            try:
                count = decoder.read_int()
            except EOFError:
                break
            block = decoder.read_bytes()
            if codec is not None:
                block = codec.decompress(block)
            records = new_decoder(block)
            for _ in range(count):
                start = records.tell()
                entry = reader.reader.read(records)
                if entry.status == ManifestEntryStatus.DELETED:
                    continue
                entries.append(_inherit_from_manifest(entry, manifest))
                if reusable:
                    raws.append(block[_after_prefix(block, start) : records.tell()])
    raw = RawManifest(meta=meta, codec=codec, data_files=raws) if reusable else None
    return entries, raw


# The standard v2 data file layout `_native_entries` decodes: (field id, Avro type) in order;
# an int -> long map, an int -> bytes map, and referenced_data_file (143) optional at the end.
_LONG_MAP, _BYTES_MAP = "long map", "bytes map"
_NATIVE_FILE = (
    (134, "int"),
    (100, "string"),
    (101, "string"),
    (102, "partition"),
    (103, "long"),
    (104, "long"),
    (108, ["null", _LONG_MAP]),
    (109, ["null", _LONG_MAP]),
    (110, ["null", _LONG_MAP]),
    (137, ["null", _LONG_MAP]),
    (125, ["null", _BYTES_MAP]),
    (128, ["null", _BYTES_MAP]),
    (131, ["null", "bytes"]),
    (132, ["null", "array long"]),
    (135, ["null", "array long"]),
    (140, ["null", "int"]),
)
_REFERENCED = (143, ["null", "string"])
# a partition value's Avro type -> how it is read (pyiceberg reads dates and timestamps as ints)
_NATIVE_PARTITION = {
    "int": "long",
    "long": "long",
    "string": "string",
    "boolean": "boolean",
    ("int", "date"): "long",
    ("long", "timestamp-micros"): "long",
}
_Layout = tuple[tuple[tuple[str, bool], ...], bool]
_NATIVE: dict[str, _Layout | None] = {}  # schema text -> its layout


def _native_layout(text: str) -> _Layout | None:
    """Of a manifest entry schema `text` laid out as `_NATIVE_FILE` (or with `_REFERENCED`
    after it): its partition fields (how each is read, whether nullable) and whether the
    entries end with `referenced_data_file`; else None. Kept per schema text."""
    with _LOCK:
        if text in _NATIVE:
            return _NATIVE[text]
    layout: _Layout | None
    try:
        layout = _native_layout_of(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError, UndecodableManifestLayout):
        layout = None
    with _LOCK:
        _NATIVE[text] = layout
    return layout


def _native_layout_of(schema: dict[str, Any]) -> _Layout | None:
    if not _standard_fields(schema["fields"]):
        return None
    fields = schema["fields"][-1]["type"]["fields"]
    kinds = [(f["field-id"], _native_kind(f["type"])) for f in fields]
    if kinds not in (list(_NATIVE_FILE), [*_NATIVE_FILE, _REFERENCED]):
        return None
    partition = fields[3]["type"]
    if partition.get("type") != "record":
        return None
    out = []
    for field in partition["fields"]:
        kind, nullable = field["type"], False
        if isinstance(kind, list):
            if len(kind) != 2 or kind[0] != "null":
                return None
            kind, nullable = kind[1], True
        if isinstance(kind, dict):
            kind = (kind.get("type"), kind.get("logicalType"))
        read = _NATIVE_PARTITION.get(kind)
        if read is None:
            return None
        out.append((read, nullable))
    return tuple(out), len(kinds) > len(_NATIVE_FILE)


def _native_kind(avro: Any) -> Any:
    """An Avro type as `_NATIVE_FILE` names it (anything else: itself)."""
    if isinstance(avro, list):
        return [_native_kind(branch) for branch in avro]
    if not isinstance(avro, dict):
        return avro
    if avro.get("type") == "record":
        return "partition"  # (only the data file's field 102 may be one)
    if avro.get("type") != "array":
        return avro
    items = avro["items"]
    if items in ("int", "long"):  # (equality ids: ints, or longs as pyiceberg writes them)
        return "array long"
    if items.get("type") == "record" and avro.get("logicalType") == "map":
        pair = [(f["name"], f["type"]) for f in items["fields"]]
        if pair == [("key", "int"), ("value", "long")]:
            return _LONG_MAP
        if pair == [("key", "int"), ("value", "bytes")]:
            return _BYTES_MAP
    return avro


def _native_entries(
    manifest: ManifestFile, data: bytes
) -> tuple[list[ManifestEntry], RawManifest] | None:
    """`read_manifest`'s decode of a manifest whose entries are laid out as pyiceberg's (and
    our) v2 writers write them (`_native_layout`), field by field on pyiceberg's C decoder,
    without pyiceberg's reader tree: converting the file's schema and resolving a reader
    against it cost ~1 ms per schema in a fresh process, its per-field Python ~12 µs an entry.
    None when the manifest is laid out otherwise (pyiceberg's reader decodes it)."""
    header = _avro_header(data)
    if header is None:
        return None
    meta, sync, at = header
    layout = _native_layout(meta.get("avro.schema", ""))
    name = meta.get("avro.codec", "null")
    if layout is None or name not in KNOWN_CODECS:
        return None
    codec = KNOWN_CODECS[name]
    entries: list[ManifestEntry] = []
    raws: list[bytes] = []
    end = len(data)
    while at < end:
        blocks = new_decoder(data[at : at + 20])
        count = blocks.read_int()
        size = blocks.read_int()
        at += blocks.tell()
        block = data[at : at + size]
        at += size
        if count < 0 or size < 0 or at + SYNC_SIZE > end or data[at : at + SYNC_SIZE] != sync:
            raise CorruptManifest(f"manifest {manifest.manifest_path}: bad Avro sync marker")
        at += SYNC_SIZE
        if codec is not None:
            block = codec.decompress(block)
        _native_block(block, count, layout, manifest, entries, raws)
    return entries, RawManifest(meta=meta, codec=codec, data_files=raws)


def _avro_header(data: bytes) -> tuple[dict[str, str], bytes, int] | None:
    """An Avro file's metadata, sync marker and where its first block starts (None: no Avro)."""
    if not data.startswith(MAGIC):
        return None
    header = new_decoder(data)
    header.skip(len(MAGIC))
    meta: dict[str, str] = {}
    count = header.read_int()
    while count:
        if count < 0:
            count = -count
            header.skip_int()
        for _ in range(count):
            key = header.read_utf8()
            meta[key] = header.read_bytes().decode()
        count = header.read_int()
    sync = header.read(SYNC_SIZE)
    return meta, sync, header.tell()


def _native_block(
    block: bytes,
    count: int,
    layout: _Layout,
    manifest: ManifestFile,
    entries: list[ManifestEntry],
    raws: list[bytes],
) -> None:
    """Decode the `count` entries of `block` (`_native_entries`): the live ones, their snapshot
    id and sequence numbers inherited from `manifest` (pyiceberg's `_inherit_from_manifest`),
    to `entries`, each one's `data_file` bytes to `raws`."""
    decoder = new_decoder(block)
    read_int, tell, read_utf8, read_bytes, read_ints = (
        decoder.read_int,
        decoder.tell,
        decoder.read_utf8,
        decoder.read_bytes,
        decoder.read_ints,
    )
    partition, referenced = layout
    deleted, added = int(ManifestEntryStatus.DELETED), int(ManifestEntryStatus.ADDED)
    inherit, snapshot = manifest.sequence_number, manifest.added_snapshot_id
    spec_id = manifest.partition_spec_id
    for _ in range(count):
        status = read_int()
        snap = read_int() if read_int() else None
        sequence = read_int() if read_int() else None
        file_sequence = read_int() if read_int() else None
        start = tell()
        content = read_int()
        path = read_utf8()
        file_format = read_utf8()
        values: list[Any] = []
        for kind, nullable in partition:
            if nullable and not read_int():
                values.append(None)
            elif kind == "long":
                values.append(read_int())
            elif kind == "string":
                values.append(read_utf8())
            else:
                values.append(decoder.read_boolean())
        rows = read_int()
        size = read_int()
        maps: list[Any] = []
        for _ in _COUNT_MAPS:  # (inline: four calls an entry were a fifth of its decode)
            if not read_int():
                maps.append(None)
                continue
            items = read_int()
            if items > 0:
                pairs = read_ints(items * 2)
                items = read_int()
                if items == 0:
                    maps.append(LazyDict((pairs,)))
                    continue
                maps.append(_long_map_rest(decoder, [pairs], items))
            else:
                maps.append({} if items == 0 else _long_map_rest(decoder, [], items))
        sizes, counts, nulls, nans = maps
        lower = _bytes_map(decoder)
        upper = _bytes_map(decoder)
        key_metadata = read_bytes() if read_int() else None
        splits = _array(decoder) if read_int() else None
        ids = _array(decoder) if read_int() else None
        sort_order = read_int() if read_int() else None
        if referenced and read_int():
            decoder.skip_utf8()
        if status == deleted:
            continue
        raws.append(block[start : tell()])
        data_file = _NEW_FILE(DataFile)
        _SET(data_file, "_spec_id", spec_id)  # (as `object` sets: `DataFile`'s is a Python call)
        _SET(
            data_file,
            "_data",
            [
                _content(content),
                path,
                _format(file_format),
                Record(*values),
                rows,
                size,
                sizes,
                counts,
                nulls,
                nans,
                lower,
                upper,
                key_metadata,
                splits,
                ids,
                sort_order,
            ],
        )
        inherits = inherit is not None and (inherit == 0 or status == added)
        entries.append(
            ManifestEntry(
                _status(status),
                snapshot if snap is None else snap,
                inherit if sequence is None and inherits else sequence,
                inherit if file_sequence is None and inherits else file_sequence,
                data_file,
            )
        )


_NEW_FILE = DataFile.__new__


_COUNT_MAPS = range(4)  # column sizes, value counts, null value counts, NaN value counts


def _long_map_rest(decoder: Any, contents: list[tuple[int, ...]], count: int) -> Mapping[int, int]:
    """An int -> long map as pyiceberg reads it (a `LazyDict`), its blocks from the one whose
    count is `count` on (`contents`: the blocks read before it)."""
    while count != 0:
        if count < 0:
            count = -count
            decoder.skip_int()  # (the block's size)
        contents.append(decoder.read_ints(count * 2))
        count = decoder.read_int()
    return LazyDict(contents)


def _bytes_map(decoder: Any) -> dict[int, bytes] | None:
    """An optional int -> bytes map."""
    if not decoder.read_int():
        return None
    found: dict[int, bytes] = {}
    count = decoder.read_int()
    while count != 0:
        if count < 0:
            count = -count
            decoder.skip_int()
        decoder.read_int_bytes_dict(count, found)
        count = decoder.read_int()
    return found


def _array(decoder: Any) -> list[int]:
    """An array of ints or longs."""
    found: list[int] = []
    count = decoder.read_int()
    while count != 0:
        if count < 0:
            count = -count
            decoder.skip_int()
        found.extend(decoder.read_ints(count))
        count = decoder.read_int()
    return found


def _bytes_later(
    manifest: ManifestFile, io: FileIO, entries: list[ManifestEntry], raw: RawManifest
) -> tuple[list[ManifestEntry], RawManifest]:
    """A planner's read of `manifest` whose entries' bytes are read when asked (`_Unread`)."""

    def load() -> list[bytes]:
        return _planned_bytes(manifest, manifest_bytes(io, manifest))

    later = _Unread(load, len(entries)) if entries else raw.data_files
    return entries, RawManifest(raw.meta, raw.codec, later, raw.values)


class ResolvedAvroFile(AvroFile[Any]):
    """pyiceberg's `AvroFile`, its file schema and reader tree resolved once per process for
    each Avro schema text and read schema (`_resolved`), not once per file: pyiceberg converts
    every file's header schema to an Iceberg schema and resolves a reader against the read
    schema, ~0.9 ms a manifest, as much as decoding 80 entries
    (benchmarks/results/small-writes.md, "Session 11"). Every manifest a table's writer writes
    carries the same schema text. pyiceberg's readers keep no state between records: one tree
    serves every file and thread."""

    def __enter__(self) -> ResolvedAvroFile:
        with self.input_file.open() as stream:
            self.decoder = new_decoder(stream.read())
        self.header = _HEADER.read(self.decoder)
        self.schema, self.reader = _resolved(
            self.header, self.read_schema, self.read_types, self.read_enums
        )
        if not self.read_schema:
            self.read_schema = self.schema
        return self


_HEADER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})
_RESOLVED: OrderedDict[tuple[Any, ...], tuple[Schema, Schema | None, Reader]] = OrderedDict()
_RESOLVED_KEPT = 64  # distinct (schema text, read schema) pairs: a spec per table, a few tables


def _resolved(
    header: AvroFileHeader,
    read_schema: Schema | None,
    read_types: Mapping[int, Callable[..., Any]],
    read_enums: Mapping[int, Callable[..., Any]],
) -> tuple[Schema, Reader]:
    """The file schema of `header` and its reader against `read_schema`, resolved once."""
    text = header.meta.get("avro.schema")
    key = (text, id(read_schema), tuple(read_types.items()), tuple(read_enums.items()))
    with _LOCK:
        found = _RESOLVED.get(key)
        if found is not None and found[1] is read_schema:  # (the id of a live object)
            _RESOLVED.move_to_end(key)
            return found[0], found[2]
    schema = header.get_schema()
    reader = resolve_reader(schema, read_schema or schema, dict(read_types), dict(read_enums))
    with _LOCK:
        _RESOLVED[key] = (schema, read_schema, reader)
        while len(_RESOLVED) > _RESOLVED_KEPT:
            _RESOLVED.popitem(last=False)
    return schema, reader


def manifest_list(file_io: FileIO, snapshot: Snapshot) -> list[ManifestFile]:
    """The snapshot's manifest list as pyiceberg's `read_manifest_list` reads it: decoded by
    fastavro (`_list_converter`, ~0.2 ms in a fresh process, where pyiceberg's reader took ~1.2
    to resolve for the list's schema), a layout it does not convert by pyiceberg's reader,
    resolved once per schema (`ResolvedAvroFile`)."""
    if not snapshot.manifest_list:
        return list(snapshot.manifests(file_io))
    reader = _reader(file_io, snapshot.manifest_list)
    convert = _cached(_LISTS, reader, _list_converter)
    if convert is not None:
        return [convert(record) for record in reader]
    with ResolvedAvroFile(
        file_io.new_input(snapshot.manifest_list),
        _MANIFEST_FILE,
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return list(reader)


def manifest_bytes(io: FileIO, manifest: ManifestFile) -> bytes:
    """The manifest file's bytes."""
    with io.new_input(manifest.manifest_path).open() as stream:
        return stream.read()


@dataclass(frozen=True)
class EntryValues:
    """The values of live entries a removed entry is written from
    (`manifest_encoding.removed_manifest`), column by column, in entry order: as a planner
    decoded them (`read_planned`: the lists its entries were made of), or taken from the entries
    (`of`). A column of values the entries share holds one object repeated (a planner's:
    `_converted`, `_partition_records`, `_interned`)."""

    sequences: list[Any]
    file_sequences: list[Any]
    paths: list[str]
    rows: list[Any]
    sizes: list[Any]
    # content, format, partition, key metadata, split offsets, equality ids, sort order
    shared: tuple[list[Any], ...]

    @classmethod
    def of(cls, entries: Sequence[ManifestEntry]) -> EntryValues:
        """The values of `entries` (any read), by C-level getters."""
        values = list(map(RECORD_VALUES, entries))
        files = list(map(RECORD_VALUES, map(_ENTRY_FILE, values)))
        return cls(
            sequences=list(map(_SEQUENCE, values)),
            file_sequences=list(map(_FILE_SEQUENCE, values)),
            paths=list(map(_PATH, files)),
            rows=list(map(_ROWS, files)),
            sizes=list(map(_SIZE, files)),
            shared=tuple(list(map(getter, files)) for getter in _SHAPED),
        )

    def __len__(self) -> int:
        return len(self.paths)

    def group(self) -> tuple[Record, DataFileContent] | None:
        """The partition and content every one of the entries' files has (one object of
        each: a planner's files of one partition), else None."""
        content, _, partition = self.shared[:3]
        if not one_object(partition) or content.count(content[0]) != len(content):
            return None
        return partition[0], content[0]

    def totals(self) -> tuple[int, int]:
        """The files' bytes and rows."""
        return sum(self.sizes), sum(self.rows)

    def partitions(self) -> list[Record]:
        """The files' partitions, each object once."""
        column = self.shared[2]
        if one_object(column):
            return column[:1]
        return list(dict(zip(map(id, column), column, strict=True)).values())

    def picked(self, hits: list[bool]) -> EntryValues:
        """The values of the entries `hits` marks."""
        return EntryValues(
            sequences=list(compress(self.sequences, hits)),
            file_sequences=list(compress(self.file_sequences, hits)),
            paths=list(compress(self.paths, hits)),
            rows=list(compress(self.rows, hits)),
            sizes=list(compress(self.sizes, hits)),
            shared=tuple(list(compress(column, hits)) for column in self.shared),
        )


def one_object(column: list[Any]) -> bool:
    """Whether `column` (not empty) holds one value only: compared only when its first and
    last are one object (a planner's column of one value holds one object; others, as a
    rule, differ there) — a partition `Record` compares by a Python call."""
    first = column[0]
    return column[-1] is first and column.count(first) == len(column)


# C-level getters of pyiceberg's records' values (the public ones `manifest_encoding` uses too)
# a pyiceberg `DataFile`'s values by field id (their positions)
DATA_FILE_AT = {f.field_id: n for n, f in enumerate(_DATA_FILE.fields)}
_ROWS = itemgetter(DATA_FILE_AT[103])
_PARTITION = itemgetter(DATA_FILE_AT[102])
RECORD_VALUES = attrgetter("_data")  # a pyiceberg `Record`'s values
# a `ManifestEntry`'s values by field id
ENTRY_AT = {
    f.field_id: n for n, f in enumerate(MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION].fields)
}
_SEQUENCE, _FILE_SEQUENCE = itemgetter(ENTRY_AT[3]), itemgetter(ENTRY_AT[4])
# the fields of a removed file's record its files share, as a rule (`EntryValues.shared`)
_SHAPED = tuple(itemgetter(DATA_FILE_AT[i]) for i in (134, 101, 102, 131, 132, 135, 140))
_PATH = itemgetter(DATA_FILE_AT[100])
_SIZE = itemgetter(DATA_FILE_AT[104])
_STATISTICS = {
    name: itemgetter(DATA_FILE_AT[i])
    for name, i in (("lower_bounds", 125), ("upper_bounds", 128), ("null_value_counts", 110))
}
_FILE_COLUMN = attrgetter("_column")  # a `PartialDataFile`'s statistics' column
_CONTENT = itemgetter(DATA_FILE_AT[134])
_SPEC_ID = attrgetter("_spec_id")  # (`DataFile.spec_id` is a property: a Python call)
_ENTRY_FILE = itemgetter(ENTRY_AT[2])


def file_paths(files: Iterable[DataFile]) -> list[str]:
    """The files' paths, taken by C-level getters: no Python property call per file (a
    compaction's commit matches 20,000 removed files against every live entry)."""
    return list(map(_PATH, map(RECORD_VALUES, files)))


def entry_file_paths(entries: Iterable[ManifestEntry]) -> list[str]:
    """The paths of the entries' data files (`file_paths`)."""
    return list(map(_PATH, map(RECORD_VALUES, map(_ENTRY_FILE, map(RECORD_VALUES, entries)))))


def file_sizes(files: Iterable[DataFile]) -> list[int]:
    """The files' sizes in bytes (`file_paths`: C-level getters)."""
    return list(map(_SIZE, map(RECORD_VALUES, files)))


def file_rows(files: Iterable[DataFile]) -> list[int]:
    """The files' record counts (`file_paths`: C-level getters)."""
    return list(map(_ROWS, map(RECORD_VALUES, files)))


def file_contents(files: Iterable[DataFile]) -> list[DataFileContent]:
    """The files' contents (`file_paths`: C-level getters)."""
    return list(map(_CONTENT, map(RECORD_VALUES, files)))


def file_partitions(files: Iterable[DataFile]) -> list[Record]:
    """The files' partition records (`file_paths`: C-level getters)."""
    return list(map(_PARTITION, map(RECORD_VALUES, files)))


def file_spec_ids(files: Sequence[DataFile]) -> list[int]:
    """The files' partition spec ids (C-level getters; a file without one set fails as
    pyiceberg's own `spec_id` property does)."""
    try:
        return list(map(_SPEC_ID, files))
    except AttributeError:
        return [f.spec_id for f in files]


def file_statistics(files: Sequence[DataFile], kind: str, column: int) -> list[Any]:
    """Each file's statistic `kind` (`"lower_bounds"`, `"upper_bounds"` or
    `"null_value_counts"`) of the column `column` (field id): `(file.<kind> or {}).get(column)`.
    A planner's files of that column (`PartialDataFile`: its bare values) are read by C-level
    getters — the plan and the stream's checks take 20,000 files' bounds —, others one by one."""
    (found,) = files_statistics(files, (kind,), column)
    return found


def files_statistics(
    files: Sequence[DataFile], kinds: Sequence[str], column: int
) -> list[list[Any]]:
    """`file_statistics` of each of `kinds`, the files' kind checked once."""
    if set(map(type, files)) == {PartialDataFile} and set(map(_FILE_COLUMN, files)) == {column}:
        values = list(map(RECORD_VALUES, files))
        return [list(map(_STATISTICS[kind], values)) for kind in kinds]
    return [[(getattr(f, kind) or _NOTHING).get(column) for f in files] for kind in kinds]


def entry_files(entries: Iterable[ManifestEntry]) -> list[DataFile]:
    """The entries' data files, taken by C-level getters (`file_paths`)."""
    return list(map(_ENTRY_FILE, map(RECORD_VALUES, entries)))


def entry_contents(entries: Iterable[ManifestEntry]) -> set[int]:
    """The distinct contents (`DataFileContent`'s values) of the entries' data files, taken by
    C-level getters (`file_paths`)."""
    return set(
        map(int, map(_CONTENT, map(RECORD_VALUES, map(_ENTRY_FILE, map(RECORD_VALUES, entries)))))
    )


def entry_kinds(entries: Iterable[ManifestEntry]) -> set[tuple[int, int]] | None:
    """The distinct (content, partition spec id) of the entries' data files, taken by C-level
    getters (a compaction's commit groups 20,000 removed entries by them); None when a file has
    no spec id set (the caller asks each file)."""
    files = list(map(_ENTRY_FILE, map(RECORD_VALUES, entries)))
    try:
        contents = map(int, map(_CONTENT, map(RECORD_VALUES, files)))
        return set(zip(contents, map(_SPEC_ID, files), strict=True))
    except AttributeError:
        return None


def partition_values(partition: Record) -> tuple[Any, ...]:
    """A partition record's values as a tuple (hashable when they are; pyiceberg's `Record`
    hashes its printed form)."""
    size = len(partition)
    if size == 1:
        return (partition[0],)
    return tuple(partition[i] for i in range(size)) if size else ()


def _standard_prefix(avro_schema: str) -> bool:
    """Whether entries start with Iceberg v2's four fields, then `data_file` (last)."""
    try:
        fields: list[dict[str, Any]] = json.loads(avro_schema)["fields"]
    except (ValueError, KeyError, TypeError):
        return False
    return _standard_fields(fields)


def _standard_fields(fields: list[dict[str, Any]]) -> bool:
    """`_standard_prefix` of the entry schema's fields, parsed."""
    if len(fields) != len(_PREFIX) + 1 or fields[-1].get("field-id") != 2:
        return False
    return all(
        f.get("field-id") == fid and f.get("type") == kind
        for f, (fid, kind) in zip(fields, _PREFIX, strict=False)
    )


def _after_prefix(block: bytes, at: int) -> int:
    """The offset in `block` of the `data_file` record of the entry starting at `at`."""
    at = _skip_varint(block, at)  # status
    for _ in range(3):  # snapshot_id, sequence_number, file_sequence_number: ["null", "long"]
        branch = block[at]
        at += 1
        if branch == 2:  # zigzag(1): the long branch
            at = _skip_varint(block, at)
    return at


def _skip_varint(block: bytes, at: int) -> int:
    while block[at] & 0x80:
        at += 1
    return at + 1


def avro_long(n: int) -> bytes:
    """Avro's zigzag varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def avro_metadata(meta: dict[str, str]) -> bytes:
    """The Avro file header's metadata map (string keys, bytes values)."""
    out = bytearray(avro_long(len(meta)))
    for key, value in meta.items():
        k, v = key.encode(), value.encode() if isinstance(value, str) else bytes(value)
        out += avro_long(len(k)) + k + avro_long(len(v)) + v
    out += b"\x00"
    return bytes(out)


def _statistic_property(which: int) -> Any:
    """A `PartialDataFile` statistic (0: null counts, 1: lower bounds, 2: upper bounds, at
    `_STATISTIC_AT[which]`), read and set through `_statistic` / `_assign`."""

    def get(self: PartialDataFile) -> Any:
        return self._statistic(_STATISTIC_AT[which])

    def put(self: PartialDataFile, value: Any) -> None:
        self._assign(_STATISTIC_AT[which], value)

    return property(get, put)


class PartialDataFile(DataFile):
    """A data file decoded for planning (`read_planned`): its column statistics cut to the
    columns asked for — `lower_bounds`, `upper_bounds` and `null_value_counts` hold those
    columns only, `column_sizes`, `value_counts` and `nan_value_counts` are None. Never
    re-encoded into a manifest as a live file: its entry's own bytes are (`RawManifest`); a
    removed one is written from its values, without metrics
    (`manifest_encoding.removed_manifest`).

    Planned with one column's statistics (`column`: the usual plan, the first sort key's), the
    file holds that column's bare values in their places and gives each statistic as a one-column
    mapping (`Statistic`) when asked: 20,000 planned files made 60,000 mappings the plan read
    through C-level getters (`file_statistics`) and never otherwise."""

    _column: int | None

    def __init__(self, values: list[Any], spec_id: int, column: int | None = None) -> None:
        # (set as `object` does: `DataFile.__setattr__` is a Python call each, 20,000 files two)
        _SET(self, "_data", values)
        _SET(self, "_spec_id", spec_id)
        _SET(self, "_column", column)

    def __hash__(self) -> int:  # (`DataFile`'s, its path's, without the property's call)
        return hash(self._data[_FILE_PATH_AT])

    def _statistic(self, at: int) -> Any:
        value = self._data[at]
        column: int | None = self._column
        if column is None:  # (several columns' statistics: their mappings as decoded)
            return value
        return _NO_STATISTIC if value is None else Statistic(column, value)

    def _assign(self, at: int, value: Any) -> None:
        if self._column is not None:  # the three statistics as mappings from now on
            held = [self._statistic(i) for i in _STATISTIC_AT]
            _SET(self, "_column", None)
            for i, mapping in zip(_STATISTIC_AT, held, strict=True):
                self._data[i] = mapping
        self._data[at] = value

    null_value_counts = _statistic_property(0)
    lower_bounds = _statistic_property(1)
    upper_bounds = _statistic_property(2)


_SET = object.__setattr__


# the positions of pyiceberg's DataFile values `_planned_entries` fills
_PLANNED_FIELDS = (134, 100, 101, 102, 103, 104, 108, 109, 110, 137, 125, 128, 131, 132, 135, 140)
_PLANNABLE = tuple(f.field_id for f in _DATA_FILE.fields) == _PLANNED_FIELDS
_NULLS, _LOWER, _UPPER = 110, 125, 128  # null value counts, lower and upper bounds
_STATISTIC_AT = tuple(_PLANNED_FIELDS.index(i) for i in (_NULLS, _LOWER, _UPPER))
_FILE_PATH_AT = _PLANNED_FIELDS.index(100)
_PLANNED: dict[str, dict[str, Any] | None] = {}


def read_planned(
    manifest: ManifestFile, data: bytes, bounds: frozenset[int], *, cut: bool = True
) -> tuple[list[ManifestEntry], RawManifest] | None:
    """The live entries of the data manifest `data` with their `data_file` bytes, as
    `read_manifest` gives them, but each file a `PartialDataFile` holding only the statistics
    of the columns `bounds` (field ids): what a planner orders and checks files by. None when
    the manifest is not laid out for it (the caller decodes it whole).

    The layout: Iceberg v2's entry prefix (`_standard_prefix`), a data manifest, partition
    values of plain Avro types, and one entry per Avro block — what pyiceberg's writer (every
    append's manifest) writes. Each block is decompressed (zlib, in C) and its entry's bytes
    kept; the entries are then decoded at once by polars' native Avro reader from one
    uncompressed block of all of them: no Python per field, no per-block decoder setup (the
    cost of pyiceberg's and fastavro's readers on one-entry blocks). The block is read under
    the entry schema with the data file's fields inline (`_flat_schema`), so only the fields a
    planner keeps are decoded (`_planned_names`). Without `cut`, the entries' bytes are not
    kept (`RawManifest.data_files` empty: `read_manifest` reads them when asked)."""
    header_buffer = io.BytesIO(data)
    try:
        header = fastavro.reader(header_buffer)
    except Exception:  # not an Avro file fastavro reads: the full decoder reports it
        return None
    start = header_buffer.tell()
    meta = {k: v if isinstance(v, str) else bytes(v).decode() for k, v in header.metadata.items()}
    text = meta.get("avro.schema", "")
    if not _PLANNABLE or meta.get("content", "data") != "data" or not _standard_prefix(text):
        return None
    layout = _planned_layout(text, header.writer_schema)
    codec_name = meta.get("avro.codec", "null")
    if layout is None or codec_name not in KNOWN_CODECS:
        return None
    codec = KNOWN_CODECS[codec_name]
    sync = data[start - SYNC_SIZE : start]
    bodies = _one_entry_blocks(data, start, sync, codec)
    if bodies is None:
        return None
    if not bodies:
        return [], RawManifest(meta=meta, codec=codec, data_files=[])
    body = b"".join(bodies)
    flat = layout["flat"]  # the data file's fields as columns: only the asked ones decoded
    single = (
        MAGIC
        + avro_metadata({**meta, "avro.codec": "null", **({"avro.schema": flat} if flat else {})})
        + sync
        + avro_long(len(bodies))
        + avro_long(len(body))
        + body
        + sync
    )
    try:
        frame = pl.read_avro(io.BytesIO(single), columns=_planned_names(layout, bounds))
        columns = _planned_columns(frame, layout, bounds, manifest)
    except Exception:  # a layout polars does not read as expected: decoded whole
        return None
    if columns is None or not columns["row"]:
        return None if columns is None else ([], RawManifest(meta=meta, codec=codec, data_files=[]))
    for row, skip in ((0, columns["skip"][0]), (-1, columns["skip"][-1])):  # a cheap check
        if _after_prefix(bodies[columns["row"][row]], 0) != skip:
            return None
    return _planned_entries(manifest, bodies, columns, bounds, meta, codec, cut=cut)


_CUT = cast(Callable[[bytes, slice], bytes], getitem)  # a piece's bytes from a position on


def _one_entry_blocks(
    data: bytes, start: int, sync: bytes, codec: type[Codec] | None
) -> list[bytes] | None:
    """The entries of the manifest `data` (its blocks from `start` on, each ending with `sync`)
    of one entry a block, each inflated; None when they are not laid out so."""
    # the blocks, split at the sync marker that ends each; a marker's 16 random bytes inside a
    # block's bytes (or a damaged file) make a piece's length disagree with its block size:
    # then the whole decoder reads (and reports) it
    pieces = data[start:].split(sync)
    if pieces.pop() != b"":
        return None
    # each block's head: one entry (zigzag 1), then its size — the piece's length less the
    # head's, so a piece of a given length has one possible head (worked out once per length);
    # checked, cut off and inflated by C-level calls, no Python per block
    lengths = list(map(len, pieces))
    heads = {length: _block_head(length) for length in set(lengths)}
    block_heads = list(map(heads.__getitem__, lengths))
    if not all(map(bytes.startswith, pieces, block_heads)):  # not one entry, or not its length
        return None
    compressed: list[bytes] = list(
        map(_CUT, pieces, map(slice, map(len, block_heads), repeat(None)))
    )
    try:
        if codec is DeflateCodec:  # (zlib's own call: no Python frame per block)
            return list(map(zlib.decompress, compressed, repeat(-15)))
        if codec is not None:
            return list(map(codec.decompress, compressed))
        return compressed
    except Exception:  # cut short, or not what its codec says: the whole decoder reports it
        return None


_DELETED_HEAD = avro_long(int(ManifestEntryStatus.DELETED))  # an entry's status, as it starts


def _planned_bytes(manifest: ManifestFile, data: bytes) -> list[bytes]:
    """The live entries' `data_file` bytes of a manifest a planner read (`read_planned`): its
    blocks cut again (each after its entry's prefix), its DELETED entries left out."""
    header_buffer = io.BytesIO(data)
    header = fastavro.reader(header_buffer)
    start = header_buffer.tell()
    name = header.metadata.get("avro.codec", "null")
    name = name if isinstance(name, str) else bytes(name).decode()
    bodies = None
    if name in KNOWN_CODECS:
        sync = data[start - SYNC_SIZE : start]
        bodies = _one_entry_blocks(data, start, sync, KNOWN_CODECS[name])
    if bodies is None:
        raise CorruptManifest(f"manifest {manifest.manifest_path}: read differently than planned")
    return [body[_after_prefix(body, 0) :] for body in bodies if not body.startswith(_DELETED_HEAD)]


class _Unread(Sequence[bytes]):
    """A planner's manifest's live entries' `data_file` bytes (`RawManifest.data_files`),
    read from the manifest when first asked for: what rewrites its kept entries (a partial
    removal, a merge) needs; a compaction that removes whole manifests writes their entries
    from their values (`manifest_encoding.removed_manifest`) and never asks — 20,000 entries'
    bytes (~7 MB) are then neither cut nor held through its stream."""

    def __init__(self, load: Callable[[], list[bytes]], count: int) -> None:
        self._load, self._count = load, count
        self._read: list[bytes] | None = None
        self._lock = Lock()

    def _all(self) -> list[bytes]:
        with self._lock:
            if self._read is None:
                read = self._load()
                if len(read) != self._count:
                    raise CorruptManifest("a manifest's entries and their bytes differ in number")
                self._read = read
            return self._read

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, at: int) -> bytes: ...

    @overload
    def __getitem__(self, at: slice) -> list[bytes]: ...

    def __getitem__(self, at: int | slice) -> bytes | list[bytes]:
        return self._all()[at]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def _block_head(length: int) -> bytes:
    """The head of an Avro block of one entry that is `length` bytes long with its head (the
    sync marker not counted): the count 1 and the size of the rest, as zigzag varints; b"\xff"
    (no block starts so) when no size fits."""
    for size_bytes in range(1, 10):
        head = b"\x02" + avro_long(length - 1 - size_bytes)
        if len(head) == 1 + size_bytes:
            return head
    return b"\xff"


def _planned_layout(text: str, writer: Any) -> dict[str, Any] | None:
    """The written names of the entry's fields and its data file's (by field id), when the
    partition values are of plain Avro types (polars gives them as pyiceberg reads them)."""
    with _LOCK:
        if text in _PLANNED:
            return _PLANNED[text]
    layout: dict[str, Any] | None
    try:
        top = _fields(writer)
        data_file = _fields(top[2][1])
        partition = data_file.get(102)
        plain = ("int", "long", "string", "boolean", "float", "double")
        for _, kind in _fields(partition[1]).values() if partition is not None else ():
            rest = [k for k in kind if k != "null"] if isinstance(kind, list) else [kind]
            if len(rest) != 1 or rest[0] not in plain:
                raise UndecodableManifestLayout
        if any(i not in data_file for i in (134, 100, 101, 103, 104)):
            raise UndecodableManifestLayout
        layout = {
            "top": {i: top[i][0] for i in (0, 1, 3, 4)},
            "data_file": top[2][0],
            "fields": {i: name for i, (name, _) in data_file.items()},
            "flat": _flat_schema(text),
        }
    except (UndecodableManifestLayout, KeyError, TypeError, AttributeError):
        layout = None
    with _LOCK:
        _PLANNED[text] = layout
    return layout


_PLANNED_FILE_FIELDS = (134, 100, 101, 102, 103, 104, 131, 132, 135, 140)


def _planned_names(layout: dict[str, Any], bounds: frozenset[int]) -> list[str]:
    """The columns a planner's read decodes: the entry's prefix and, with the data file's
    fields as columns of their own (`_flat_schema`), the data file's fields the plan keeps —
    its statistics maps only those of `bounds` (null counts, lower and upper bounds; none
    without bounds): column sizes, value counts and NaN counts, half of an entry's
    statistics, are skipped undecoded. Else the whole data file (one nested column)."""
    names = [name for name in layout["top"].values() if name is not None]
    if not layout["flat"]:
        return [*names, layout["data_file"]]
    fields = layout["fields"]
    wanted = [*_PLANNED_FILE_FIELDS, *((_NULLS, _LOWER, _UPPER) if bounds else ())]
    return names + [fields[i] for i in wanted if i in fields]


def _planned_columns(
    frame: pl.DataFrame, layout: dict[str, Any], bounds: frozenset[int], manifest: ManifestFile
) -> dict[Any, list[Any]] | None:
    """The live entries' values, column by column, their snapshot id and sequence numbers
    inherited from `manifest` (`_inherit_from_manifest`): the prefix's four, `"row"` (each
    entry's position in the manifest), the data file's fields a planner reads, and per column of
    `bounds` its lower bound, upper bound and null count.

    Few of polars' kernels: the columns as lists, a statistic by its position in each file's
    map (`_stat_values`); the prefix's inheritance and length in Python, per distinct prefix.
    Each kernel polars runs for the first time maps its code in (and keeps buffers): the
    expressions this took before (when/then, casts, a list evaluation per statistic) cost a
    compaction ~7 MB of resident memory its read never used
    (benchmarks/results/small-files-maintenance.md, "The partitioned compaction's peak")."""
    top, names = layout["top"], layout["fields"]
    count = frame.height
    none: list[Any] = [None] * count
    statuses = frame.get_column(top[0]).to_list()
    given = {
        i: frame.get_column(top[i]).to_list() if top[i] is not None else none for i in (1, 3, 4)
    }
    deleted = int(ManifestEntryStatus.DELETED)
    every = deleted not in statuses
    rows = list(range(count)) if every else [r for r, s in enumerate(statuses) if s != deleted]

    def live(values: list[Any]) -> list[Any]:
        return values if every else [values[row] for row in rows]

    added = int(ManifestEntryStatus.ADDED)
    inherit = manifest.sequence_number
    snapshot = manifest.added_snapshot_id
    out: dict[Any, list[Any]] = {0: live(statuses), "row": rows}
    # where each entry's `data_file` starts: after its status and three ["null", "long"] unions;
    # an entry's prefix repeats (a commit's entries share it): worked out once per distinct one,
    # given to the entries by C-level calls
    prefixes = list(zip(out[0], *(live(given[i]) for i in (1, 3, 4)), strict=True))
    same = bool(prefixes) and prefixes.count(prefixes[0]) == len(prefixes)  # (one commit's)
    done: dict[tuple[Any, ...], tuple[int, Any, Any, Any]] = {}
    for prefix in prefixes[:1] if same else dict.fromkeys(prefixes):
        status, snap, sequence, file_sequence = prefix
        skip = _varint_length(status) + sum(
            1 + (0 if v is None else _varint_length(v)) for v in prefix[1:]
        )
        inherits = inherit is not None and (status == added or inherit == 0)
        done[prefix] = (
            skip,
            snapshot if snap is None else snap,
            inherit if sequence is None and inherits else sequence,
            inherit if file_sequence is None and inherits else file_sequence,
        )
    if same:
        for key, value in zip(("skip", 1, 3, 4), done[prefixes[0]], strict=True):
            out[key] = [value] * len(prefixes)
    else:
        found = list(map(done.__getitem__, prefixes))
        for key, at in (("skip", 0), (1, 1), (3, 2), (4, 3)):
            out[key] = list(map(_AT_ITEM[at], found))
    data_files = frame if layout["flat"] else frame.get_column(layout["data_file"]).struct.unnest()
    for i in _PLANNED_FILE_FIELDS:
        if i in names:
            out[i] = live(data_files.get_column(names[i]).to_list())
    for map_id in (_NULLS, _LOWER, _UPPER):
        for column in bounds if map_id in names else ():
            out[(map_id, column)] = live(_stat_values(data_files.get_column(names[map_id]), column))
    if None in out[100] or None in out[134]:
        return None
    return out


def _stat_values(pairs: pl.Series, column: int) -> list[Any]:
    """Each file's value of `column` in its statistics map `pairs` (a list of key/value
    structs per file; None where it has none). Writers list a map's columns in the same order
    for every file: read at the first file's position of the column, checked by its key; the
    files whose map has another key there (or none) are searched one by one."""
    first = next((p for p in pairs.head(1).to_list() if p), None) or []
    at = next((n for n, pair in enumerate(first) if pair["key"] == column), 0)
    picked = pairs.list.get(at, null_on_oob=True).struct.unnest()
    values = picked.get_column("value").to_list()
    keys = picked.get_column("key").to_list()
    misses = (
        [] if keys.count(column) == len(keys) else [r for r, k in enumerate(keys) if k != column]
    )
    if misses:  # a map without the column at that position: searched
        lists = pairs.gather(misses).to_list()
        for row, items in zip(misses, lists, strict=True):
            values[row] = next((p["value"] for p in items or () if p["key"] == column), None)
    return values


def _varint_length(value: int) -> int:
    """The length of the Avro (zigzag) varint of `value`."""
    zigzag = (value << 1) ^ (value >> 63)
    length = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        length += 1
    return length


_AT_ITEM = tuple(itemgetter(i) for i in range(4))
_STATUSES = {int(s): s for s in ManifestEntryStatus}
_CONTENTS = {int(c): c for c in DataFileContent}
_FORMATS = {f.value: f for f in FileFormat}


class Statistic(Mapping[int, Any]):
    """One column's statistic of a planned file (`PartialDataFile`'s bounds and null count, made
    when asked): read-only, ~50 bytes where a dict of one key takes ~220."""

    __slots__ = ("_column", "_value")

    def __init__(self, column: int, value: Any) -> None:
        self._column = column
        self._value = value

    def __getitem__(self, column: int) -> Any:
        if column == self._column and self._value is not None:
            return self._value
        return _NOTHING[column]  # (the KeyError a dict raises)

    def get(self, column: int, default: Any = None) -> Any:
        return self._value if column == self._column and self._value is not None else default

    def __iter__(self) -> Iterator[int]:
        return iter(() if self._value is None else (self._column,))

    def __len__(self) -> int:
        return 0 if self._value is None else 1

    def __repr__(self) -> str:
        return repr(dict(self))


_NO_STATISTIC = Statistic(0, None)
_NOTHING: dict[int, Any] = {}


def _interned(values: list[Any], key: Callable[[Any], Any] | None) -> list[Any]:
    """`values` with equal ones the same object (`key`: a hashable form of unhashable ones).
    All equal (a manifest's split offsets, snapshot ids, as a rule): the first for each, by
    one C-level count."""
    if values and values.count(values[0]) == len(values):
        return [values[0]] * len(values)
    seen: dict[Any, Any] = {}
    if key is None:
        return [seen.setdefault(v, v) for v in values]
    return [v if v is None else seen.setdefault(key(v), v) for v in values]


def _converted(values: list[Any], convert: Callable[[Any], Any]) -> list[Any]:
    """`convert` of each of `values`, once per distinct value (contents, formats: one or two
    in a manifest), handed out by C-level calls."""
    if values and values.count(values[0]) == len(values):
        return [convert(values[0])] * len(values)
    done = {v: convert(v) for v in set(values)}
    return list(map(done.__getitem__, values))


def _partition_records(given: list[Any]) -> list[Record]:
    """Each file's partition record (its values in written order), one `Record` per distinct
    partition, given to the files by C-level calls."""
    if given and given.count(given[0]) == len(given):  # (one partition: an unpartitioned table)
        first = given[0]
        return [Record(*(first.values() if first is not None else ()))] * len(given)
    if None in given:
        written = [tuple(g.values()) if g is not None else () for g in given]
    else:
        written = list(map(tuple, map(dict.values, given)))
    interned = {w: Record(*w) for w in dict.fromkeys(written)}
    return list(map(interned.__getitem__, written))


def _status(status: int) -> ManifestEntryStatus:
    return _STATUSES[status] if status in _STATUSES else ManifestEntryStatus(status)


def _content(content: int) -> DataFileContent:
    return _CONTENTS[content] if content in _CONTENTS else DataFileContent(content)


def _format(name: str) -> FileFormat:
    return _FORMATS.get(name) or FileFormat(name)  # (any case)


def _planned_entries(
    manifest: ManifestFile,
    bodies: list[bytes],
    columns: dict[Any, list[Any]],
    bounds: frozenset[int],
    meta: dict[str, str],
    codec: type[Codec] | None,
    *,
    cut: bool,
) -> tuple[list[ManifestEntry], RawManifest]:
    count = len(columns["row"])
    none = [None] * count
    # (each distinct value converted once, given to the entries by C-level calls; the files'
    # 16 values zipped into their lists, the files and entries made by `map`: no Python loop
    # per entry)
    stats: list[list[Any]] = []
    single: int | None = None  # one column's statistics: its bare values (`PartialDataFile`)
    for map_id in (_NULLS, _LOWER, _UPPER):
        found = [(column, columns.get((map_id, column), none)) for column in sorted(bounds)]
        if len(found) == 1:
            ((single, values),) = found
            stats.append(values)
        else:
            stats.append(
                [{c: vs[row] for c, vs in found if vs[row] is not None} for row in range(count)]
            )
    nulls, lowers, uppers = stats
    keys, splits, ids, orders = (columns.get(i, none) for i in (131, 132, 135, 140))
    shared = (
        _converted(columns[134], _content),
        _converted(columns[101], _format),
        _partition_records(columns.get(102, none)),
        keys,
        _interned(splits, tuple),  # split offsets repeat: one object each
        ids,
        orders,
    )
    contents, formats, partitions, _, splits, _, _ = shared
    file_values = map(
        list,  # (one list of its 16 values, in `_PLANNED_FIELDS`' order)
        zip(
            contents,
            columns[100],
            formats,
            partitions,
            columns[103],
            columns[104],
            none,  # 108, 109: column sizes, value counts
            none,
            nulls,
            none,  # 137: NaN counts
            lowers,
            uppers,
            keys,
            splits,
            ids,
            orders,
            strict=True,
        ),
    )
    files = map(PartialDataFile, file_values, repeat(manifest.partition_spec_id), repeat(single))
    entries = list(
        map(
            ManifestEntry,
            _converted(columns[0], _status),
            _interned(columns[1], None),  # (snapshot ids repeat: one object each)
            columns[3],
            columns[4],
            files,
        )
    )
    raws: list[bytes] = []
    if cut and len(bodies) != count:  # (DELETED entries among them: the live ones' bodies)
        bodies = list(map(bodies.__getitem__, columns["row"]))
    if cut:
        raws = list(map(_CUT, bodies, map(slice, columns["skip"], repeat(None))))
    planned = EntryValues(  # (the lists the entries were made of: what removes them)
        sequences=columns[3],
        file_sequences=columns[4],
        paths=columns[100],
        rows=columns[103],
        sizes=columns[104],
        shared=shared,
    )
    return entries, RawManifest(meta=meta, codec=codec, data_files=raws, values=planned)
