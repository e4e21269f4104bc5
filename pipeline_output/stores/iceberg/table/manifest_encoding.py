"""Manifests and manifest lists written: a manifest's kept entries rewritten from their own
bytes, removed entries and a new data manifest encoded from their values, a v2 manifest list
from its records.

The other side of `manifest_decoding`, which only reads: what is written here is written from
what it read — a manifest's Avro header, codec and each live entry's `data_file` bytes
(`manifest_decoding.RawManifest`), a planner's values column by column
(`manifest_decoding.EntryValues`) — and with its Avro primitives (`manifest_decoding.avro_long`,
`manifest_decoding.avro_metadata`: the reader writes Avro headers and blocks of its own for
polars to read). Nothing here decodes a manifest.

Manifests rewritten from their entries' own bytes, not re-encoded entry by entry.

A write that removes data files rewrites every manifest holding one of them: the entries that
stay are written again, as EXISTING. pyiceberg decodes each entry into objects and encodes it
back field by field in pure Python (~170 µs of CPU per entry here): a spread upsert into a
table of 20,000 small files spent seconds re-encoding entries that did not change. Here the
manifest is read once (`manifest_decoding.read_manifest`, for the entries the write plans with)
keeping each live entry's `data_file` record as the bytes it was written as; the
rewrite (`rewrite_manifest`) writes each kept entry as a new four-field prefix (status EXISTING,
its snapshot id and its sequence numbers, now explicit) followed by those bytes, under the
source manifest's own Avro schema, metadata and codec. Nothing of an entry's file, partition or
metrics is decoded or re-encoded, so nothing of it can change.

The entries of removed data files (DELETED) are written without their column metrics: from
the values read (`removed_manifest`: a planner's, the columns it decoded its entries from — no
entry's bytes, no pass over the entry objects), or where those cannot be encoded from each
entry's own bytes (`unmeasured`: the kept fields checked byte for byte against the bytes they
replace). Both write the same bytes.

Only manifests laid out as Iceberg's v2 `manifest_entry` (status, snapshot_id,
sequence_number, file_sequence_number as `["null", "long"]` unions, then data_file) are reused
this way; `manifest_decoding.read_manifest` returns no bytes for others, and the caller
re-encodes them.

A commit's new data manifest (`added_manifest`) and its v2 manifest list (`manifest_list_v2`)
are encoded from their records' values, without pyiceberg's writer tree (below, "Manifests and
manifest lists of a commit encoded from their records' values").
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from copy import copy
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter
from threading import Lock
from typing import Any, cast

from pyiceberg.avro.codecs import KNOWN_CODECS
from pyiceberg.avro.codecs.deflate import DeflateCodec
from pyiceberg.avro.file import MAGIC, SYNC_SIZE
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    construct_partition_summaries,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import IcebergType, ListType, StructType

from pipeline_output.errors import UndecodableManifestLayout
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    DATA_FILE_AT,
    ENTRY_AT,
    METRIC_MAPS,
    RECORD_VALUES,
    EntryValues,
    RawManifest,
    avro_long,
    avro_metadata,
    one_object,
    partition_values,
)

_DATA_FILE = DATA_FILE_TYPE[DEFAULT_READ_VERSION]
_LOCK = Lock()  # guards the caches below (`_ENCODERS`, `_UNMEASURED`, `_LAYOUTS`)


# the most entries an Avro block of a manifest written here holds
BLOCK_ENTRIES = 1000


@dataclass
class Source:
    """A rewritten manifest's kept entries with their bytes, and its bytes per entry."""

    raw: RawManifest
    pairs: list[tuple[ManifestEntry, bytes]]
    per_entry: float


def packed(
    sources: Sequence[Source], target: float
) -> list[list[tuple[RawManifest, list[tuple[ManifestEntry, bytes]]]]]:
    """The sources in batches of about `target` bytes of manifest each (in order)."""
    out: list[list[tuple[RawManifest, list[tuple[ManifestEntry, bytes]]]]] = []
    size = target
    for source in sources:
        weight = len(source.pairs) * source.per_entry
        if size + weight > target and (not out or out[-1]):
            out.append([])
            size = 0.0
        out[-1].append((source.raw, source.pairs))
        size += weight
    return [batch for batch in out if batch]


