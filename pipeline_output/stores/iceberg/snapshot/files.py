"""Writing Iceberg data files from polars frames, outside pyiceberg's single-threaded writer.

Owns the data-file fast path: polars' multithreaded Parquet writer, given the table's Arrow schema
with `PARQUET:field_id` metadata (so files carry Iceberg field ids and required-ness), into memory;
the bytes go out through the table's own `FileIO` (local, S3, ... alike) and the Iceberg
`DataFile` (statistics, bounds, partition) is built from the Parquet footer as pyiceberg's own
helpers build it (`file_statistics`), plus the float columns' NaN counts, which Parquet footers
lack. Partitioned tables get one file per partition (`partitions.py` computes each row's
values), encoded together by one polars query; frames above the target size (the table's, or the writer's `target_bytes`: compaction
writes each bin as one file) are split. Files are not part of any snapshot until the caller commits them.

Positional delete files of the native arm (merge-on-read).

Owns the two halves of Iceberg v2 positional deletes as this project uses them:

- reading: which physical row positions of a data file its delete files remove (the delete files
  pyiceberg's planning associated with it — ours, or another engine's — and Puffin deletion
  vectors alike, through pyiceberg's own reader);
- writing: one *file-scoped* delete file per data file (`file_path` is the same in every row, and
  its lower and upper bounds hold the whole path, so every reader associates it with exactly that
  data file). A write that deletes more rows of a data file that already has a file-scoped delete
  file of ours writes one new file with the union of both and removes the old one in the same
  commit: a data file never carries more than one delete file of ours.

Delete files are written with the same FileIO, location provider and codec as data files, and
belong to no snapshot until the caller commits them.
"""

from __future__ import annotations

import functools
import io
import itertools
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    DataFileStatistics,
    MetricModeTypes,
    MetricsMode,
    StatisticsCollector,
    _read_deletes,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    match_metrics_mode,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, TableProperties
from pyiceberg.table.delete_file_index import _referenced_data_file_path
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    DoubleType,
    FloatType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
)

from pipeline_output.stores.iceberg.snapshot.file_statistics import FooterStatistics
from pipeline_output.stores.iceberg.table.file_io import write_whole
from pipeline_output.stores.iceberg.table.partitions import partition_columns
from pipeline_output.stores.schema import conform

DEFAULT_TARGET_BYTES = 512 * 1024 * 1024
# frames of a write encoded by one polars query (`DataFileWriter._write_many`) up to this many
# bytes of rows together (their encoded files are held until each is put)
ENCODE_BATCH_BYTES = 64 * 1024 * 1024


class TableFileWriter:
    """What every writer of a table's files shares: the table's FileIO, location provider and
    Parquet codec, one write id, numbered names, and the list of paths written (deleted again
    when the write does not commit)."""

    def __init__(
        self, metadata: TableMetadata, file_io: FileIO, *, write_id: uuid.UUID, schema: Schema
    ) -> None:
        self.metadata = metadata
        self.io = file_io
        self.write_id = write_id
        self._counter = itertools.count(0)
        self._locations = load_location_provider(
            table_location=metadata.location, table_properties=metadata.properties
        )
        props = metadata.properties
        self._codec = props.get("write.parquet.compression-codec", "zstd")
        level = props.get("write.parquet.compression-level")
        self._level = int(level) if level else None
        self._file_schema = schema
        self.written: list[str] = []

    # the statistics set-up walks the schema with pyiceberg's visitors (~1 ms in a fresh
    # process): done by a writer that writes, not by every commit's writers (most write nothing);
    # a schema of top-level primitive columns (the usual table) is read field by field instead
    @functools.cached_property
    def _stats_plan(self) -> dict[int, Any]:
        flat = flat_statistics_plan(self._file_schema, self.metadata.properties)
        if flat is not None:
            return flat
        return compute_statistics_plan(self._file_schema, self.metadata.properties)

    @functools.cached_property
    def _column_mapping(self) -> dict[str, int]:
        if _flat(self._file_schema):  # a top-level column's Parquet path is its name
            return {f.name: f.field_id for f in self._file_schema.fields}
        return parquet_path_to_id_mapping(self._file_schema)

    @functools.cached_property
    def _footer_stats(self) -> FooterStatistics:
        return FooterStatistics(self._stats_plan, self._column_mapping)

    def _put(self, data: bytes, *, suffix: str = "") -> str:
        """Write `data` as a new file of the table; its location. The name holds the write's
        own uuid: no existence check first (on S3 a HEAD and a LIST)."""
        name = f"00000-{next(self._counter)}-{self.write_id}{suffix}.parquet"
        path = self._locations.new_data_location(data_file_name=name)
        write_whole(self.io, path, data)
        self.written.append(path)
        return path

    def _statistics(self, data: bytes) -> DataFileStatistics:
        return data_file_statistics_from_parquet_metadata(
            parquet_metadata=pq.read_metadata(pa.BufferReader(data)),
            stats_columns=self._stats_plan,
            parquet_column_mapping=self._column_mapping,
        )


