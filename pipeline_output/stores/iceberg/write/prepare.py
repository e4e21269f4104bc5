"""Writes prepared before the lock: data files pre-written against the metadata read then
(`Prewritten`, `PreparedWrite`, registered as a write in flight until `discard()`:
`commit.py`), and the changes a merge computes.
"""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table

from pipeline_output.contract.checked_input import check_in_window
from pipeline_output.contract.plan import RowCounts, TargetState, plan_write
from pipeline_output.contract.slices import PartitionSlice, check_in_partition
from pipeline_output.contract.spec import WRITE_MODES, DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.errors import UnsupportedWrite
from pipeline_output.infra.locks import HeldLock
from pipeline_output.stores.iceberg.snapshot.commit import delete_quietly, writing
from pipeline_output.stores.iceberg.snapshot.files import (
    DataFileWriter,
    deleted_positions,
    own_delete_files,
)
from pipeline_output.stores.iceberg.table.partitions import needs_evolution
from pipeline_output.stores.iceberg.table.tables import state_of
from pipeline_output.stores.iceberg.write.frame_rows import align_to_schema, sorted_for_write
from pipeline_output.stores.schema import check_required, plan_evolution

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables


@dataclass
class MergeChanges(RowCounts):
    """What a merge decided: files to drop, frames to write as new files, and the row counts."""

    deleted_files: list[DataFile] = field(default_factory=list)
    new_frames: list[pl.DataFrame] = field(default_factory=list)
    # merge-on-read: (data file, physical positions it no longer holds: old and new deletes)
    positional: list[tuple[DataFile, pl.Series]] = field(default_factory=list)
    written: list[DataFile] = field(default_factory=list)  # rewritten rows already in files

    @property
    def noop(self) -> bool:
        return (
            not self.deleted_files
            and not self.positional
            and not self.written
            and not any(f.height for f in self.new_frames)
        )

    def delete_positions(
        self,
        io: FileIO,
        task: FileScanTask,
        positions: pl.Series,
        *,
        earlier: pl.Series | None = None,
    ) -> None:
        """Merge-on-read: `task`'s file stays; one delete file of ours holds every position it
        lost — `positions`, and those its own delete files held (`earlier` when already read, read
        through `io` otherwise), which go."""
        own = own_delete_files(task)
        if own:
            if earlier is None:
                earlier = deleted_positions(io, task, files=own)
            positions = pl.concat([earlier.cast(pl.Int64), positions.cast(pl.Int64)])
            self.deleted_files.extend(own)
        self.positional.append((task.file, positions.cast(pl.Int64).unique().sort()))


@dataclass
class Prewritten:
    """Data files of the computed frame, written before the lock against the metadata read then."""

    frame: pl.DataFrame  # the frame as written: aligned to the table schema and sorted
    files: list[DataFile]
    io: FileIO
    table_uuid: str
    location: str
    schema_id: int
    spec_id: int
    handed_to_commit: bool = False

    @classmethod
    def of(cls, table: Table, frame: pl.DataFrame, files: list[DataFile]) -> Prewritten:
        meta = table.metadata
        return cls(
            frame=frame,
            files=files,
            io=table.io,
            table_uuid=str(meta.table_uuid),
            location=meta.location,
            schema_id=meta.current_schema_id,
            spec_id=meta.default_spec_id,
        )

    def fits(self, table: Table) -> bool:
        """Are the files valid for `table` as it is now (same table, schema and partitioning)?"""
        meta = table.metadata
        return (
            str(meta.table_uuid) == self.table_uuid
            and meta.location == self.location
            and meta.current_schema_id == self.schema_id
            and meta.default_spec_id == self.spec_id
        )

    def discard(self) -> None:
        """Delete the files unless a commit was attempted with them (best effort).

        After a commit attempt the outcome may be unknown (an error after the catalog swap), so
        the files are left: `pipeline-output doctor` removes them only if no snapshot has them.
        """
        if self.handed_to_commit:
            return
        for data_file in self.files:
            delete_quietly(self.io, data_file.file_path)
        self.files = []