def rewrite_manifest(
    output: OutputFile,
    sources: Sequence[tuple[RawManifest, Sequence[tuple[ManifestEntry, bytes]]]],
    *,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
    content: ManifestContent,
    status: ManifestEntryStatus = ManifestEntryStatus.EXISTING,
) -> ManifestFile | None:
    """One manifest of the given entries (each with its `data_file` bytes) as `status`
    (EXISTING: carried forward, with each entry's own snapshot id; DELETED: removed by this
    snapshot — the entries are the live ones as read, each written with `snapshot_id`: no
    restamped entry is made per removed file), written with the sources' Avro schema,
    metadata and codec; None when the sources differ in schema or codec (the caller
    re-encodes). A DELETED data manifest's entries are written without their column metrics
    (`unmeasured`)."""
    raw = sources[0][0]
    if any(
        r.meta.get("avro.schema") != raw.meta.get("avro.schema") or r.codec is not raw.codec
        for r, _ in sources
    ):
        return None
    kept = [pair for _, pairs in sources for pair in pairs]
    if not kept:
        return None
    # each entry's (snapshot id, sequence numbers, data file), the data files' rows and
    # partitions: taken by C-level getters, no Python per entry (a compaction's 20,000)
    entries = list(map(_FIRST, kept))
    snapshots, sequences, file_sequences, files = zip(
        *map(_ENTRY_FIELDS, map(RECORD_VALUES, entries)), strict=True
    )
    if None in sequences or None in file_sequences:
        return None
    file_values = list(map(RECORD_VALUES, files))
    deleted = status == ManifestEntryStatus.DELETED
    prefixes: dict[tuple[Any, Any, Any], bytes] = {}

    def prefix(key: tuple[Any, Any, Any]) -> bytes:  # entries of one commit share theirs
        found = prefixes.get(key)
        if found is None:
            snapshot, sequence, file_sequence = key
            found = prefixes[key] = _prefix_of(status, snapshot, sequence, file_sequence)
        return found

    owners = repeat(snapshot_id) if deleted else snapshots
    heads = [
        prefixes.get(key) or prefix(key)
        for key in zip(owners, sequences, file_sequences, strict=False)
    ]
    # a removed data file's entry without its column metrics (`unmeasured`); delete files keep
    # theirs (their path bounds name the data file they apply to: `files.referenced_path`)
    strip = unmeasured(raw.schema_text) if deleted and content == ManifestContent.DATA else None
    datas: list[bytes] = list(map(_SECOND, kept))
    if strip is not None:
        datas = list(map(strip, files, datas))

    blocks = (
        (
            len(heads[at : at + BLOCK_ENTRIES]),
            chain.from_iterable(
                zip(heads[at : at + BLOCK_ENTRIES], datas[at : at + BLOCK_ENTRIES], strict=True)
            ),
        )
        for at in range(0, len(kept), BLOCK_ENTRIES)
    )
    length = _write_blocks(output, raw, blocks)
    existing = status == ManifestEntryStatus.EXISTING
    partitions = list(map(_PARTITION, file_values))
    return _written_manifest(
        output,
        length,
        len(file_values),
        sum(map(_ROWS, file_values)),
        list(dict(zip(map(id, partitions), partitions, strict=True)).values()),  # (interned)
        spec=spec,
        schema=schema,
        snapshot_id=snapshot_id,
        content=content,
        status=status,
        # (DELETED entries do not count: pyiceberg's writer leaves it unassigned then)
        min_sequence=min(map(int, sequences)) if existing else UNASSIGNED_SEQ,
    )


def _write_blocks(
    output: OutputFile, raw: RawManifest, blocks: Iterable[tuple[int, Iterable[bytes]]]
) -> int:
    """Write an Avro file of `raw`'s metadata and codec whose blocks are `blocks` (each: its
    entries' count and their encoded pieces); its length."""
    sync = os.urandom(SYNC_SIZE)
    out = bytearray(MAGIC)
    out += avro_metadata(raw.meta)
    out += sync
    for count, pieces in blocks:
        body = b"".join(pieces)
        if raw.codec is DeflateCodec:  # level 1: rewriting 20,000 entries at 6 took ~0.4 s
            packer = zlib.compressobj(1, zlib.DEFLATED, -15)
            body = packer.compress(body) + packer.flush()
        elif raw.codec is not None:
            body, _ = raw.codec.compress(body)
        out += avro_long(count) + avro_long(len(body)) + body + sync
    with output.create(overwrite=True) as stream:
        # (not copied into bytes: the manifest of a compaction's removed entries is megabytes;
        # pyarrow's and fsspec's streams take any bytes-like object)
        stream.write(cast(bytes, out))
    return len(out)


def _written_manifest(
    output: OutputFile,
    length: int,
    count: int,
    rows: int,
    partitions: list[Record],
    *,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
    content: ManifestContent,
    status: ManifestEntryStatus,
    min_sequence: int,
) -> ManifestFile:
    """The manifest list's record of a manifest of `count` entries of `status` whose files
    hold `rows` rows and the partitions `partitions` (each at least once), written at
    `output` (`length` bytes)."""
    existing = status == ManifestEntryStatus.EXISTING
    return ManifestFile.from_args(
        manifest_path=output.location,
        manifest_length=length,
        partition_spec_id=spec.spec_id,
        content=content,
        sequence_number=UNASSIGNED_SEQ,
        min_sequence_number=min_sequence,
        added_snapshot_id=snapshot_id,
        added_files_count=0,
        existing_files_count=count if existing else 0,
        deleted_files_count=0 if existing else count,
        added_rows_count=0,
        existing_rows_count=rows if existing else 0,
        deleted_rows_count=0 if existing else rows,
        partitions=construct_partition_summaries(spec, schema, distinct_partitions(partitions)),
        key_metadata=None,
    )


