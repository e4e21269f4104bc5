"""Where a merge puts the rows of the files it rewrites: written out as data files as they come,
so a copy-on-write merge over many files holds a bounded amount of rewritten rows in memory.

Rows are buffered until `flush_bytes` (in memory) are reached, then written sorted by the
dataset's sort columns through the write's `DataFileWriter` (files near the table's target size,
one partition per file). What is still buffered at the end is handed back (`rest`): the merge
writes it together with its inserts as one sorted frame, so a small write still adds one file.
Files written here belong to no snapshot until the write commits them; the write deletes them if
it does not commit.
"""

from __future__ import annotations

import polars as pl
from pyiceberg.manifest import DataFile

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.snapshot.data_files import DataFileWriter
from pipeline_output.stores.iceberg.write.frame_rows import sorted_for_write

FLUSH_BYTES = 128 * 1024 * 1024


class RewriteSink:
    """Buffers rewritten rows and writes them as data files past `flush_bytes`."""

    def __init__(
        self,
        writer: DataFileWriter | None,
        spec: DatasetSpec,
        *,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self.writer = writer
        self.spec = spec
        self.flush_bytes = flush_bytes
        self.files: list[DataFile] = []
        self._buffer: list[pl.DataFrame] = []
        self._size = 0

    def add(self, frame: pl.DataFrame) -> None:
        """Take the rows of one rewritten file (in the table's columns)."""
        if frame.height == 0:
            return
        self._buffer.append(frame)
        self._size += int(frame.estimated_size())
        if self.writer is not None and self._size >= self.flush_bytes:
            self._flush()

    def rest_height(self) -> int:
        """Rows buffered and not written yet."""
        return sum(f.height for f in self._buffer)

    def rest(self) -> list[pl.DataFrame]:
        """The buffered rows not written yet (the buffer is emptied)."""
        rest, self._buffer, self._size = self._buffer, [], 0
        return rest

    def _flush(self) -> None:
        assert self.writer is not None
        frame = pl.concat(self.rest(), how="vertical", rechunk=True)
        self.files.extend(self.writer.write(sorted_for_write(frame, self.spec)))


def coalesced(frames: list[pl.DataFrame], spec: DatasetSpec) -> list[pl.DataFrame]:
    """The rewritten files' contents and the new rows as ONE frame sorted by the key: the writer
    cuts it into files near the table's target size (and one per partition), so an upsert that
    rewrites k files adds about max(1, touched bytes / target) files instead of k + 1, and a
    table fed by small upserts does not gain a file per write."""
    kept = [f for f in frames if f.height]
    if len(kept) <= 1:
        return kept
    # rechunked: a frame of many chunks is written as as many row groups, and a file rewritten
    # by every small upsert would gain a row group per write
    return [sorted_for_write(pl.concat(kept, how="vertical", rechunk=True), spec)]
