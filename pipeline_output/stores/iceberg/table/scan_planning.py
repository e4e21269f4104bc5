"""Scan planning with the manifests decoded by fastavro: the table polars' native scan plans with.

polars' Iceberg scan (`native_scan`) plans the files of a read with pyiceberg: `table.scan(...)`
then `plan_files()`, which decodes the manifest list and every manifest with pyiceberg's
pure-Python Avro reader (a header schema conversion and a reader resolution per file, then each
record field by field, in a thread pool). That was about a third of a selective read of a
50-file table.

`planned(table)` is the same table (same metadata, FileIO, catalog, identifier) whose `scan()`
returns a `FastDataScan`: pyiceberg's `DataScan` reading the manifest list and the manifests'
entries with fastavro's C reader (`manifest_decoding`), in the calling thread for a local
warehouse (in parallel on an object store). All the planning itself is pyiceberg's, unchanged:
manifests pruned by their partition summaries, entries by the partition and metrics evaluators,
delete files matched to data files by `DeleteFileIndex` (sequence numbers, partitions,
file-scoped bounds), residuals (`pipeline_output_tests/stores/test_engine_interop.py` compares
the plans file for file on every kind of table this project writes).

A scan planned after expiry removed its snapshot (a lazy read pinned to it, collected later)
fails reading the snapshot's manifest list: `SnapshotExpired`, naming the dataset and snapshot.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from functools import cached_property
from typing import Any, ClassVar, Self, TypeVar

from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table import DataScan, FileScanTask, ManifestGroupPlanner, Table
from pyiceberg.utils.concurrent import ExecutorFactory

from pipeline_output.stores.iceberg.table.manifest_decoding import (
    manifest_entries,
    manifest_files,
)
from pipeline_output.stores.iceberg.table.snapshot_log import pinned_snapshot_gone

_LOCAL = ("file:", "/")
T = TypeVar("T")


def planned(table: Table, *, dataset: str | None = None) -> Table:
    """`table` whose scans plan with fastavro-decoded manifests (`FastDataScan`); a scan whose
    planning fails because expiry removed its snapshot since `table` was loaded raises
    `SnapshotExpired` naming `dataset` (default: the table's name) and the snapshot."""
    out = table_as(table, PlannedTable)
    out.dataset = dataset or ".".join(table.name())
    return out


TableT = TypeVar("TableT", bound=Table)


def table_as(table: Table, cls: type[TableT]) -> TableT:
    """The loaded `table` (same metadata, IO and catalog) as an instance of `cls`, a subclass of
    pyiceberg's `Table` that plans its scans its own way."""
    return cls(
        identifier=table.name(),
        metadata=table.metadata,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
        config=table.config,
    )


def built_from(source: object, cls: type[T]) -> T:
    """A `cls` whose constructor arguments are `source`'s attributes of the same names (pyiceberg
    keeps a scan's constructor arguments as attributes: its own `TableScan.update` relies on it)."""
    params = inspect.signature(cls.__init__).parameters.keys() - {"self"}
    return cls(**{name: getattr(source, name) for name in params})


class PlannedTable(Table):
    """A loaded table whose `scan()` is a `FastDataScan` (everything else is `Table`'s)."""

    dataset: str = ""

    def scan(self, *args: Any, **kwargs: Any) -> DataScan:
        return FastDataScan.of(super().scan(*args, **kwargs), table=self)


class CarryingScan(DataScan):
    """pyiceberg's `DataScan` with attributes of ours (`carried`) that are not its constructor
    arguments: `of` sets them on a copy of pyiceberg's scan, `update` (`filter`, `select`, ...)
    carries them over."""

    carried: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, scan: DataScan, **values: Any) -> Self:
        """`scan` (its constructor arguments are its attributes, as pyiceberg's `update` relies
        on) as a `cls`, with the `carried` attributes `values`."""
        out = built_from(scan, cls)
        for name in cls.carried:
            setattr(out, name, values[name])
        return out

    def update(self, **overrides: Any) -> Self:
        out = super().update(**overrides)
        for name in self.carried:
            setattr(out, name, getattr(self, name))
        return out


class FastDataScan(CarryingScan):
    """pyiceberg's `DataScan` planned by `FastPlanner` (the manifests decoded by fastavro).

    `table`: the `PlannedTable` it scans, asked again when planning fails."""

    carried = ("table",)
    table: PlannedTable | None = None

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

    def _plan_files_local(self) -> Iterable[FileScanTask]:
        """pyiceberg's local planning, the manifest list read by `manifest_files`."""
        snapshot = self.snapshot()
        if not snapshot:
            return []
        return self._manifest_planner.plan_files(manifest_files(self.io, snapshot))

    @cached_property
    def _manifest_planner(self) -> ManifestGroupPlanner:
        return built_from(self, FastPlanner)


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


class FixedTable(Table):
    """A loaded table whose scans plan exactly the given files (with their delete files), so
    polars' native scan (`pl.scan_iceberg`, planning through the table's own `scan`) reads just
    them with its own field-id mapping, defaults and positional deletes: a compaction bin, the
    files a change feed diffs."""

    tasks: tuple[FileScanTask, ...] = ()

    @classmethod
    def of(cls, table: Table, tasks: tuple[FileScanTask, ...]) -> FixedTable:
        out = table_as(table, cls)
        out.tasks = _as_paths(tasks)
        return out

    def scan(self, *args: Any, **kwargs: Any) -> DataScan:
        return FixedScan.of(super().scan(*args, **kwargs), tasks=self.tasks)


def _as_paths(tasks: tuple[FileScanTask, ...]) -> tuple[FileScanTask, ...]:
    """`tasks` with local data files named by their path instead of their `file://` URI: polars
    reads URIs through its object-store layer, which made reading 20,000 small files a third
    slower. Only when no task has delete files: pyiceberg's reader (polars' fallback) matches
    positional deletes to a data file by the path the delete file holds."""
    if any(t.delete_files for t in tasks) or not all(
        t.file.file_path.startswith("file:///") for t in tasks
    ):
        return tasks
    out = []
    for task in tasks:
        source = task.file
        local = DataFile(*(source[i] for i in range(len(source))))
        local.spec_id = source.spec_id
        local[1] = task.file.file_path.removeprefix("file://")  # (field 1: file_path)
        out.append(FileScanTask(local, residual=task.residual))
    return tuple(out)


class FixedScan(CarryingScan):
    """pyiceberg's `DataScan` whose plan is a fixed list of scan tasks."""

    carried = ("tasks",)
    tasks: tuple[FileScanTask, ...] = ()

    def plan_files(self) -> Iterable[FileScanTask]:
        return list(self.tasks)
