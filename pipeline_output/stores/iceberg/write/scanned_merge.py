"""An upsert or sync applied from one vectorised scan of its candidate files (`key_scan`).

Owns `apply_scanned`: with every candidate file's matched, changed and absent rows known from
`key_scan.scan_candidates`, each file that changes is kept with a positional delete file of its
changed and absent rows (merge-on-read) or rewritten without them (copy-on-write), as the merge's
`MergePolicy` decides per file; the rewritten files are read as one scan per chunk of files (not
one collect per file). Changed rows' new versions, and the compute's new keys, are the compute's
own rows: they are written once, with the rewritten rows, as the write's new data. The counts and
the refusal of keys matching two target rows are the file-by-file merge's (`merge.FileMerge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import polars as pl
from pyiceberg.table import FileScanTask, Table

from pipeline_output.contract.checked_input import refuse_duplicate_matches
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.write.key_scan import CandidateRows, FileRows, G, L
from pipeline_output.stores.iceberg.write.merge_policy import FIXED_BYTES, MergePolicy
from pipeline_output.stores.iceberg.write.prepare import MergeChanges
from pipeline_output.stores.iceberg.write.rewritten_rows import RewriteSink


class FileMerge(Protocol):
    """What this module needs of the merge it completes (`merge.FileMerge`)."""

    spec: DatasetSpec
    frame: pl.DataFrame
    table: Table

    @property
    def sink(self) -> RewriteSink: ...

    def absorb_small_file(
        self, changes: MergeChanges, tasks: Sequence[FileScanTask], touched: set[int]
    ) -> None: ...

    def finish(self, changes: MergeChanges, new_rows: list[pl.DataFrame]) -> MergeChanges: ...


CHUNK_BYTES = 64 * 1024 * 1024  # stored bytes of the rewritten files read by one scan


def apply_scanned(
    merge: FileMerge,
    changes: MergeChanges,
    scanned: CandidateRows,
    policy: MergePolicy,
    tasks: Sequence[FileScanTask],
) -> MergeChanges:
    """`changes` completed from `scanned` (the candidates of `tasks`, the files planned)."""
    spec, frame = merge.spec, merge.frame
    pk = list(spec.primary_key)
    relevant = [r for r in scanned.files if r.matched or r.absent.len()]
    changes.preserved += sum(r.live for r in scanned.files if not (r.matched or r.absent.len()))
    policy = policy.within_budget(
        sum(r.task.file.file_size_in_bytes for r in relevant),
        keep_bytes=sum(_keep_bytes(r) for r in relevant),
    )
    settled = scanned.unchanged_keys  # matched keys whose compute row is NOT written
    rewritten: list[FileRows] = []
    touched: set[int] = set()
    merged_on_read = False
    for rows in relevant:
        n_changed, n_absent = rows.changed.len(), rows.absent.len()
        changes.unchanged += rows.matched - n_changed
        changes.preserved += rows.live - rows.matched - n_absent
        if n_changed == 0 and n_absent == 0:
            continue
        touched.add(id(rows.task))
        changes.updated += n_changed
        changes.deleted += n_absent
        file_rows = int(rows.task.file.record_count)
        if policy.merge_on_read(
            file_rows=file_rows,
            deleted_before=file_rows - rows.live,
            deleting=n_changed + n_absent,
        ):
            gone = pl.concat([rows.changed, rows.absent])
            changes.delete_positions(merge.table.io, rows.task, gone, earlier=rows.own_deleted)
            merged_on_read = True
        else:
            rewritten.append(rows)
    for chunk in _chunks(rewritten):
        _rewrite(merge, changes, scanned, chunk)

    refuse_duplicate_matches(spec, scanned.matched_keys)  # before anything is committed
    changes.inserted = frame.height - scanned.matched_keys.height
    new_rows = frame
    if settled.height:
        new_rows = frame.join(settled, on=pk, how="anti", nulls_equal=True, maintain_order="left")
    if merged_on_read and not merge.sink.rest_height():
        merge.absorb_small_file(changes, tasks, touched)
    return merge.finish(changes, [new_rows])


def _keep_bytes(rows: FileRows) -> int:
    """What keeping a file with a delete file costs, in bytes of rewriting (`merge_policy`)."""
    size, count = rows.task.file.file_size_in_bytes, max(1, int(rows.task.file.record_count))
    return FIXED_BYTES + (rows.changed.len() + rows.absent.len()) * size // count


def _chunks(files: list[FileRows]) -> list[list[FileRows]]:
    out: list[list[FileRows]] = []
    size = CHUNK_BYTES
    for rows in files:
        if size + rows.task.file.file_size_in_bytes > CHUNK_BYTES:
            out.append([])
            size = 0
        out[-1].append(rows)
        size += rows.task.file.file_size_in_bytes
    return out


def _rewrite(
    merge: FileMerge, changes: MergeChanges, scanned: CandidateRows, files_: list[FileRows]
) -> None:
    """Copy-on-write for `files`: their live rows but the changed and absent ones, read as one
    scan, go to the write's rewritten rows; the files go (with their own delete files)."""
    reader = scanned.reader
    files = [r.index for r in files_]
    drop = pl.Series(
        G,
        [
            reader.offsets[r.index] + p
            for r in files_
            for s in (r.deleted, r.changed, r.absent)
            for p in s.to_list()
        ],
        dtype=pl.Int64,
    )
    content = reader.scan(files, list(reader.target))
    if drop.len():
        gone = drop.to_frame().select(reader.local(files, pl.col(G)).alias(L))
        content = content.filter(~pl.col(L).is_in(gone.get_column(L).implode()))
    for rows in files_:
        changes.deleted_files.append(rows.task.file)
    merge.sink.add(content.drop(L).collect())