def removed_manifest(
    output: OutputFile,
    raw: RawManifest,
    removed: Sequence[EntryValues],
    *,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
) -> ManifestFile | None:
    """A data manifest of the entries whose values are `removed` (live entries as read from
    manifests of `raw`'s Avro schema) DELETED by `snapshot_id`, each written from its values
    alone — its sequence numbers, its file's content, path, format, partition, record count,
    size, key metadata, split offsets, equality ids and sort order, its six column metrics
    empty maps (as `unmeasured` leaves them) —, under `raw`'s Avro schema, metadata and codec.
    No entry's bytes are read: a planner's entries are removed from the columns it decoded (a
    compaction's 20,000 without a copy, strip or check of each one's bytes, nor a pass over
    its entry objects).

    None when there is nothing to write, the layout is not one `unmeasured` knows, or a value
    is not one its type encodes (the caller writes the entries another way). Column by
    column, by C-level calls: Python runs per distinct sequence number, per distinct set of
    the fields files share (content, format, partition; key metadata, split offsets, equality
    ids, sort order: by identity, a planner's files share one object of each) and per
    distinct integer, never per entry."""
    layout = _layout_of(raw.schema_text)
    if layout is None or not any(map(len, removed)):
        return None
    pieces: list[bytes] = []
    try:
        for values in removed:
            if len(values):
                pieces += _removed_pieces(layout, values, snapshot_id)
    except _NOT_ENCODABLE:
        return None
    count = sum(map(len, removed))
    step = BLOCK_ENTRIES * _PIECES
    blocks = (
        (min(BLOCK_ENTRIES, count - at // _PIECES), pieces[at : at + step])
        for at in range(0, len(pieces), step)
    )
    length = _write_blocks(output, raw, blocks)
    partitions = [values.partitions() for values in removed]
    return _written_manifest(
        output,
        length,
        count,
        sum(values.totals()[1] for values in removed),
        list(chain.from_iterable(partitions)),
        spec=spec,
        schema=schema,
        snapshot_id=snapshot_id,
        content=ManifestContent.DATA,
        status=ManifestEntryStatus.DELETED,
        min_sequence=UNASSIGNED_SEQ,
    )


_PIECES = 9  # the pieces of a removed entry (`_removed_pieces`)
# what encoding an entry from values of an unexpected layout or type raises: the caller falls back
# to the entry's own bytes
_NOT_ENCODABLE = (
    UndecodableManifestLayout,
    TypeError,
    ValueError,
    AttributeError,
    KeyError,
    IndexError,
    OverflowError,
    struct.error,
)


def _removed_pieces(layout: _RemovedLayout, values: EntryValues, snapshot_id: int) -> list[bytes]:
    """The DELETED entries' encoded pieces, entry after entry: the status and snapshot id,
    the sequence numbers, the content, the path's length, the path, the format and partition,
    the record count, the size, the empty metrics and the tail."""
    count = len(values)
    status = (
        avro_long(int(ManifestEntryStatus.DELETED)) + b"\x02" + avro_long(_integer(snapshot_id))
    )
    # (an entry without its sequence numbers — an ADDED one not read back — fails to encode)
    sequences, file_sequences = values.sequences, values.file_sequences
    if sequences == file_sequences:  # (a file never rewritten: as a rule)
        numbers = {n: _optional_long(n) * 2 for n in set(sequences)}
        sequenced: list[bytes] | bytes = _each(numbers, sequences)
    else:
        pairs = list(zip(sequences, file_sequences, strict=True))
        both = {p: _optional_long(p[0]) + _optional_long(p[1]) for p in set(pairs)}
        sequenced = _each(both, pairs)
    content, format_, partition, key, splits, ids, order = values.shared
    if content.count(DataFileContent.DATA) != count:  # (a delete file keeps its metrics)
        raise UndecodableManifestLayout("a delete file among the data files")
    tail = {131: key, 132: splits, 135: ids, 140: order}
    tails = [tail[i] for i, _ in layout.tail]
    heads = _piece([content], lambda c: avro_long(_integer(int(c))))
    middles = _piece(
        [format_, partition], lambda f, p: layout.format(f) + layout.partition(p), by_id=1
    )
    lasts = _piece(
        tails,
        lambda *held: (
            layout.empty
            + b"".join(encode(v) for (_, encode), v in zip(layout.tail, held, strict=True))
        ),
    )
    paths = list(map(str.encode, values.paths))
    lengths = list(map(len, paths))
    rows, sizes = values.rows, values.sizes
    integers = set(rows).union(sizes, lengths)
    if not all(type(n) is int for n in integers):  # (not a bool, nor a float that is whole)
        raise UndecodableManifestLayout("a record count or size that is not an integer")
    longs = dict(zip(integers, map(avro_long, integers), strict=True))
    columns = (
        status,
        sequenced,
        heads,
        list(map(longs.__getitem__, lengths)),
        paths,
        middles,
        list(map(longs.__getitem__, rows)),
        list(map(longs.__getitem__, sizes)),
        lasts,
    )
    return list(
        chain.from_iterable(
            zip(*(c if isinstance(c, list) else repeat(c, count) for c in columns), strict=False)
        )
    )


def _optional_long(n: int) -> bytes:
    """A `["null", "long"]` union's long."""
    return b"\x02" + avro_long(_integer(n))


def _each(encoded: dict[Any, bytes], keys: list[Any]) -> list[bytes] | bytes:
    """Each key's encoding (one bytes when there is one key)."""
    if len(encoded) == 1:
        return next(iter(encoded.values()))
    return list(map(encoded.__getitem__, keys))


def _piece(
    columns: list[list[Any]], encode: Callable[..., bytes], *, by_id: int | None = None
) -> list[bytes] | bytes:
    """`encode` of each entry's values in `columns` (one bytes when the entries share them),
    worked out once per distinct combination, by identity (the column `by_id`: always by
    identity — a partition `Record` compares by a Python call)."""
    count = len(columns[0])
    varying = []
    for at, column in enumerate(columns):
        if not (one_object(column) if at == by_id else column.count(column[0]) == count):
            varying.append(list(map(id, column)))
    if not varying:
        return encode(*(column[0] for column in columns))
    keys: list[Any] = varying[0] if len(varying) == 1 else list(zip(*varying, strict=True))
    done = {
        key: encode(*(column[at] for column in columns))
        for key, at in dict(zip(keys, range(count), strict=True)).items()
    }
    return list(map(done.__getitem__, keys))


# Manifests and manifest lists of a commit encoded from their records' values.
#
# pyiceberg's writers build, per file, the file's Iceberg schema, its Avro schema and a writer
# tree resolved between the two: ~1 ms of a fresh process's one-file commit, for a manifest of one
# entry and a manifest list of three. A new data manifest of ADDED entries is written under the
# Avro schema, metadata and codec of a data manifest of the table read already (the caller checks
# that metadata is what pyiceberg's writer writes for the snapshot: the same table schema,
# partition spec, format version and codec), and a v2 manifest list under the v2 schema
# (`MANIFEST_LIST_V2_SCHEMA`, pyiceberg's as it converts it); each record is encoded field by field
# id from the values of pyiceberg's records (`_typed`), the same values pyiceberg's writer writes.
# A field or a value these encoders do not know makes them return None: the caller writes the
# file with pyiceberg's writer.

MANIFEST_LIST_V2_SCHEMA = (
    '{"type": "record", "fields": [{"name": "manifest_path", "field-id": 500, "type": "string", '
    '"doc": "Location URI with FS scheme"}, {"name": "manifest_length", "field-id": 501, "type": '
    '"long"}, {"name": "partition_spec_id", "field-id": 502, "type": "int"}, {"name": "content", '
    '"field-id": 517, "type": "int"}, {"name": "sequence_number", "field-id": 515, "type": '
    '"long"}, {"name": "min_sequence_number", "field-id": 516, "type": "long"}, {"name": '
    '"added_snapshot_id", "field-id": 503, "type": "long"}, {"name": "added_files_count", '
    '"field-id": 504, "type": "int"}, {"name": "existing_files_count", "field-id": 505, "type": '
    '"int"}, {"name": "deleted_files_count", "field-id": 506, "type": "int"}, {"name": '
    '"added_rows_count", "field-id": 512, "type": "long"}, {"name": "existing_rows_count", '
    '"field-id": 513, "type": "long"}, {"name": "deleted_rows_count", "field-id": 514, "type": '
    '"long"}, {"name": "partitions", "field-id": 507, "type": ["null", {"type": "array", '
    '"element-id": 508, "items": {"type": "record", "fields": [{"name": "contains_null", '
    '"field-id": 509, "type": "boolean"}, {"name": "contains_nan", "field-id": 518, "type": '
    '["null", "boolean"], "default": null}, {"name": "lower_bound", "field-id": 510, "type": '
    '["null", "bytes"], "default": null}, {"name": "upper_bound", "field-id": 511, "type": '
    '["null", "bytes"], "default": null}], "name": "r508"}}], "default": null}, {"name": '
    '"key_metadata", "field-id": 519, "type": ["null", "bytes"], "default": null}], "name": '
    '"manifest_file"}'
)
"""The Avro schema of a v2 manifest list, as pyiceberg writes it (`AvroSchemaConversion` of
`MANIFEST_LIST_FILE_SCHEMAS[2]`, `json.dumps`'d; a test holds them equal)."""

_ENCODERS: dict[str, _Encoder | None] = {}


def added_manifest(
    new_output: Callable[[], OutputFile],
    raw: RawManifest,
    entries: Sequence[ManifestEntry],
    *,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
) -> ManifestFile | None:
    """A data manifest of `entries` (new files ADDED by `snapshot_id`, their sequence numbers
    left null: inherited from the manifest list at commit) under `raw`'s Avro schema, metadata
    and codec, each entry encoded from its values (`_typed`); the output is taken from
    `new_output` once every entry is encoded. None (nothing written, no output taken) when an
    entry is not such an entry, or the schema or a value is not one the encoders know: the
    caller writes them with pyiceberg's writer."""
    if not entries or any(
        e.status != ManifestEntryStatus.ADDED
        or e.snapshot_id != snapshot_id
        or e.sequence_number is not None
        or e.file_sequence_number is not None
        or e.data_file.content != DataFileContent.DATA
        for e in entries
    ):
        return None
    encode = _record_encoder(raw.schema_text, _ENTRY_STRUCT)
    if encode is None:
        return None
    try:
        pieces = [encode(entry) for entry in entries]
    except _NOT_ENCODABLE:
        return None
    output = new_output()
    blocks = (
        (len(pieces[at : at + BLOCK_ENTRIES]), pieces[at : at + BLOCK_ENTRIES])
        for at in range(0, len(pieces), BLOCK_ENTRIES)
    )
    length = _write_blocks(output, raw, blocks)
    files = [entry.data_file for entry in entries]
    return ManifestFile.from_args(
        manifest_path=output.location,
        manifest_length=length,
        partition_spec_id=spec.spec_id,
        content=ManifestContent.DATA,
        sequence_number=UNASSIGNED_SEQ,
        min_sequence_number=UNASSIGNED_SEQ,  # (no entry has one: pyiceberg's writer's too)
        added_snapshot_id=snapshot_id,
        added_files_count=len(files),
        existing_files_count=0,
        deleted_files_count=0,
        added_rows_count=sum(f.record_count for f in files),
        existing_rows_count=0,
        deleted_rows_count=0,
        partitions=construct_partition_summaries(
            spec, schema, distinct_partitions([f.partition for f in files])
        ),
        key_metadata=None,
    )


def manifest_list_v2(
    output: OutputFile,
    manifests: Sequence[ManifestFile],
    *,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int,
    codec: str,
) -> bool:
    """Write the v2 manifest list of the snapshot `snapshot_id` listing `manifests` at `output`
    as pyiceberg's `ManifestListWriterV2` does — its metadata, each manifest the snapshot added
    given the snapshot's `sequence_number` where unassigned — in Avro `codec` (Avro's name).
    False (nothing written) when a record or the codec is not one it encodes: the caller writes
    it with pyiceberg's writer."""
    if codec not in KNOWN_CODECS:
        return False
    encode = _record_encoder(MANIFEST_LIST_V2_SCHEMA, _MANIFEST_FILE_STRUCT)
    if encode is None:
        return False
    pieces = []
    try:
        for manifest in manifests:
            if UNASSIGNED_SEQ in (manifest.sequence_number, manifest.min_sequence_number):
                if manifest.added_snapshot_id != snapshot_id:
                    return False  # (pyiceberg's writer refuses it: its error, not ours)
                manifest = copy(manifest)
                if manifest.sequence_number == UNASSIGNED_SEQ:
                    manifest.sequence_number = sequence_number
                if manifest.min_sequence_number == UNASSIGNED_SEQ:
                    manifest.min_sequence_number = sequence_number
            pieces.append(encode(manifest))
    except _NOT_ENCODABLE:
        return False
    meta = {
        "snapshot-id": str(snapshot_id),
        "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
        "sequence-number": str(sequence_number),
        "format-version": "2",
        "avro.codec": codec,
        "avro.schema": MANIFEST_LIST_V2_SCHEMA,
    }
    header = RawManifest(meta=meta, codec=KNOWN_CODECS[codec], data_files=())
    _write_blocks(output, header, [(len(pieces), pieces)])
    return True


def _record_encoder(schema_text: str, struct: StructType) -> _Encoder | None:
    """The encoder of records of `struct` (pyiceberg's) as the Avro record schema
    `schema_text` lays them out, worked out once per schema; None when it has a field or type
    `_typed` does not encode."""
    with _LOCK:
        if schema_text in _ENCODERS:
            return _ENCODERS[schema_text]
    try:
        encoder: _Encoder | None = _typed(json.loads(schema_text), struct)
    except (UndecodableManifestLayout, ValueError, KeyError, TypeError, AttributeError):
        encoder = None
    with _LOCK:
        _ENCODERS[schema_text] = encoder
    return encoder


def _typed(avro: Any, kind: IcebergType | None) -> _Encoder:
    """The Avro binary encoding of a value of the Avro type `avro` as pyiceberg holds it: a
    record's fields found by field id among `kind`'s (a `StructType`; positionally when `kind`
    is none or has no field: a partition record), maps (Iceberg's arrays of key/value records)
    from dicts, unions with null, arrays, and `_encoder`'s plain and logical types."""
    if isinstance(avro, list):  # a union: null and one type
        rest = [k for k in avro if k != "null"]
        if len(rest) != 1 or len(avro) != 2:
            raise UndecodableManifestLayout
        null, some = avro_long(avro.index("null")), avro_long(avro.index(rest[0]))
        inner = _typed(rest[0], kind)
        return lambda v: null if v is None else some + inner(v)
    if not isinstance(avro, dict):
        return _encoder(avro)
    avro_type, logical = avro.get("type"), avro.get("logicalType")
    if avro_type == "record" and logical is None:
        return _typed_record(avro, kind if isinstance(kind, StructType) and kind.fields else None)
    if avro_type == "array" and logical == "map":
        key_field, value_field = avro["items"]["fields"]
        key, value = _typed(key_field["type"], None), _typed(value_field["type"], None)
        return lambda m: (
            avro_long(len(m)) + b"".join(key(k) + value(v) for k, v in m.items()) + b"\x00"
            if m
            else b"\x00"
        )
    if avro_type == "array" and logical is None:
        item = _typed(avro["items"], kind.element_type if isinstance(kind, ListType) else None)
        return lambda v: avro_long(len(v)) + b"".join(map(item, v)) + b"\x00" if v else b"\x00"
    return _encoder(avro)


def _typed_record(avro: dict[str, Any], struct: StructType | None) -> _Encoder:
    fields = avro["fields"]
    if struct is None:
        positions = list(range(len(fields)))
        kinds: list[IcebergType | None] = [None] * len(fields)
    else:
        at = {f.field_id: n for n, f in enumerate(struct.fields)}
        positions = [at[f["field-id"]] for f in fields]  # (a field it does not know: KeyError)
        kinds = [struct.fields[n].field_type for n in positions]
    parts = [
        (n, _typed(f["type"], kind)) for n, f, kind in zip(positions, fields, kinds, strict=True)
    ]
    return lambda v: b"".join([encode(v[n]) for n, encode in parts])


_ENTRY_STRUCT = MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION].as_struct()
_MANIFEST_FILE_STRUCT = MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION].as_struct()


