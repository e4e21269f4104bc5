"""Scan planning with the manifests decoded by fastavro: the table polars' native scan plans with.

polars' Iceberg scan (`native_scan`) plans the files of a read with pyiceberg: `table.scan(...)`
then `plan_files()`, which decodes every manifest with pyiceberg's pure-Python Avro reader (a
header schema conversion and a reader resolution per manifest, then each entry field by field,
in a thread pool). That was about a third of a selective read of a 50-file table.

`planned(table)` is the same table (same metadata, FileIO, catalog, identifier) whose `scan()`
returns a `FastDataScan`: pyiceberg's `DataScan` whose planner decodes each manifest's entries
with fastavro's C reader (`manifest_entries`), in the calling thread for a local warehouse. All
the planning itself is pyiceberg's, unchanged: manifests pruned by their partition summaries,
entries by the partition and metrics evaluators, delete files matched to data files by
`DeleteFileIndex` (sequence numbers, partitions, file-scoped bounds), residuals. The entries are
pyiceberg's own `ManifestEntry`/`DataFile` records with the values pyiceberg's reader gives
(`pipeline_output_tests/stores/test_scan_planning.py` compares them on every kind of table this
project writes). A manifest whose layout is not one checked here (a partition value of a type
not mapped below, a missing required field) is decoded by pyiceberg instead: same entries, slower.

A scan planned after expiry removed its snapshot (a lazy read pinned to it, collected later)
fails reading the snapshot's manifest list: `SnapshotExpired`, naming the dataset and snapshot.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from datetime import UTC, date, datetime, timedelta
from functools import cached_property
from threading import Lock
from typing import Any

import fastavro
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    _inherit_from_manifest,
)
from pyiceberg.table import DataScan, FileScanTask, ManifestGroupPlanner, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties, Record
from pyiceberg.utils.concurrent import ExecutorFactory

from pipeline_output.stores.iceberg.table.snapshot_log import pinned_snapshot_gone

_DATA_FILE = DATA_FILE_TYPE[DEFAULT_READ_VERSION]
_MAPS = frozenset((108, 109, 110, 137, 125, 128))  # column sizes, counts, bounds: int -> value
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_LOCAL = ("file:", "/")
_ALL = AlwaysTrue()


def planned(table: Table, *, dataset: str | None = None) -> Table:
    """`table` whose scans plan with fastavro-decoded manifests (`FastDataScan`); a scan whose
    planning fails because expiry removed its snapshot since `table` was loaded raises
    `SnapshotExpired` naming `dataset` (default: the table's name) and the snapshot."""
    out = PlannedTable(
        identifier=table.name(),
        metadata=table.metadata,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
        config=table.config,
    )
    out.dataset = dataset or ".".join(table.name())
    return out


class PlannedTable(Table):
    """A loaded table whose `scan()` is a `FastDataScan` (everything else is `Table`'s)."""

    dataset: str = ""

    def scan(
        self,
        row_filter: str | BooleanExpression = _ALL,
        selected_fields: tuple[str, ...] = ("*",),
        case_sensitive: bool = True,
        snapshot_id: int | None = None,
        options: Properties = EMPTY_DICT,
        limit: int | None = None,
    ) -> DataScan:
        return FastDataScan(
            table_metadata=self.metadata,
            io=self.io,
            row_filter=row_filter,
            selected_fields=selected_fields,
            case_sensitive=case_sensitive,
            snapshot_id=snapshot_id,
            options=options,
            limit=limit,
            catalog=self.catalog,
            table_identifier=self.name(),
            table=self,
        )


class FastDataScan(DataScan):
    """pyiceberg's `DataScan` planned by `FastPlanner` (the manifests decoded by fastavro).

    `table`: the `PlannedTable` it scans, asked again when planning fails (a constructor
    argument, so pyiceberg's `update` — `filter`, `select` — carries it over)."""

    def __init__(
        self,
        table_metadata: TableMetadata,
        io: FileIO,
        row_filter: str | BooleanExpression = _ALL,
        selected_fields: tuple[str, ...] = ("*",),
        case_sensitive: bool = True,
        snapshot_id: int | None = None,
        options: Properties = EMPTY_DICT,
        limit: int | None = None,
        catalog: Catalog | None = None,
        table_identifier: Identifier | None = None,
        table: PlannedTable | None = None,
    ) -> None:
        super().__init__(
            table_metadata=table_metadata,
            io=io,
            row_filter=row_filter,
            selected_fields=selected_fields,
            case_sensitive=case_sensitive,
            snapshot_id=snapshot_id,
            options=options,
            limit=limit,
            catalog=catalog,
            table_identifier=table_identifier,
        )
        self.table = table

    def plan_files(self) -> Iterable[FileScanTask]:
        """pyiceberg's plan; a failure because expiry removed the scanned snapshot (and its
        manifests) since the table was loaded: `SnapshotExpired`."""
        try:
            return list(super().plan_files())
        except Exception as exc:
            snapshot = self.snapshot()
            if self.table is None or snapshot is None:
                raise
            gone = pinned_snapshot_gone(
                self.table, snapshot.snapshot_id, dataset=self.table.dataset
            )
            if gone is None:
                raise
            raise gone from exc

    @cached_property
    def _manifest_planner(self) -> ManifestGroupPlanner:
        return FastPlanner(
            table_metadata=self.table_metadata,
            io=self.io,
            row_filter=self.row_filter,
            case_sensitive=self.case_sensitive,
            options=self.options,
        )


class FastPlanner(ManifestGroupPlanner):
    """pyiceberg's planner, the manifest entries read by `manifest_entries`."""

    def plan_manifest_entries(
        self, manifests: Iterable[ManifestFile]
    ) -> Iterator[list[ManifestEntry]]:
        """pyiceberg's step 1 and 2 (manifests pruned by partition summaries, entries by the
        partition and metrics evaluators), local manifests decoded in this thread."""
        by_spec: dict[int, Callable[[ManifestFile], bool]] = {}
        kept = []
        for manifest in manifests:
            spec_id = manifest.partition_spec_id
            if spec_id not in by_spec:
                by_spec[spec_id] = self._build_manifest_evaluator(spec_id)
            if by_spec[spec_id](manifest):
                kept.append(manifest)
        partitions: dict[int, Callable[[DataFile], bool]] = {}
        for manifest in kept:
            if manifest.partition_spec_id not in partitions:
                spec_id = manifest.partition_spec_id
                partitions[spec_id] = self._build_partition_evaluator(spec_id)
        metrics = self._build_metrics_evaluator()
        data_sequences = [
            m.min_sequence_number or 0 for m in kept if m.content == ManifestContent.DATA
        ]
        lowest = min(data_sequences) if data_sequences else 0
        todo = [m for m in kept if self._check_sequence_number(lowest, m)]

        def matching(manifest: ManifestFile) -> list[ManifestEntry]:
            keep = partitions[manifest.partition_spec_id]
            return [
                entry
                for entry in manifest_entries(self.io, manifest)
                if keep(entry.data_file) and metrics(entry.data_file)
            ]

        if len(todo) > 1 and not all(m.manifest_path.startswith(_LOCAL) for m in todo):
            executor: Executor = ExecutorFactory.get_or_create()
            return executor.map(matching, todo)  # object stores: fetch in parallel
        return iter([matching(m) for m in todo])


# -- decoding ---------------------------------------------------------------------------------------


def manifest_entries(file_io: Any, manifest: ManifestFile) -> list[ManifestEntry]:
    """The manifest's live entries, as pyiceberg's `fetch_manifest_entry(discard_deleted=True)`
    returns them (sequence numbers and spec id inherited from `manifest`)."""
    with file_io.new_input(manifest.manifest_path).open() as stream:
        data = stream.read()
    reader = fastavro.reader(io.BytesIO(data))
    convert = _converter(reader.metadata.get("avro.schema", ""), reader.writer_schema)
    if convert is None:
        return manifest.fetch_manifest_entry(file_io, discard_deleted=True)
    out = []
    for record in reader:
        entry = convert(record)
        if entry.status != ManifestEntryStatus.DELETED:
            out.append(_inherit_from_manifest(entry, manifest))
    return out


_CONVERTERS: dict[str, Callable[[Any], ManifestEntry] | None] = {}
_CONVERTERS_LOCK = Lock()


def _converter(text: str, writer: Any) -> Callable[[Any], ManifestEntry] | None:
    """The record -> `ManifestEntry` conversion of one writer schema (None: pyiceberg decodes)."""
    with _CONVERTERS_LOCK:
        if text in _CONVERTERS:
            return _CONVERTERS[text]
    try:
        convert = _build(writer)
    except _Unsupported:
        convert = None
    with _CONVERTERS_LOCK:
        _CONVERTERS[text] = convert
    return convert


class _Unsupported(Exception):
    """A manifest layout this module does not decode (pyiceberg does)."""


def _fields(record_schema: Any) -> dict[int, tuple[str, Any]]:
    if not isinstance(record_schema, dict) or record_schema.get("type") != "record":
        raise _Unsupported
    return {f["field-id"]: (f["name"], f["type"]) for f in record_schema["fields"]}


def _build(writer: Any) -> Callable[[Any], ManifestEntry]:
    top = _fields(writer)
    if any(i not in top for i in (0, 2)):
        raise _Unsupported
    names = [top[i][0] if i in top else None for i in (0, 1, 3, 4)]
    data_file = _fields(top[2][1])
    columns: list[tuple[str | None, Callable[[Any], Any] | None, Any]] = []
    for field in _DATA_FILE.fields:
        if field.field_id not in data_file:
            if field.required:
                raise _Unsupported
            columns.append((None, None, field.initial_default))
            continue
        name, avro = data_file[field.field_id]
        convert: Callable[[Any], Any] | None = None
        if field.field_id == 134:
            convert = DataFileContent
        elif field.field_id == 101:
            convert = FileFormat
        elif field.field_id == 102:
            convert = _partition(avro)
        elif field.field_id in _MAPS:
            convert = _as_dict
        columns.append((name, convert, None))
    status, snapshot, sequence, file_sequence = names
    assert status is not None

    def entry(record: Any) -> ManifestEntry:
        raw = record[top[2][0]]
        values = []
        for name, convert, default in columns:
            if name is None:
                values.append(default)
                continue
            value = raw.get(name)
            values.append(convert(value) if convert is not None and value is not None else value)
        return ManifestEntry(
            ManifestEntryStatus(record[status]),
            record.get(snapshot) if snapshot else None,
            record.get(sequence) if sequence else None,
            record.get(file_sequence) if file_sequence else None,
            DataFile(*values),
        )

    return entry


def _as_dict(pairs: list[dict[str, Any]]) -> dict[Any, Any]:
    return {pair["key"]: pair["value"] for pair in pairs}


def _partition(avro: Any) -> Callable[[Any], Any]:
    """The partition record as pyiceberg reads it: a `Record` of the values in written order,
    dates as days and timestamps as microseconds since the epoch (fastavro gives objects)."""
    if not isinstance(avro, dict) or avro.get("type") != "record":
        raise _Unsupported
    parts = []
    for field in avro["fields"]:
        kind = field["type"]
        if isinstance(kind, list):  # ["null", T]
            rest = [k for k in kind if k != "null"]
            if len(rest) != 1:
                raise _Unsupported
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
        raise _Unsupported
    if not isinstance(kind, dict):
        raise _Unsupported
    logical, base = kind.get("logicalType"), kind.get("type")
    if logical is None and base in ("int", "long", "string", "boolean", "float", "double"):
        return None
    if logical == "date" and base == "int":
        return _days
    if logical == "timestamp-micros" and base == "long":
        return _micros
    raise _Unsupported  # time, uuid, decimal, fixed, ...: pyiceberg decodes


def _days(value: date) -> int:
    return (value - _EPOCH_DAY).days


def _micros(value: datetime) -> int:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _MICRO
