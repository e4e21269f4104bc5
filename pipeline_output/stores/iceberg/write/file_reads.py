"""Reading the data files a merge works on: one file at a time, deletes applied, positions kept,
with a bounded number of files in flight.

Owns `FileReader`: each candidate file is read whole (or only some columns) with the rows its
positional delete files remove filtered out, and every row keeps its physical position in the file
(`properties.FILEPOS_COLUMN`), which a merge-on-read write needs to delete it. `stream` yields the files
in order while at most `in_flight` are read ahead, so a merge over many files holds a bounded
number of them in memory (peak memory follows the largest file, not the number of files).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import polars as pl
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table

from pipeline_output.contract.checked_input import from_arrow
from pipeline_output.stores.iceberg.snapshot.delete_files import deleted_positions
from pipeline_output.stores.iceberg.table.properties import FILEPOS_COLUMN, READ_THREADS
from pipeline_output.stores.iceberg.write.frame_rows import align_to_schema, read_local


class FileReader:
    """Reads data files of `table` aligned to `schema` (the schema the write works in)."""

    def __init__(self, table: Table, schema: Schema, *, in_flight: int = READ_THREADS) -> None:
        self.table = table
        self.schema = schema
        self.in_flight = max(1, in_flight)

    def read(self, task: FileScanTask, *, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The file's live rows (`columns` only, if given) and their positions (`FILEPOS_COLUMN`)."""
        read_schema = self.table.schema()
        if columns is not None:
            read_schema = read_schema.select(*columns)
        bare = FileScanTask(task.file)  # every row, in file order: positions are physical
        frame = read_local(bare, read_schema)
        if frame is None:
            scan = ArrowScan(self.table.metadata, self.table.io, read_schema, AlwaysTrue())
            frame = from_arrow(scan.to_table([bare]))
        frame = align_to_schema(frame, self.schema, only=columns).with_row_index(FILEPOS_COLUMN)
        frame = frame.with_columns(pl.col(FILEPOS_COLUMN).cast(pl.Int64))
        if task.delete_files:
            gone = deleted_positions(self.table.io, task)
            if gone.len():
                frame = frame.filter(~pl.col(FILEPOS_COLUMN).is_in(gone.implode()))
        return frame

    def stream(
        self, tasks: Sequence[FileScanTask], *, columns: Sequence[str] | None = None
    ) -> Iterator[tuple[FileScanTask, pl.DataFrame]]:
        """`(task, frame)` for every task, in order, at most `in_flight` files read ahead."""
        if not tasks:
            return
        if len(tasks) == 1:
            yield tasks[0], self.read(tasks[0], columns=columns)
            return
        workers = min(self.in_flight, len(tasks))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[tuple[FileScanTask, Future[pl.DataFrame]]] = deque()
            queued = iter(tasks)

            def top_up() -> None:
                while len(pending) < workers:
                    task = next(queued, None)
                    if task is None:
                        return
                    pending.append((task, pool.submit(self.read, task, columns=columns)))

            top_up()
            while pending:
                task, future = pending.popleft()
                frame = future.result()
                top_up()
                yield task, frame
