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
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
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
WRITE_THREADS = 4


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
        """One delete file removing `positions` (distinct, any order) of `data_file`.

        Its statistics are known without reading the file back: every row names `data_file`
        (the whole path is both bounds: readers associate the file with exactly that data
        file), no value is null, the positions' bounds are their first and last."""
        pos = positions if isinstance(positions, pl.Series) else pl.Series("pos", list(positions))
        pos = pos.cast(pl.Int64).unique().sort()
        path = data_file.file_path
        table = pa.table(
            {"file_path": pa.array([path] * len(pos), pa.string()), "pos": pos.to_arrow()},
            schema=_ARROW_SCHEMA,
        )
        buffer = io.BytesIO()
        codec = self._codec if self._codec in ("zstd", "snappy", "gzip", "lz4") else "zstd"
        footers: list[pq.FileMetaData] = []
        pq.write_table(
            table,
            buffer,
            compression=codec,
            compression_level=self._level,
            metadata_collector=footers,
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
        n = len(pos)
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

    def write_many(self, files: Sequence[tuple[DataFile, pl.Series]]) -> list[DataFile]:
        """`write` for each (data file, positions), a few at a time (pyarrow writes and the
        FileIO's puts release the GIL), in order."""
        if len(files) < 2:
            return [self.write(f, p) for f, p in files]
        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(files))) as pool:
            return list(pool.map(lambda pair: self.write(*pair), files))


def _pos_bound(pos: pl.Series, at: int) -> dict[int, bytes]:
    return {POS_FIELD_ID: to_bytes(LongType(), int(pos[at]))} if pos.len() else {}
