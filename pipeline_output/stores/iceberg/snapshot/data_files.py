"""Writing Iceberg data files from polars frames, outside pyiceberg's single-threaded writer.

Owns the data-file fast path: polars' multithreaded Parquet writer, given the table's Arrow schema
with `PARQUET:field_id` metadata (so files carry Iceberg field ids and required-ness), into memory;
the bytes go out through the table's own `FileIO` (local, S3, ... alike) and the Iceberg
`DataFile` (statistics, bounds, partition) is built from the Parquet footer with pyiceberg's own
helpers (plus the float columns' NaN counts, which Parquet footers lack). Partitioned tables get
one file per partition (`partitions.py` computes each row's
values); frames above the target size (the table's, or the writer's `target_bytes`: compaction
writes each bin as one file) are split. Files are not part of any snapshot until the caller commits them.
"""

from __future__ import annotations

import io
import itertools
import uuid
from collections.abc import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    DataFileStatistics,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, FloatType

from pipeline_output.stores.iceberg.table.partitions import partition_columns
from pipeline_output.stores.schema import conform

DEFAULT_TARGET_BYTES = 512 * 1024 * 1024


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
        self._stats_plan = compute_statistics_plan(schema, props)
        self._column_mapping = parquet_path_to_id_mapping(schema)
        self.written: list[str] = []

    def _put(self, data: bytes, *, suffix: str = "") -> str:
        """Write `data` as a new file of the table; its location."""
        name = f"00000-{next(self._counter)}-{self.write_id}{suffix}.parquet"
        path = self._locations.new_data_location(data_file_name=name)
        with self.io.new_output(path).create(overwrite=False) as stream:
            stream.write(data)
        self.written.append(path)
        return path

    def _statistics(self, data: bytes) -> DataFileStatistics:
        return data_file_statistics_from_parquet_metadata(
            parquet_metadata=pq.read_metadata(pa.BufferReader(data)),
            stats_columns=self._stats_plan,
            parquet_column_mapping=self._column_mapping,
        )


class DataFileWriter(TableFileWriter):
    """Writes frames as data files of one table (one write id, numbered files)."""

    def __init__(
        self,
        metadata: TableMetadata,
        file_io: FileIO,
        *,
        write_id: uuid.UUID,
        target_bytes: int | None = None,
    ) -> None:
        super().__init__(metadata, file_io, write_id=write_id, schema=metadata.schema())
        self._schema = metadata.schema()
        self._arrow_schema = schema_to_pyarrow(self._schema, include_field_ids=True)
        props = metadata.properties
        self._target = target_bytes or int(
            props.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES)
        )
        self._partitioned = bool(metadata.spec().fields)

    def write(self, frame: pl.DataFrame) -> list[DataFile]:
        """Write `frame` (already in the table's columns) as one or more data files."""
        if frame.height == 0:
            return []
        files: list[DataFile] = []
        for part, record in self._partitions(frame):
            for chunk in self._chunks(part):
                files.append(self._write_one(chunk, record))
        return files

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

    def _nan_counts(self, frame: pl.DataFrame) -> dict[int, int]:
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

    def _write_one(self, frame: pl.DataFrame, record: Record | None) -> DataFile:
        buffer = io.BytesIO()
        if self._codec in ("zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed"):
            codec = self._codec
        else:
            codec = "zstd"
        try:
            frame.write_parquet(
                buffer,
                compression=codec,  # type: ignore[arg-type]
                compression_level=self._level if codec in ("zstd", "gzip", "brotli") else None,
                statistics=True,
                arrow_schema=self._arrow_schema,
            )
        except pl.exceptions.PolarsError:
            # polars refused the schema (a nested type it maps differently): use pyarrow.
            buffer = io.BytesIO()
            pq.write_table(
                conform(frame, self._schema).cast(self._arrow_schema),
                buffer,
                compression=codec,
                compression_level=self._level,
            )
        data = buffer.getvalue()
        stats = self._statistics(data)
        partition = (
            record if record is not None else stats.partition(self.metadata.spec(), self._schema)
        )
        path = self._put(data)
        serialized = stats.to_serialized_dict()
        serialized["nan_value_counts"] = self._nan_counts(frame)
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
