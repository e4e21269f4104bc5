"""Positional delete files of the native arm (merge-on-read).

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

import io
import uuid
from collections.abc import Iterable

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    _read_deletes,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.delete_file_index import _referenced_data_file_path
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import LongType, NestedField, StringType

from pipeline_output.stores.iceberg.snapshot.data_files import TableFileWriter

PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
_ARROW_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": "2147483546"}
        ),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": "2147483545"}),
    ]
)
# the spec's schema (pyiceberg 0.12's POSITIONAL_DELETE_SCHEMA types `pos` as int, not long)
_SCHEMA = Schema(
    NestedField(PATH_FIELD_ID, "file_path", StringType(), required=True),
    NestedField(POS_FIELD_ID, "pos", LongType(), required=True),
)
_EMPTY = pl.Series("pos", [], dtype=pl.Int64)


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
        pos = positions if isinstance(positions, pl.Series) else pl.Series("pos", list(positions))
        pos = pos.cast(pl.Int64).unique().sort()
        path = data_file.file_path
        table = pa.table(
            {"file_path": pa.array([path] * len(pos), pa.string()), "pos": pos.to_arrow()},
            schema=_ARROW_SCHEMA,
        )
        buffer = io.BytesIO()
        codec = self._codec if self._codec in ("zstd", "snappy", "gzip", "lz4") else "zstd"
        pq.write_table(table, buffer, compression=codec, compression_level=self._level)
        data = buffer.getvalue()
        stats = self._statistics(data)
        serialized = stats.to_serialized_dict()
        # the whole path as both bounds (metrics truncate strings): readers associate the file
        # with exactly this data file
        for bounds in ("lower_bounds", "upper_bounds"):
            serialized[bounds] = {**(serialized.get(bounds) or {}), PATH_FIELD_ID: path.encode()}
        location = self._put(data, suffix="-deletes")
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=location,
            file_format=FileFormat.PARQUET,
            partition=data_file.partition,
            file_size_in_bytes=len(data),
            sort_order_id=None,
            spec_id=data_file.spec_id,
            equality_ids=None,
            key_metadata=None,
            **serialized,
        )
        delete_file.spec_id = data_file.spec_id  # (from_args does not set it)
        return delete_file
