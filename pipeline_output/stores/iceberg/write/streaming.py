"""`replace_streaming` (the model node): every batch streamed to data files before the lock
(registered as a write in flight: `commit.py`), committed as one replace inside it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import polars as pl
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction

from pipeline_output.contract.checked_input import check_keys, to_polars
from pipeline_output.contract.plan import RowCounts, WritePlan, WriteResult, plan_write
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import (
    EmptyComputeRefused,
    WriteConflict,
)
from pipeline_output.infra.locks import LockStats
from pipeline_output.stores.iceberg.snapshot.commit import (
    CommitRequest,
    commit,
    delete_quietly,
    row_properties,
    stream_batches,
    summary_properties,
    writing,
)
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output.stores.iceberg.snapshot.manifests import (
    FlatTransaction,
    ManifestIndex,
    live_data_files,
    read_index,
    upgrade_properties,
)
from pipeline_output.stores.iceberg.table.partitions import evolve as evolve_partitioning
from pipeline_output.stores.iceberg.table.partitions import needs_evolution
from pipeline_output.stores.iceberg.table.tables import (
    PROPERTY_PREFIX,
    state_of,
    total_records,
)
from pipeline_output.stores.iceberg.write.frame_rows import apply_evolution
from pipeline_output.stores.iceberg.write.merge import ICEBERG_CAPABILITIES
from pipeline_output.stores.iceberg.write.prepare import Prewritten
from pipeline_output.stores.schema import plan_evolution

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables


def replace_streaming(
    store: HasTables,
    spec: DatasetSpec,
    batches: Iterable[pl.DataFrame],
    *,
    run_id: str | None = None,
    summary: dict[str, str] | None = None,
    finalize_summary: Callable[[], dict[str, str]] | None = None,
) -> WriteResult:
    """Replace the whole table with `batches`, written to data files as they arrive.

    `finalize_summary` adds `pipeline-output.*` summary properties known only after the last
    batch (e.g. the windows read).

    Memory holds one batch at a time; nothing is visible until the single commit at the end
    (one snapshot). When the table exists and the first batch fits its schema, the batches are
    produced and written before the table's writer lock is taken, and the lock covers only the
    commit. If producing a batch raises, nothing is committed, the table is exactly as it was
    and the files already written are deleted (best effort; `pipeline-output doctor` lists
    any left behind).
    """
    started = time.perf_counter()
    iterator = iter(batches)
    first = next(iterator, None)
    if first is None:
        raise EmptyComputeRefused(
            f"dataset {spec.name!r}: no rows to write; the previous output is kept"
        )
    first = check_keys(spec, to_polars(spec, first))
    ICEBERG_CAPABILITIES.check_frame(spec, first)  # before any I/O (float or nested keys...)
    current = store.tables.load(spec)
    if (
        current is not None
        and plan_evolution(spec, current.schema(), first).empty
        and not needs_evolution(spec, current.metadata)
    ):
        return _replace_streaming_unlocked(
            store,
            spec,
            current,
            first,
            iterator,
            run_id=run_id,
            summary=summary,
            finalize_summary=finalize_summary,
            started=started,
        )
    with store.tables.hold(spec) as stats:
        table = store.tables.load(spec)
        plan = plan_write(replace(spec, strategy="replace"), state_of(table), None)
        props = summary_properties(spec, plan, run_id, summary)
        if table is None:
            tx: Transaction = store.tables.create_transaction(spec, first)
            deleted: list[DataFile] = []
            index: ManifestIndex | None = None
            total_before = 0
        else:
            tx = FlatTransaction(table)
            upgrade_properties(tx)
            apply_evolution(tx, plan_evolution(spec, table.schema(), first))
            evolve_partitioning(tx, spec)
            index = read_index(table)
            deleted = live_data_files(index)
            total_before = total_records(table)
        writer = DataFileWriter(tx.table_metadata, tx._table.io, write_id=uuid.uuid4())
        written: list[DataFile] = []
        try:
            rows = stream_batches(
                spec, first, iterator, writer, tx.table_metadata.schema(), sink=written
            )
        except BaseException:
            for path in writer.written:
                delete_quietly(tx._table.io, path)
            raise
        if finalize_summary is not None:
            props.update({f"{PROPERTY_PREFIX}{k}": v for k, v in finalize_summary().items()})
        props.update(row_properties(RowCounts(inserted=rows, deleted=total_before)))
        snap = _commit_replace(tx, spec, props, written, deleted, index, stats)
    return _replaced(
        store,
        spec,
        plan,
        rows,
        total_before,
        snap,
        len(deleted),
        len(writer.written),
        started,
        stats,
    )


def _replace_streaming_unlocked(
    store: HasTables,
    spec: DatasetSpec,
    current: Table,
    first: pl.DataFrame,
    rest: Iterator[pl.DataFrame],
    *,
    run_id: str | None,
    summary: dict[str, str] | None,
    finalize_summary: Callable[[], dict[str, str]] | None,
    started: float,
) -> WriteResult:
    """`replace_streaming` into an existing table: batches to files first, then lock + commit."""
    pre = Prewritten.of(current, first.head(0), [])
    writer = DataFileWriter(current.metadata, current.io, write_id=uuid.uuid4())
    # a write in flight from its first file until its commit (`commit.py`)
    with writing(store, store.tables.table_name(spec)) as held:
        try:
            try:
                rows = stream_batches(spec, first, rest, writer, current.schema(), sink=pre.files)
            except BaseException:
                for path in writer.written:
                    delete_quietly(current.io, path)
                pre.files = []
                raise
            extra = finalize_summary() if finalize_summary is not None else {}
            with store.tables.hold(spec, on=held) as stats:
                table = store.tables.load(spec)
                if table is None or not pre.fits(table):
                    raise WriteConflict(
                        f"dataset {spec.name!r}: {store.tables.table_name(spec)} was dropped, recreated or "
                        "changed its schema or partitioning while the batches were written; "
                        "nothing was committed — run it again"
                    )
                plan = plan_write(replace(spec, strategy="replace"), state_of(table), None)
                props = summary_properties(spec, plan, run_id, summary)
                props.update({f"{PROPERTY_PREFIX}{k}": v for k, v in extra.items()})
                index = read_index(table)
                deleted = live_data_files(index)
                total_before = total_records(table)
                props.update(row_properties(RowCounts(inserted=rows, deleted=total_before)))
                pre.handed_to_commit = True
                tx = FlatTransaction(table)
                upgrade_properties(tx)
                snap = _commit_replace(tx, spec, props, pre.files, deleted, index, stats)
        finally:
            pre.discard()
    return _replaced(
        store, spec, plan, rows, total_before, snap, len(deleted), len(pre.files), started, stats
    )


def _commit_replace(
    tx: Transaction,
    spec: DatasetSpec,
    props: dict[str, str],
    ready: list[DataFile],
    deleted: list[DataFile],
    index: ManifestIndex | None,
    fence: LockStats,
) -> Any:
    """One snapshot swapping every live data file (`deleted`) for the `ready` files; its
    snapshot."""
    request = CommitRequest(tx=tx, dataset=spec.name, properties=props, force=True, fence=fence)
    return commit(replace(request, ready=ready, deleted=deleted, index=index)).current_snapshot()


def _replaced(
    store: HasTables,
    spec: DatasetSpec,
    plan: WritePlan,
    rows: int,
    total_before: int,
    snap: Any,
    files_rewritten: int,
    files_added: int,
    started: float,
    stats: LockStats,
) -> WriteResult:
    """The result of a streaming replace."""
    return WriteResult.of(
        plan,
        RowCounts(inserted=rows, deleted=total_before),
        rows_in=rows,
        total_before=total_before,
        arm="iceberg",
        snapshot_id=snap.snapshot_id if snap else None,
        files_rewritten=files_rewritten,
        files_added=files_added,
        duration_s=time.perf_counter() - started,
        lock_wait_s=stats.wait_s,
        lock_held_s=stats.held_s,
        table=store.tables.table_name(spec),
    )
