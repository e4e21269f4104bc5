"""The single commit of a native write (with its conflict checks), streaming batches to data
files, deleting files quietly, and the test-only fault injection points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import polars as pl
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _SnapshotProducer

from pipeline_output.contract.checked_input import check_keys, to_polars
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import (
    BadInput,
    WriteConflict,
)
from pipeline_output.infra.faults import fault_injection
from pipeline_output.stores.iceberg.snapshot.data_files import DataFileWriter
from pipeline_output.stores.iceberg.snapshot.delete_files import DeleteFileWriter
from pipeline_output.stores.iceberg.snapshot.indexed_overwrite import IndexedOverwrite
from pipeline_output.stores.iceberg.snapshot.inflight import verify_written
from pipeline_output.stores.iceberg.snapshot.manifest_specs import MergeAppend
from pipeline_output.stores.iceberg.snapshot.manifests import ManifestIndex
from pipeline_output.stores.iceberg.write.frame_rows import align_to_schema
from pipeline_output.stores.schema import check_required


@dataclass(frozen=True)
class CommitRequest:
    """One native snapshot to commit (`commit`): what it adds and removes, and how it is fenced."""

    tx: Transaction  # the write's transaction (schema and spec changes already staged on it)
    dataset: str
    properties: Mapping[str, str]  # the snapshot summary's `pipeline-output.*` properties
    frames: Sequence[pl.DataFrame] = ()  # rows the commit writes to new data files
    ready: Sequence[DataFile] = ()  # data files already written (pre-written, merge rewrites)
    deleted: Sequence[DataFile] = ()  # data files (and their delete files) the snapshot removes
    positional: Sequence[tuple[DataFile, pl.Series]] = ()  # merge-on-read: positions deleted
    force: bool = False  # an overwrite snapshot even when it adds and removes nothing
    blind_retry: bool = False  # plain appends: pyiceberg may retry them on a new head
    fence: Callable[[], None] | None = None  # the writer lock's `verify`, right before the swap
    index: ManifestIndex | None = None  # the manifests the write was planned from
    branch: str = MAIN_BRANCH  # the ref committed to (an audited write: its run's branch)


def commit(request: CommitRequest) -> Table:
    """Write the request's `frames` as data files and commit them and the `ready` (already
    written) files with `deleted` removed: exactly one snapshot.

    The commit is fenced to the snapshot the write was planned against: the snapshot producer
    asserts the branch head it started from, and unless `blind_retry` is set (plain appends, whose
    rows do not depend on the table's state) a concurrent commit is NOT retried on top of the new
    head — pyiceberg's retry re-applies a fast append without re-checking keys, which duplicated
    keys when a writer outside the lock committed in between. The commit then fails as
    `WriteConflict` and nothing is committed. `fence` (the writer lock's `verify`) runs right
    before the catalog swap: a writer whose lock ended fails with `LockLost`; then every file the
    snapshot adds must still exist (`inflight.verify_written`), else `FilesRemoved`.

    `index` (the manifests the write was planned from) spares the producer re-reading every
    manifest; manifests are merged on commit as the table's properties say (`manifest_merge.py`).
    `positional` (merge-on-read) pairs a kept data file with every position it no longer holds:
    one file-scoped delete file each, written here and committed in the same snapshot. `branch`
    is the ref the snapshot is committed to (an audited write: its run's branch).
    """
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    tx, dataset, props = request.tx, request.dataset, dict(request.properties)
    deleted, frames, ready, positional = (
        request.deleted,
        request.frames,
        request.ready,
        request.positional,
    )
    index, branch, fence = request.index, request.branch, request.fence
    producer: _SnapshotProducer[Any]
    if deleted or request.force or positional:
        producer = IndexedOverwrite(
            tx, tx._table.io, index=index, snapshot_properties=props, branch=branch
        )
    else:  # an append: pyiceberg's merge-append honours the same manifest-merge properties
        producer = MergeAppend(
            operation=Operation.APPEND,
            transaction=tx,
            io=tx._table.io,
            branch=branch,
            snapshot_properties=props,
        )
    for data_file in ready:
        producer.append_data_file(data_file)
    writer = DataFileWriter(tx.table_metadata, tx._table.io, write_id=producer.commit_uuid)
    deletes = DeleteFileWriter(tx.table_metadata, tx._table.io, write_id=producer.commit_uuid)
    try:
        for frame in frames:
            for data_file in writer.write(frame):
                producer.append_data_file(data_file)
        for delete_file in deletes.write_many(positional):
            producer.append_data_file(delete_file)
    except BaseException:
        for path in [*writer.written, *deletes.written]:
            delete_quietly(tx._table.io, path)
        raise
    for data_file in deleted:
        producer.delete_data_file(data_file)
    fault_injection("before_commit")
    try:
        if request.blind_retry:
            producer.commit()  # registers the producer: pyiceberg rebuilds it on a new head
        else:
            tx._apply(*producer._commit())  # staged without retry registration: fenced
        fault_injection("in_commit")  # manifests and manifest list written too
        if fence is not None:
            fence()
        verify_written(  # none of its files removed meanwhile (`inflight.py`)
            tx._table.io,
            producer,
            [*writer.written, *deletes.written, *(f.file_path for f in ready)],
            dataset=dataset,
        )
        return tx.commit_transaction()
    except (CommitFailedException, ValidationException, WriteConflict) as exc:
        # certain: the catalog did not swap, so the files written for this commit are garbage
        with suppress(Exception):
            producer._clean_all_uncommitted()
        for path in [*writer.written, *deletes.written, *(f.file_path for f in ready)]:
            delete_quietly(tx._table.io, path)
        if isinstance(exc, WriteConflict):
            raise
        raise WriteConflict(
            f"dataset {dataset!r}: the table changed after this write was planned "
            f"({type(exc).__name__}: {exc}); nothing was committed — run it again"
        ) from exc


def stream_batches(
    spec: DatasetSpec,
    first: pl.DataFrame,
    rest: Iterator[pl.DataFrame],
    writer: DataFileWriter,
    schema: Schema,
    *,
    sink: list[DataFile],
) -> int:
    """Check, align and write `first` and then every batch of `rest`; the files go to `sink`.

    Returns the rows written. Every batch must have the first batch's columns.
    """
    rows = 0
    columns = first.columns
    batch: pl.DataFrame | None = first
    while batch is not None:
        if batch.columns != columns:
            raise BadInput(
                f"dataset {spec.name!r}: batch columns {batch.columns} differ from the first "
                f"batch's {columns}; nothing was written"
            )
        batch = check_keys(spec, to_polars(spec, batch))
        check_required(spec, batch, schema)
        batch = align_to_schema(batch, schema)
        sink.extend(writer.write(batch))
        rows += batch.height
        batch = next(rest, None)
    return rows


def delete_quietly(file_io: FileIO, path: str) -> None:
    """Delete a data file nobody references (best effort: doctor lists what is left)."""
    with suppress(OSError, ValueError):
        file_io.delete(path)