def _flat(schema: Schema) -> bool:
    """Whether every column of `schema` is a top-level primitive whose name holds no `.`
    (pyiceberg's column names and Parquet paths of it are the fields' names)."""
    return all(isinstance(f.field_type, PrimitiveType) and "." not in f.name for f in schema.fields)


def flat_statistics_plan(
    schema: Schema, properties: dict[str, str]
) -> dict[int, StatisticsCollector] | None:
    """pyiceberg's `compute_statistics_plan` of a schema of top-level primitive columns, read
    from its fields in order without its schema visitor (None: another schema, left to
    pyiceberg): each column's metrics mode is the table's default (the property
    write.metadata.metrics.default) or its own (`write.metadata.metrics.column.<name>`),
    `truncate(n)` kept for strings and binaries only (`full` otherwise), as pyiceberg decides."""
    if not _flat(schema):
        return None
    default = match_metrics_mode(
        properties.get(
            TableProperties.DEFAULT_WRITE_METRICS_MODE,
            TableProperties.DEFAULT_WRITE_METRICS_MODE_DEFAULT,
        )
    )
    plan: dict[int, StatisticsCollector] = {}
    for f in schema.fields:
        own = properties.get(f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.{f.name}")
        mode = match_metrics_mode(own) if own else default
        primitive = f.field_type
        assert isinstance(primitive, PrimitiveType)
        if mode.type == MetricModeTypes.TRUNCATE and not isinstance(
            primitive, (StringType, BinaryType)
        ):
            mode = MetricsMode(MetricModeTypes.FULL)
        plan[f.field_id] = StatisticsCollector(
            field_id=f.field_id, iceberg_type=primitive, mode=mode, column_name=f.name
        )
    return plan


def file_arrow_schema(schema: Schema) -> pa.Schema:
    """`schema` as Arrow, with `PARQUET:field_id` metadata: the schema a table's data files
    are written with (`DataFileWriter.arrow_schema`)."""
    return schema_to_pyarrow(schema, include_field_ids=True)


class DataFileWriter(TableFileWriter):
    """Writes frames as data files of one table (one write id, numbered files)."""

    def __init__(
        self,
        metadata: TableMetadata,
        file_io: FileIO,
        *,
        write_id: uuid.UUID,
        target_bytes: int | None = None,
        arrow_schema: pa.Schema | None = None,
    ) -> None:
        """`arrow_schema`: the table's (`file_arrow_schema`), when the caller has it already."""
        super().__init__(metadata, file_io, write_id=write_id, schema=metadata.schema())
        self._schema = metadata.schema()
        if arrow_schema is not None:
            self.__dict__["arrow_schema"] = arrow_schema  # the cached property, given
        props = metadata.properties
        self._target = target_bytes or int(
            props.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES)
        )
        self._partitioned = bool(metadata.spec().fields)

    def write(
        self, frame: pl.DataFrame, *, nan_counts: dict[int, int] | None = None
    ) -> list[DataFile]:
        """Write `frame` (already in the table's columns) as one or more data files.
        `nan_counts`: the frame's (`nan_counts`), counted by the caller; used when the frame is
        written as one file, else each file's are counted."""
        if frame.height == 0:
            return []
        files: list[DataFile] = []
        batch: list[tuple[pl.DataFrame, Record | None]] = []
        held = 0
        for part, record in self._partitions(frame):
            for chunk in self._chunks(part):
                if chunk.height == frame.height:  # one file: as it always was
                    files.append(self._write_one(chunk, record, nan_counts))
                    continue
                size = int(chunk.estimated_size())
                if batch and held + size > ENCODE_BATCH_BYTES:
                    files.extend(self._write_many(batch))
                    batch, held = [], 0
                batch.append((chunk, record))
                held += size
        files.extend(self._write_many(batch))
        return files

    def _write_many(self, chunks: list[tuple[pl.DataFrame, Record | None]]) -> list[DataFile]:
        """One data file per (frame, partition record), the frames encoded by one polars query
        (`collect_all` of one in-memory sink each): polars sets up one query, not one per file,
        and encodes the files in parallel — a partitioned write of many small files (a
        compaction's group of 41 partitions) spends most of its time starting `write_parquet`s.
        The same bytes as `_write_one`'s; a frame polars refuses to encode is written alone
        (`_write_one`: pyarrow's writer)."""
        if len(chunks) < 2:
            return [self._write_one(chunk, record) for chunk, record in chunks]
        options = self.parquet_options()
        buffers = [io.BytesIO() for _ in chunks]
        try:
            pl.collect_all(
                [
                    chunk.lazy().sink_parquet(
                        buffer, **options, credential_provider=None, lazy=True
                    )
                    for (chunk, _), buffer in zip(chunks, buffers, strict=True)
                ]
            )
        except pl.exceptions.PolarsError:
            return [self._write_one(chunk, record) for chunk, record in chunks]
        return [
            self.register(buffer.getvalue(), record=record, nan_counts=self.nan_counts(chunk))
            for (chunk, record), buffer in zip(chunks, buffers, strict=True)
        ]

    def _partitions(self, frame: pl.DataFrame) -> Iterator[tuple[pl.DataFrame, Record | None]]:
        """The frame split by the table's partition values (one file holds one partition), each
        with its partition record (None: unpartitioned)."""
        if not self._partitioned:
            yield frame, None
            return
        spec = self.metadata.spec()
        parts = partition_columns(frame, self.metadata)
        names = [p.name for p in parts]
        for part in frame.with_columns(parts).partition_by(names, maintain_order=True):
            values = part.row(0, named=True)
            record = Record(
                *(
                    partition_record_value(field, values[name], self._schema)
                    for field, name in zip(spec.fields, names, strict=True)
                )
            )
            yield part.drop(names), record

    def _chunks(self, frame: pl.DataFrame) -> Iterator[pl.DataFrame]:
        size = frame.estimated_size()
        if size <= self._target:
            yield frame
            return
        n = -(-int(size) // self._target)
        rows = -(-frame.height // n)
        for offset in range(0, frame.height, rows):
            yield frame.slice(offset, rows)

    @functools.cached_property
    def arrow_schema(self) -> pa.Schema:
        """The table's Arrow schema with `PARQUET:field_id` metadata, as its files are written."""
        return file_arrow_schema(self._schema)

    def nan_counts(self, frame: pl.DataFrame) -> dict[int, int]:
        """NaN values per top-level float and double column (Parquet statistics have none;
        Iceberg readers use them, with the bounds, to prune `NaN` and `!= NaN` filters)."""
        floats = [
            f
            for f in self._schema.fields
            if isinstance(f.field_type, (FloatType, DoubleType)) and f.name in frame.columns
        ]
        if not floats:
            return {}
        counts = frame.select(pl.col(f.name).is_nan().sum() for f in floats).row(0)
        return {f.field_id: int(n or 0) for f, n in zip(floats, counts, strict=True)}

    def parquet_options(self) -> dict[str, Any]:
        """The options polars' Parquet writer (`write_parquet`, `sink_parquet`) writes this
        table's data files with: codec, level, statistics, the Arrow schema with field ids."""
        if self._codec in ("zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed"):
            codec = self._codec
        else:
            codec = "zstd"
        return {
            "compression": codec,
            "compression_level": self._level if codec in ("zstd", "gzip", "brotli") else None,
            "statistics": True,
            "arrow_schema": self.arrow_schema,
        }

    def _write_one(
        self, frame: pl.DataFrame, record: Record | None, nan_counts: dict[int, int] | None = None
    ) -> DataFile:
        buffer = io.BytesIO()
        options = self.parquet_options()
        codec = options["compression"]
        try:
            frame.write_parquet(buffer, **options)
        except pl.exceptions.PolarsError:
            # polars refused the schema (a nested type it maps differently): use pyarrow.
            buffer = io.BytesIO()
            pq.write_table(
                conform(frame, self._schema).cast(self.arrow_schema),
                buffer,
                compression=codec,
                compression_level=self._level,
            )
        if nan_counts is None:
            nan_counts = self.nan_counts(frame)
        return self.register(buffer.getvalue(), record=record, nan_counts=nan_counts)

    def register(
        self, data: bytes, *, record: Record | None, nan_counts: dict[int, int]
    ) -> DataFile:
        """`data`, a Parquet file written with `parquet_options` holding rows of one partition
        (`record`, the current spec's; None: unpartitioned), written out as a new data file of
        the table; its `DataFile`. `nan_counts`: NaN values per float column's field id."""
        if record is None and self.metadata.spec().fields:  # the footer says which partition
            stats = self._statistics(data)
            partition = stats.partition(self.metadata.spec(), self._schema)
            serialized = stats.to_serialized_dict()
        else:  # pyiceberg's statistics, computed without its per-column set-up
            partition = record if record is not None else Record()
            serialized = self._footer_stats.of_bytes(data)
        path = self._put(data)
        serialized["nan_value_counts"] = nan_counts
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=partition,
            file_size_in_bytes=len(data),
            sort_order_id=None,
            spec_id=self.metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **serialized,
        )
        data_file.spec_id = self.metadata.default_spec_id  # (from_args does not set it)
        return data_file


PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
_DELETE_ROWS_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.dictionary(pa.int32(), pa.string()),
            nullable=False,
            metadata={"PARQUET:field_id": str(PATH_FIELD_ID)},
        ),
        pa.field(
            "pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_FIELD_ID)}
        ),
    ]
)
# the spec's schema (pyiceberg 0.12's POSITIONAL_DELETE_SCHEMA types `pos` as int, not long)
_SCHEMA = Schema(
    NestedField(PATH_FIELD_ID, "file_path", StringType(), required=True),
    NestedField(POS_FIELD_ID, "pos", LongType(), required=True),
)
_EMPTY = pl.Series("pos", [], dtype=pl.Int64)
# delete files encoded at once: 20 small ones took 11-12 ms with 1 or 2, 14-20 ms with 4 (2 cores)
WRITE_THREADS = 2