# A removed file's entry without its column metrics.
#
# A DELETED entry is read only to find what a snapshot removed: by expiry and orphan removal (its
# path: `manifest_decoding.entry_columns`), by pyiceberg's entries table (`Table.inspect`) — never
# by a scan (pyiceberg, polars, DuckDB, Java plan from live entries only) nor by the change feed
# (`changes.py` diffs live entries). The Iceberg spec makes the six metric maps optional, and Java's
# engines write the DELETED entries of files they planned without stats without them. A commit that
# removes files writes their entries with the metrics empty: ~90 % of a small file's entry (6
# columns' sizes, counts and bounds) — a compaction of 20,000 files wrote 6.8 MB of them, deflated,
# that expiry's decode then inflated and skipped.

_KEPT_HEAD = (134, 100, 101, 102, 103, 104)  # content, path, format, partition, rows, bytes
_KEPT_TAIL = frozenset((131, 132, 135, 140))  # key metadata, split offsets, equality ids, sort
_Encoder = Callable[[Any], bytes]
_UNMEASURED: dict[str, Callable[[DataFile, bytes], bytes] | None] = {}


def unmeasured(schema_text: str) -> Callable[[DataFile, bytes], bytes] | None:
    """For manifests of the Avro schema `schema_text`: a function of a data file and its
    `data_file` bytes (as read: `RawManifest.data_files`) giving those bytes with every column
    metric (`METRIC_MAPS`: sizes, value/null/NaN counts, lower/upper bounds) an empty map, the other
    fields as they were (empty, not null: pyiceberg 0.12's entries table (Table.inspect)
    takes `dict(column_sizes)` of every entry). None when the layout is not one it writes (v2's
    data file fields in v2's order, the metrics optional, partition values of plain types; a
    field it does not know after them): the caller keeps the bytes whole.

    The kept fields are encoded from the file's values and checked against the bytes they
    replace — the bytes must start with the fields before the metrics and end with those after
    them, exactly as encoded — else that entry's bytes are kept whole (a writer that encodes
    differently, a value read otherwise): nothing of a kept field can change."""
    with _LOCK:
        if schema_text in _UNMEASURED:
            return _UNMEASURED[schema_text]
    try:
        strip: Callable[[DataFile, bytes], bytes] | None = _unmeasured(schema_text)
    except (UndecodableManifestLayout, ValueError, KeyError, TypeError, AttributeError):
        strip = None
    with _LOCK:
        _UNMEASURED[schema_text] = strip
    return strip