@dataclass
class PreparedWrite:
    """A checked frame and, when the strategy allows, its data files written ahead of the lock.

    `held`: the write's registration as a write in flight (the table's files lock, shared:
    `commit.writing`), held from before the files are written until `discard()`; the write
    takes the writer lock on its session."""

    spec: DatasetSpec
    window: Window | None
    frame: pl.DataFrame
    pre: Prewritten | None
    held: HeldLock | None = None
    _registration: ExitStack | None = field(default=None, repr=False, compare=False)
    partition: PartitionSlice | None = None

    def fits(
        self, spec: DatasetSpec, window: Window | None, partition: PartitionSlice | None
    ) -> bool:
        """Whether this was prepared for that spec, window and partition."""
        return (self.spec, self.window, self.partition) == (spec, window, partition)

    @property
    def files_ready(self) -> int:
        """How many data files were written ahead."""
        return len(self.pre.files) if self.pre is not None else 0

    def discard(self) -> None:
        """Delete the pre-written files unless a commit was attempted with them, and end the
        registration (after the commit: its files are referenced or garbage by then)."""
        try:
            if self.pre is not None:
                self.pre.discard()
        finally:
            self.held = None
            if self._registration is not None:
                self._registration.close()
                self._registration = None


def prepare_write(
    store: HasTables,
    spec: DatasetSpec,
    frame: pl.DataFrame,
    *,
    window: Window | None,
    partition: PartitionSlice | None = None,
) -> PreparedWrite:
    """`IcebergStore.prepare` of a checked `frame`: register the write (when the table exists:
    its files may be written now, before the lock) and pre-write its files."""
    if partition is not None:
        check_in_partition(spec, frame, partition)
    # against the table as this process's last write left it (no catalog request), else as it
    # is now; the write loads it again under its lock and re-checks the files (`fits`)
    out = PreparedWrite(spec=spec, window=window, frame=frame, pre=None, partition=partition)
    table = store.tables.as_written(spec)
    if table is None and not _may_prewrite(spec, window, partition):
        return out  # no table load for nothing: the write loads it once, under its lock
    table = table or store.tables.load(spec)
    if table is None:  # a first deploy writes its files under the writer lock
        return out
    check_required(spec, frame, table.schema())  # a table made elsewhere may have NOT NULLs
    registration = ExitStack()
    try:
        out.held = registration.enter_context(writing(store, store.tables.table_name(spec)))
        out.pre = prewrite(table, spec, frame, window, partition=partition)
    except BaseException:
        registration.close()
        raise
    out._registration = registration
    return out


def _may_prewrite(
    spec: DatasetSpec, window: Window | None, partition: PartitionSlice | None
) -> bool:
    """Whether a write of `spec` into a table with committed rows writes the computed frame as
    it is (its files then go before the lock); one that merges (an upsert, a sync) does not, so
    a process's first write of it needs no table load before the lock (a table without any
    snapshot is then written under the lock, as a first deploy is)."""
    try:
        plan = plan_write(
            spec, TargetState(exists=True, has_snapshot=True), window, partition=partition
        )
    except UnsupportedWrite:
        return True  # refused or unplanned here: the write decides (and says why) on the table
    mode = WRITE_MODES.get(plan.write_mode)
    return mode is not None and mode.as_given


def prewrite(
    table: Table | None,
    spec: DatasetSpec,
    frame: pl.DataFrame,
    window: Window | None,
    *,
    partition: PartitionSlice | None = None,
) -> Prewritten | None:
    """Write the frame's data files before the lock when the strategy writes it as it is.

    Decided on the table as it is now; re-checked inside the lock (`Prewritten.fits`). Input
    checks that depend on the plan run here too, so bad input still writes nothing.
    """
    if frame.height == 0 or table is None:
        return None
    plan = plan_write(spec, state_of(table), window, partition=partition)
    mode = WRITE_MODES.get(plan.write_mode)
    if mode is None or not mode.as_given:
        return None
    if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
        check_in_window(spec, frame, window)
    if not plan_evolution(spec, table.schema(), frame).empty or needs_evolution(
        spec, table.metadata
    ):
        return None  # the schema or partitioning changes: written in the lock, after evolution
    aligned = sorted_for_write(align_to_schema(frame, table.schema()), spec)
    pre = Prewritten.of(table, aligned, [])
    writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
    try:
        pre.files = writer.write(aligned)
    except BaseException:
        for path in writer.written:
            delete_quietly(table.io, path)
        raise
    return pre