def referenced_path(delete_file: DataFile) -> str | None:
    """The one data file a positional delete file applies to, when its path bounds say so."""
    if delete_file.content != DataFileContent.POSITION_DELETES:
        return None
    return _referenced_data_file_path(delete_file)


def deleted_positions(
    file_io: FileIO, task: FileScanTask, *, files: Iterable[DataFile] | None = None
) -> pl.Series:
    """The sorted, distinct physical positions of `task.file` that its delete files (or only
    `files` of them) remove."""
    parts: list[pl.Series] = []
    for delete_file in task.delete_files if files is None else files:
        positions = _read_deletes(file_io, delete_file).get(task.file.file_path)
        if positions is not None and len(positions):
            parts.append(pl.Series("pos", positions.combine_chunks(), dtype=pl.Int64))
    if not parts:
        return _EMPTY
    merged = parts[0] if len(parts) == 1 else pl.concat(parts)
    return merged.unique().sort()


def own_delete_files(task: FileScanTask) -> list[DataFile]:
    """The task's delete files that apply to its data file only (replaced, never shared)."""
    return [d for d in task.delete_files if referenced_path(d) == task.file.file_path]


class DeleteFileWriter(TableFileWriter):
    """Writes file-scoped positional delete files for data files of one table."""

    def __init__(self, metadata: TableMetadata, file_io: FileIO, *, write_id: uuid.UUID) -> None:
        super().__init__(metadata, file_io, write_id=write_id, schema=_SCHEMA)

    def write(self, data_file: DataFile, positions: Iterable[int] | pl.Series) -> DataFile:
        """One delete file removing `positions` (distinct, any order) of `data_file`."""
        return self.write_many([(data_file, positions)])[0]

    def write_many(
        self, files: Sequence[tuple[DataFile, Iterable[int] | pl.Series]]
    ) -> list[DataFile]:
        """One delete file for each (data file, positions), in order, a few at a time (pyarrow's
        writes and the FileIO's puts release the GIL). Written by pyarrow from `_delete_rows`,
        with no Arrow schema stored: every reader types the path a plain `string` (iceberg-rust
        reads no other; polars' writer records its `large_string`).

        A file's statistics are known without reading it back: every row names its data file
        (the whole path is both bounds: readers associate the file with exactly that data
        file), no value is null, the positions' bounds are their first and last."""
        pairs = [(data_file, _sorted_positions(p)) for data_file, p in files]
        if len(pairs) < 2:
            return [self._write_one(*pair) for pair in pairs]
        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(pairs))) as pool:
            return list(pool.map(lambda pair: self._write_one(*pair), pairs))

    def _write_one(self, data_file: DataFile, pos: pl.Series) -> DataFile:
        """The delete file of `data_file` removing `pos` (sorted)."""
        buffer = io.BytesIO()
        codec = self._codec if self._codec in ("zstd", "snappy", "gzip", "lz4") else "zstd"
        footers: list[pq.FileMetaData] = []
        pq.write_table(
            _delete_rows(data_file.file_path, pos),
            buffer,
            compression=codec,
            compression_level=self._level,
            metadata_collector=footers,
            store_schema=False,
        )
        data = buffer.getvalue()
        sizes = {PATH_FIELD_ID: 0, POS_FIELD_ID: 0}
        offsets = []
        for footer in footers[:1]:
            for g in range(footer.num_row_groups):
                group = footer.row_group(g)
                first = group.column(0)
                offsets.append(first.dictionary_page_offset or first.data_page_offset)
                sizes[PATH_FIELD_ID] += group.column(0).total_compressed_size
                sizes[POS_FIELD_ID] += group.column(1).total_compressed_size
        n = pos.len()
        path = data_file.file_path
        location = self._put(data, suffix="-deletes")
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=location,
            file_format=FileFormat.PARQUET,
            partition=data_file.partition,
            record_count=n,
            file_size_in_bytes=len(data),
            column_sizes=sizes,
            value_counts={PATH_FIELD_ID: n, POS_FIELD_ID: n},
            null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
            nan_value_counts={},
            lower_bounds={PATH_FIELD_ID: path.encode(), **_pos_bound(pos, 0)},
            upper_bounds={PATH_FIELD_ID: path.encode(), **_pos_bound(pos, -1)},
            split_offsets=sorted(offsets) or None,
            sort_order_id=None,
            spec_id=data_file.spec_id,
            equality_ids=None,
            key_metadata=None,
        )
        delete_file.spec_id = data_file.spec_id  # (from_args does not set it)
        return delete_file