@dataclass(frozen=True)
class _RemovedLayout:
    """How a removed data file's `data_file` record is encoded under one Avro schema (v2's
    fields in v2's order, the metrics optional: `unmeasured`): the encoders of the fields kept
    but the path, rows and size, and the metrics as empty maps."""

    format: _Encoder
    partition: _Encoder
    tail: list[tuple[int, _Encoder]]  # key metadata, split offsets, equality ids, sort order
    empty: bytes  # the six metric maps, each empty
    ends_in_zero: bool  # the last metric's bytes as written end in a 0 byte


_LAYOUTS: dict[str, _RemovedLayout | None] = {}


def _layout_of(schema_text: str) -> _RemovedLayout | None:
    """`_removed_layout` of manifests of the Avro schema `schema_text`, worked out once; None
    when it is not one a removed entry is written in without its metrics."""
    with _LOCK:
        if schema_text in _LAYOUTS:
            return _LAYOUTS[schema_text]
    try:
        layout: _RemovedLayout | None = _removed_layout(schema_text)
    except (UndecodableManifestLayout, ValueError, KeyError, TypeError, AttributeError):
        layout = None
    with _LOCK:
        _LAYOUTS[schema_text] = layout
    return layout


def _removed_layout(schema_text: str) -> _RemovedLayout:
    top = json.loads(schema_text)["fields"]
    data_file = next(f for f in top if f.get("field-id") == 2)["type"]
    if not isinstance(data_file, dict) or data_file.get("type") != "record":
        raise UndecodableManifestLayout
    fields = data_file["fields"]
    ids = [f.get("field-id") for f in fields]
    head, rest = ids[: len(_KEPT_HEAD)], ids[len(_KEPT_HEAD) :]
    metrics = [i for i in rest if i in METRIC_MAPS]
    if tuple(head) != _KEPT_HEAD or not metrics or rest[: len(metrics)] != metrics:
        raise UndecodableManifestLayout
    after = fields[len(_KEPT_HEAD) + len(metrics) :]
    if any(f.get("field-id") not in _KEPT_TAIL for f in after):
        raise UndecodableManifestLayout
    empty = b""  # each metric an empty map (pyiceberg's entries table reads no null one)
    for field in fields[len(_KEPT_HEAD) : len(_KEPT_HEAD) + len(metrics)]:
        branches = field["type"]
        if not isinstance(branches, list) or len(branches) != 2 or "null" not in branches:
            raise UndecodableManifestLayout  # a required metric: kept
        kind = branches[1 - branches.index("null")]
        if not isinstance(kind, dict) or kind.get("type") != "array":
            raise UndecodableManifestLayout
        empty += avro_long(branches.index(kind)) + b"\x00"  # the map's branch, no item
    by_id = {f["field-id"]: f for f in fields}
    if by_id[134]["type"] != "int" or by_id[100]["type"] != "string":
        raise UndecodableManifestLayout
    if by_id[103]["type"] != "long" or by_id[104]["type"] != "long":
        raise UndecodableManifestLayout
    return _RemovedLayout(
        format=_encoder(by_id[101]["type"]),
        partition=_encoder(by_id[102]["type"]),
        tail=[(f["field-id"], _encoder(f["type"])) for f in after],
        # the bytes replaced end in a 0 byte: the last metric's map end, or its null (branch 0)
        ends_in_zero=branches.index("null") == 0,
        empty=empty,
    )


