"""The commit of a native write, under the table's writer lock: the first write of a missing
table (`create_table`: the table and its first snapshot in one commit), and a write to an existing
one (`write_existing`: schema and partition-spec evolution, the file-level merge of the plan's write
mode, then one commit — none when nothing changes).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import polars as pl
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.contract.plan import WritePlan
from pipeline_output.contract.result import RowCounts, WriteResult
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import EmptyComputeRefused, WriteConflict
from pipeline_output.stores.iceberg.snapshot.commit import CommitRequest, commit, delete_quietly
from pipeline_output.stores.iceberg.snapshot.data_files import DataFileWriter
from pipeline_output.stores.iceberg.snapshot.manifests import (
    FlatTransaction,
    read_index,
    upgrade_properties,
)
from pipeline_output.stores.iceberg.snapshot.summary import row_properties
from pipeline_output.stores.iceberg.table.freshness import total_records
from pipeline_output.stores.iceberg.table.partitions import evolve as evolve_partitioning
from pipeline_output.stores.iceberg.table.refs import head, stage_branch
from pipeline_output.stores.iceberg.table.tables import IcebergTables
from pipeline_output.stores.iceberg.write.frame_rows import (
    align_to_schema,
    apply_evolution,
    sorted_for_write,
)
from pipeline_output.stores.iceberg.write.merge import FileMerge
from pipeline_output.stores.iceberg.write.prepare import Prewritten
from pipeline_output.stores.schema import check_required, plan_evolution


def create_table(
    tables: IcebergTables,
    spec: DatasetSpec,
    plan: WritePlan,
    frame: pl.DataFrame,
    props: dict[str, str],
    *,
    fence: Callable[[], None] | None = None,
) -> WriteResult:
    """First deploy of a missing table: create it and write its first snapshot in one commit."""
    tx = tables.create_transaction(spec, frame)
    data = sorted_for_write(frame, spec)
    props = {**props, **row_properties(RowCounts(inserted=frame.height))}
    try:
        table = commit(
            CommitRequest(
                tx=tx, dataset=spec.name, properties=props, frames=[data], force=True, fence=fence
            )
        )
    except TableAlreadyExistsError as exc:
        raise WriteConflict(
            f"dataset {spec.name!r}: {tables.table_name(spec)} was created by another writer "
            "after this write was planned; nothing was committed — run it again"
        ) from exc
    snapshot = table.current_snapshot()
    return WriteResult.of(
        plan,
        RowCounts(inserted=frame.height),
        rows_in=frame.height,
        total_before=0,
        arm="iceberg",
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        files_added=1 if frame.height else 0,
    )


def write_existing(
    spec: DatasetSpec,
    plan: WritePlan,
    table: Table,
    frame: pl.DataFrame,
    props: dict[str, str],
    *,
    pre: Prewritten | None = None,
    fence: Callable[[], None] | None = None,
    branch: str = MAIN_BRANCH,
) -> WriteResult:
    tx = FlatTransaction(table)
    if branch != MAIN_BRANCH:
        stage_branch(tx, branch)
    upgrade_properties(tx)
    evolution = plan_evolution(spec, table.schema(), frame)
    apply_evolution(tx, evolution)
    repartitioned = evolve_partitioning(tx, spec)  # new files by the new spec, old kept
    schema = tx.table_metadata.schema()
    check_required(spec, frame, schema)  # the table as it is under the lock
    if pre is not None and evolution.empty and not repartitioned:
        frame = pre.frame  # already aligned and sorted, and its files are written
    else:
        pre = None
        frame = sorted_for_write(align_to_schema(frame, schema), spec)
    total_before = total_records(table)
    index = read_index(table)
    # rows the merge rewrites go to data files as they come (deleted again unless committed)
    rewrites = DataFileWriter(tx.table_metadata, table.io, write_id=uuid.uuid4())
    try:
        merge = FileMerge(
            table=table,
            tx=tx,
            spec=spec,
            frame=frame,
            schema=schema,
            index=index,
            writer=rewrites,
        )
        changes = merge.run(plan)
        if frame.height == 0 and changes.deleted and not spec.allow_empty:
            raise EmptyComputeRefused(
                f"dataset {spec.name!r}: the compute returned no rows and a "
                f"{plan.write_mode} would delete {changes.deleted} target row(s); set "
                "allow_empty=True to allow it (nothing was written)"
            )
    except BaseException:
        for path in rewrites.written:
            delete_quietly(table.io, path)
        raise
    force = plan.first_deploy
    snapshot_id: int | None = None
    props = {**props, **row_properties(changes)}
    if not changes.noop or force:
        frames, ready = changes.new_frames, list(changes.written)
        if pre is not None and frames and frames[0] is frame:
            # the merge writes the computed frame as it is: its files are the pre-written ones
            frames, ready = frames[1:], [*pre.files, *ready]
            pre.handed_to_commit = True
        new_table = commit(
            CommitRequest(
                tx=tx,
                dataset=spec.name,
                properties=props,
                frames=frames,
                ready=ready,
                deleted=changes.deleted_files,
                positional=changes.positional,
                force=force,
                blind_retry=plan.write_mode == "append" and not changes.deleted_files,
                fence=fence,
                index=index,
                branch=branch,
            )
        )
        snapshot_id = head(new_table, branch)
    elif not evolution.empty:
        if fence is not None:
            fence()
        from pyiceberg.exceptions import CommitFailedException

        try:
            tx.commit_transaction()  # a schema-only change: no snapshot
        except CommitFailedException as exc:
            raise WriteConflict(
                f"dataset {spec.name!r}: the table's schema changed after this write was "
                f"planned ({exc}); nothing was committed — run it again"
            ) from exc
    return WriteResult.of(
        plan,
        changes,
        rows_in=frame.height,
        total_before=total_before,
        arm="iceberg",
        snapshot_id=snapshot_id,
        files_rewritten=sum(1 for f in changes.deleted_files if f.content == DataFileContent.DATA),
        files_added=len(changes.written) + sum(1 for f in changes.new_frames if f.height),
        files_merged_on_read=len(changes.positional),
    )