def _sorted_positions(positions: Iterable[int] | pl.Series) -> pl.Series:
    """`positions` as distinct, ascending Int64 values named `pos`."""
    pos = positions if isinstance(positions, pl.Series) else pl.Series("pos", list(positions))
    return pos.cast(pl.Int64).unique().sort().rename("pos")


def _pos_bound(pos: pl.Series, at: int) -> dict[int, bytes]:
    return {POS_FIELD_ID: to_bytes(LongType(), int(pos[at]))} if pos.len() else {}


def _delete_rows(path: str, pos: pl.Series) -> pa.Table:
    """The rows of the delete file removing `pos` of the data file at `path`: the path
    dictionary-encoded (one value and a zero index a row, as Parquet stores it: building and
    hashing the path once a row took most of an upsert's delete-file encode), then the
    positions. Built from buffers: `pa.array` of Python values imports pandas (~0.18 s of a
    fresh process's first merge-on-read commit), and a polars expression costs ~0.1 ms a file."""
    value = path.encode()
    indices = pa.Array.from_buffers(
        pa.int32(), pos.len(), [None, pa.py_buffer(bytes(4 * pos.len()))]
    )
    dictionary = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.py_buffer(struct.pack("<ii", 0, len(value))), pa.py_buffer(value)]
    )
    paths = pa.DictionaryArray.from_arrays(indices, dictionary)
    return pa.Table.from_arrays([paths, pos.to_arrow()], schema=_DELETE_ROWS_SCHEMA)