def _unmeasured(schema_text: str) -> Callable[[DataFile, bytes], bytes]:
    layout = _removed_layout(schema_text)
    empty, ends_in_zero = layout.empty, layout.ends_in_zero
    fmt_and_partition = (layout.format, layout.partition)
    tail = layout.tail
    # the fields but the path, rows and size, encoded once per distinct set of them: a planner's
    # files share their partition records and split offset lists (`manifest_decoding._interned`),
    # so by identity
    # (the objects held with their bytes, so an id is not reused; an equal set is as good)
    shapes: dict[tuple[int, int], tuple[tuple[Any, ...], bytes, bytes, bytes]] = {}
    longs: dict[int, bytes] = {}

    def long(n: int) -> bytes:
        found = longs.get(n)
        if found is None:
            found = longs[n] = avro_long(_integer(n))
        return found

    def shape(file: DataFile, held: tuple[Any, ...]) -> tuple[Any, ...]:
        head = avro_long(_integer(int(file.content)))
        middle = fmt_and_partition[0](file.file_format) + fmt_and_partition[1](file.partition)
        last = b"".join(encode(getattr(file, _TAIL_AT[i])) for i, encode in tail)
        return held, head, middle, last

    def strip(file: DataFile, data: bytes) -> bytes:
        try:
            values = file._data  # (pyiceberg's `Record`: its values in `_DATA_FILE`'s order)
            held = _SHARED(values)
            key = (id(held[0]), id(held[1]))  # the partition and split offsets: the others
            found = shapes.get(key)  # are few distinct values, compared below
            if found is None or found[0] != held:
                found = shapes[key] = shape(file, held)
            _, head, middle, last = found
            path, rows, size = _OWN(values)
            path = path.encode()
            first = b"".join(
                (
                    head,
                    longs.get(len(path)) or long(len(path)),
                    path,
                    middle,
                    longs.get(rows) or long(rows),
                    longs.get(size) or long(size),
                )
            )
        except _NOT_ENCODABLE:
            return data  # a value not encodable as read: the bytes kept whole
        end = len(data) - len(last)
        if (
            end < len(first)
            or not data.startswith(first)
            or not data.endswith(last)
            or (ends_in_zero and data[end - 1] != 0)
        ):
            return data
        return first + empty + last

    return strip


# each kept tail field's name in pyiceberg's `DataFile`
_TAIL_AT = {f.field_id: f.name for f in _DATA_FILE.fields if f.field_id in _KEPT_TAIL}
# the values a removed entry's bytes are shaped by but its path, rows and size (partition,
# split offsets, equality ids, content, format, key metadata, sort order), and those three
_SHARED = itemgetter(*(DATA_FILE_AT[i] for i in (102, 132, 135, 134, 101, 131, 140)))
_OWN = itemgetter(DATA_FILE_AT[100], DATA_FILE_AT[103], DATA_FILE_AT[104])
_ROWS = itemgetter(DATA_FILE_AT[103])
_PARTITION = itemgetter(DATA_FILE_AT[102])
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
# a `ManifestEntry`'s snapshot id, sequence number, file sequence number and data file
_ENTRY_FIELDS = itemgetter(*(ENTRY_AT[i] for i in (1, 3, 4, 2)))


def _encoder(avro: Any) -> _Encoder:
    """The Avro binary encoding of a value of the type `avro` as pyiceberg holds it (dates as
    days, timestamps as microseconds, a record as a `Record`); plain types, unions with null,
    arrays and records only."""
    if isinstance(avro, list):  # a union: null and one type
        rest = [k for k in avro if k != "null"]
        if len(rest) != 1 or len(avro) != 2:
            raise UndecodableManifestLayout
        null, some, inner = (
            avro_long(avro.index("null")),
            avro_long(avro.index(rest[0])),
            _encoder(rest[0]),
        )
        return lambda v: null if v is None else some + inner(v)
    if isinstance(avro, dict):
        kind, logical = avro.get("type"), avro.get("logicalType")
        if kind == "array" and logical is None:
            item = _encoder(avro["items"])
            return lambda v: (
                avro_long(len(v)) + b"".join(item(x) for x in v) + b"\x00" if v else b"\x00"
            )
        if kind == "record" and logical is None:
            encoders = [_encoder(f["type"]) for f in avro["fields"]]
            return lambda v: b"".join(e(v[n]) for n, e in enumerate(encoders))
        if logical in (None, "date", "timestamp-micros", "timestamptz-micros") and kind in (
            "int",
            "long",
        ):
            return _plain(kind)
        raise UndecodableManifestLayout  # decimal, uuid, fixed, time, ...: kept whole
    return _plain(avro)


def _plain(kind: Any) -> _Encoder:
    if kind in ("int", "long"):
        return lambda v: avro_long(_integer(v))
    if kind == "string":
        return lambda v: avro_long(len(b := str.encode(v))) + b
    if kind == "bytes":
        return lambda v: avro_long(len(v)) + bytes(v)
    if kind == "boolean":
        return lambda v: b"\x01" if _boolean(v) else b"\x00"
    if kind == "float":
        return lambda v: struct.pack("<f", v)
    if kind == "double":
        return lambda v: struct.pack("<d", v)
    raise UndecodableManifestLayout


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UndecodableManifestLayout(f"not an integer: {value!r}")
    return int(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise UndecodableManifestLayout(f"not a boolean: {value!r}")
    return value


def distinct_partitions(partitions: list[Record]) -> list[Record]:
    """`partitions` without repeats (by their values), in order: what a manifest's partition
    summaries (null, NaN, lower and upper bound per field) are made of — 20,000 removed files
    of 200 partitions summarised from 200 values, not 20,000. All of them when a value is not
    hashable."""
    seen: dict[tuple[Any, ...], Record] = {}
    try:
        for partition in partitions:
            seen.setdefault(partition_values(partition), partition)
    except TypeError:
        return partitions
    return list(seen.values())


def _prefix_of(
    status: ManifestEntryStatus, snapshot_id: int | None, sequence: int, file_sequence: int
) -> bytes:
    """An entry's four-field prefix: `status`, `snapshot_id` and its sequence numbers
    (explicit)."""
    snapshot = b"\x00" if snapshot_id is None else b"\x02" + avro_long(snapshot_id)
    return (
        avro_long(int(status))
        + snapshot
        + b"\x02"
        + avro_long(int(sequence))
        + b"\x02"
        + avro_long(int(file_sequence))
    )
