"""The file-level merges behind replace (of a window or a partition slice), append_new, upsert
and sync: file statistics prune the candidate files, the key columns verify them, and only files
that really change are touched — each either rewritten (copy-on-write) or kept with a positional
delete file and its replaced rows written anew (merge-on-read), as `merge_policy.MergePolicy`
decides per file. Scoped deletes (a delta window, a Dagster partition's slice) are `row_scope`'s.

Upserts, syncs and append_new first try one vectorised pass over every candidate file's keys
(`key_scan.scan_candidates`, applied by `scanned_merge`); where it cannot be proven the same,
candidate files are read one at a time with a bounded number in flight (`file_reads.FileReader`),
and rewritten rows are written out as they come (`rewritten_rows.RewriteSink`), so memory follows
the batch and the largest file, not the number of files a merge touches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl
from pyiceberg.manifest import DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction

from pipeline_output.contract.checked_input import polars_schema, refuse_duplicate_matches
from pipeline_output.contract.plan import SCOPED, WritePlan
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.stores.iceberg.snapshot.data_files import DataFileWriter
from pipeline_output.stores.iceberg.snapshot.delete_files import own_delete_files
from pipeline_output.stores.iceberg.snapshot.manifests import ManifestIndex
from pipeline_output.stores.iceberg.table.freshness import total_records
from pipeline_output.stores.iceberg.table.properties import FILEPOS_COLUMN, NEW_PREFIX, POS_COLUMN
from pipeline_output.stores.iceberg.write.file_reads import FileReader
from pipeline_output.stores.iceberg.write.frame_rows import (
    absent_mask,
    differs,
    replace_rows,
    schema_names,
)
from pipeline_output.stores.iceberg.write.key_scan import scan_candidates
from pipeline_output.stores.iceberg.write.merge_policy import MIN_ROWS, MergePolicy
from pipeline_output.stores.iceberg.write.prepare import MergeChanges
from pipeline_output.stores.iceberg.write.pruning import (
    KeySlices,
    manifest_admission,
    prune_by_keys,
)
from pipeline_output.stores.iceberg.write.rewritten_rows import RewriteSink, coalesced
from pipeline_output.stores.iceberg.write.row_scope import RowScope, row_scope
from pipeline_output.stores.iceberg.write.scanned_merge import apply_scanned

_HIT = "__po_hit__"


@dataclass
class FileMerge:
    """Decides, file by file, what a write mode changes in an existing table."""

    table: Table
    tx: Transaction
    spec: DatasetSpec
    frame: pl.DataFrame
    schema: Schema
    index: ManifestIndex
    # rewritten rows are written to data files through it as they come (None: kept in memory)
    writer: DataFileWriter | None = None
    policy: MergePolicy | None = None  # None: resolved from the spec and the table
    reader: FileReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = FileReader(self.table, self.schema)
        self._sink = RewriteSink(self.writer, self.spec)

    def run(self, plan: WritePlan) -> MergeChanges:
        handlers: dict[str, Callable[[WritePlan], MergeChanges]] = {
            "replace": self._replace,
            "append": self._append,
            "append_new": self._append_new,
            "upsert": self._upsert_or_sync,
            "sync": self._upsert_or_sync,
        }
        return handlers[plan.write_mode](plan)

    def _policy(self, plan: WritePlan) -> MergePolicy:
        if self.policy is None:
            self.policy = MergePolicy.resolve(self.spec, self.tx.table_metadata, plan.write_mode)
        return self.policy

    # -- simple modes

    def _append(self, plan: WritePlan) -> MergeChanges:
        total = total_records(self.table)
        return MergeChanges(new_frames=[self.frame], inserted=self.frame.height, preserved=total)

    def _replace(self, plan: WritePlan) -> MergeChanges:
        tasks = self.index.tasks()
        if plan.delete_scope not in SCOPED:
            deleted = sum(_live_rows(t) for t in tasks)
            return MergeChanges(
                deleted_files=[t.file for t in tasks],
                new_frames=[self.frame],
                inserted=self.frame.height,
                deleted=deleted,
            )
        # Rows inside the window (or the partition's slice) are replaced. For a keyed dataset a
        # computed key that exists outside it (its row moved into it) is replaced too: keys stay
        # unique. Files wholly inside are dropped without being read.
        scope = self._scope(plan)
        policy = self._policy(plan)
        pk = list(self.spec.primary_key)
        by_key = {id(t) for t in self._prune_by_keys(tasks)} if pk else set()
        changes = MergeChanges(new_frames=[self.frame], inserted=self.frame.height)
        straddling: list[FileScanTask] = []
        for task in tasks:
            relation = scope.relation(task)
            if relation == "outside" and id(task) not in by_key:
                changes.preserved += _live_rows(task)
            elif relation == "inside" and not task.delete_files:
                changes.deleted_files.append(task.file)
                changes.deleted += task.file.record_count
            else:
                straddling.append(task)
        keys = self.frame.select(pk).with_columns(pl.lit(True).alias(_HIT)) if pk else None
        policy = policy.within_budget(sum(t.file.file_size_in_bytes for t in straddling))
        for task, rows in self.reader.stream(straddling):
            drop = scope.mask(rows)
            if keys is not None:
                hit = rows.select(pk).join(keys, on=pk, how="left", nulls_equal=True)
                drop = drop | hit.get_column(_HIT).is_not_null()
            n_drop = int(drop.sum())
            if n_drop == 0:
                changes.preserved += rows.height
                continue
            changes.deleted += n_drop
            changes.preserved += rows.height - n_drop
            if policy.merge_on_read(
                file_rows=task.file.record_count,
                deleted_before=task.file.record_count - rows.height,
                deleting=n_drop,
            ):
                changes.delete_positions(
                    self.table.io, task, rows.filter(drop).get_column(FILEPOS_COLUMN)
                )
            else:
                self._rewrite(changes, task, rows.filter(~drop))
        changes.written = self._sink.files
        changes.new_frames = [self.frame, *self._sink.rest()]
        return changes

    def _append_new(self, plan: WritePlan) -> MergeChanges:
        pk = list(self.spec.primary_key)
        candidates = self._prune_by_keys(self._keyed_tasks())
        scanned = scan_candidates(
            self.table, self.schema, self.frame, candidates, pk=pk, absent_in=None, compare=False
        )
        if scanned is not None:  # one vectorised key read (`key_scan`)
            keys = scanned.matched_keys
        else:
            existing = [k.select(pk) for _, k in self.reader.stream(candidates, columns=pk)]
            keys = pl.concat(existing) if existing else self.frame.head(0).select(pk)
        fresh = self.frame.join(keys, on=pk, how="anti", nulls_equal=True)
        skipped = self.frame.height - fresh.height
        if skipped == 0:
            fresh = self.frame  # written as it is (its files may already exist: see _Prewritten)
        total = total_records(self.table)
        return MergeChanges(
            new_frames=[fresh], inserted=fresh.height, skipped=skipped, preserved=total - skipped
        )

    # -- the merge behind upsert and sync

    def _upsert_or_sync(self, plan: WritePlan) -> MergeChanges:
        spec, frame = self.spec, self.frame
        policy = self._policy(plan)
        pk = list(spec.primary_key)
        scope = plan.delete_scope  # none | absent_keys | absent_keys_in_window / _in_slice
        within = self._scope(plan) if scope in SCOPED else None
        if scope == "absent_keys":
            tasks = candidates = self.index.tasks()
        elif within is not None:
            tasks = self.index.tasks()
            by_key = {id(t) for t in self._prune_by_keys(tasks)}
            candidates = [t for t in tasks if id(t) in by_key or within.relation(t) != "outside"]
        else:
            tasks = self._keyed_tasks()
            candidates = self._prune_by_keys(tasks)
        changes = MergeChanges()
        chosen = {id(t) for t in candidates}
        changes.preserved += sum(_live_rows(t) for t in tasks if id(t) not in chosen)
        changes.preserved += self._unread_rows(tasks)
        # one vectorised pass over every candidate (`key_scan`), when provably the same
        absent_in = None if scope == "none" else pl.lit(True)
        if within is not None:  # a sync deletes absent keys inside its window or slice only
            absent_in = within.expr(polars_schema(self.schema.as_arrow()))
        scanned = scan_candidates(
            self.table,
            self.schema,
            frame,
            candidates,
            pk=pk,
            absent_in=absent_in,
            scope_columns=within.columns if within is not None else (),
        )
        if scanned is not None:
            return apply_scanned(self, changes, scanned, policy, tasks)
        # each file is joined only with the compute's rows its key bounds admit
        slices = KeySlices(frame, pk[0], self.table.schema())
        slices.prepare(candidates)

        # Key pass: with several candidates, read only keys (+ watermark) to find files that change.
        if len(candidates) > 1:
            cols = pk + [c for c in (within.columns if within else ()) if c not in pk]
            relevant = []
            for task, keys in self.reader.stream(candidates, columns=cols):
                batch = slices.of(task).select(pk)
                matched = keys.join(batch, on=pk, how="semi", nulls_equal=True).height
                absent = absent_mask(keys, batch, pk, scope=scope, inside=_inside(within, keys))
                if matched or (absent is not None and absent.any()):
                    relevant.append(task)
                else:
                    changes.preserved += keys.height
            candidates = relevant
        policy = policy.within_budget(sum(t.file.file_size_in_bytes for t in candidates))

        matched_keys: list[pl.DataFrame] = []
        # matched keys whose compute row is NOT written as a new row: unchanged, or its new
        # version is in a rewritten file's rows (copy-on-write)
        settled_keys: list[pl.DataFrame] = []
        merged_on_read = False
        touched: set[int] = set()
        value_cols = [c for c in schema_names(self.schema) if c not in pk]
        # the compute's value columns under reserved names: no user column can collide with them
        renamed = {c: NEW_PREFIX + c for c in frame.columns if c not in pk}
        for task, rows in self.reader.stream(candidates):
            rows = rows.with_row_index(POS_COLUMN)
            batch = slices.of(task)
            joined = rows.join(batch.rename(renamed), on=pk, how="inner", nulls_equal=True)
            if joined.height:
                matched_keys.append(joined.select(pk))
            changed = joined.filter(differs(joined, value_cols))
            gone_rows = absent_mask(
                rows, batch.select(pk), pk, scope=scope, inside=_inside(within, rows)
            )
            n_absent = int(gone_rows.sum()) if gone_rows is not None else 0
            if changed.height == 0 and n_absent == 0:
                settled_keys.append(joined.select(pk))
                changes.unchanged += joined.height
                changes.preserved += rows.height - joined.height
                continue
            touched.add(id(task))
            changes.updated += changed.height
            changes.unchanged += joined.height - changed.height
            changes.deleted += n_absent
            changes.preserved += rows.height - joined.height - n_absent
            if policy.merge_on_read(
                file_rows=task.file.record_count,
                deleted_before=task.file.record_count - rows.height,
                deleting=changed.height + n_absent,
            ):
                gone = [changed.get_column(FILEPOS_COLUMN)]
                if gone_rows is not None and n_absent:
                    gone.append(rows.filter(gone_rows).get_column(FILEPOS_COLUMN))
                changes.delete_positions(self.table.io, task, pl.concat(gone))
                merged_on_read = True
                if changed.height < joined.height:  # the changed rows are written anew
                    settled_keys.append(joined.filter(~differs(joined, value_cols)).select(pk))
                continue
            settled_keys.append(joined.select(pk))
            content = replace_rows(rows.drop(FILEPOS_COLUMN), changed, value_cols, pk)
            if gone_rows is not None:
                content = content.filter(~gone_rows)
            self._rewrite(changes, task, content.drop(POS_COLUMN))

        all_matched = pl.concat(matched_keys) if matched_keys else frame.head(0).select(pk)
        refuse_duplicate_matches(spec, all_matched)  # before anything is committed
        changes.inserted = frame.height - all_matched.height
        # inserts, and the new versions of rows deleted by position: one pass, the frame's order
        settled = pl.concat(settled_keys) if settled_keys else None
        new_rows = [
            frame
            if settled is None
            else frame.join(settled, on=pk, how="anti", nulls_equal=True, maintain_order="left")
        ]
        if merged_on_read and not self._sink.rest_height():
            # the new versions of kept files' rows need a file: fold a small one in
            self.absorb_small_file(changes, tasks, touched)
        return self.finish(changes, new_rows)

    def finish(self, changes: MergeChanges, new_rows: list[pl.DataFrame]) -> MergeChanges:
        """`changes` with the rewritten rows' files and the frames the commit writes: the rows
        still buffered and `new_rows`, coalesced."""
        changes.written = self._sink.files
        changes.new_frames = coalesced([*self._sink.rest(), *new_rows], self.spec)
        return changes

    @property
    def sink(self) -> RewriteSink:
        """Where the rows of rewritten files go."""
        return self._sink

    # -- what happens to a file that changes

    def _rewrite(self, changes: MergeChanges, task: FileScanTask, content: pl.DataFrame) -> None:
        """Copy-on-write: the file goes (with its own delete files), `content` is written anew."""
        changes.deleted_files.append(task.file)
        self._sink.add(content.drop(FILEPOS_COLUMN, strict=False))

    def absorb_small_file(
        self, changes: MergeChanges, tasks: Sequence[FileScanTask], touched: set[int]
    ) -> None:
        """Fold the smallest small, untouched data file of the current partition spec into this
        write's new file. A merge-on-read write adds a file for the new versions of the rows it
        deletes by position; without this, a table fed by small upserts would gain one small file
        per write, each spanning the whole key range (so every later upsert would read them all).
        Its rows are preserved, only moved. Copy-on-write writes need none: their new rows join
        the rewritten files' rows."""
        spec_id = self.table.metadata.default_spec_id
        small = [
            t
            for t in tasks
            if id(t) not in touched
            and not t.delete_files
            and t.file.content == DataFileContent.DATA
            and t.file.spec_id == spec_id
            and t.file.record_count < MIN_ROWS
        ]
        if not small:
            return
        task = min(small, key=lambda t: t.file.record_count)
        self._rewrite(changes, task, self.reader.read(task))

    # -- planning

    def _scope(self, plan: WritePlan) -> RowScope:
        return row_scope(plan, self.spec, self.table.schema(), self.schema)

    def _keyed_tasks(self) -> list[FileScanTask]:
        """The files of the data manifests whose partition summaries admit one of the compute's
        keys (every file when the table is not partitioned by a key column, or its manifest
        list does not count rows: the unread files' rows could not be counted)."""
        admit = manifest_admission(self.table.metadata, self.spec, self.frame)
        if self.index.live_rows() is None:
            admit = None
        return self.index.tasks(admit=admit)

    def _unread_rows(self, tasks: list[FileScanTask]) -> int:
        """The live rows of the data files in manifests `_keyed_tasks` did not read: the
        snapshot's live rows (manifest list) minus the live rows of the files it read."""
        total = self.index.live_rows()
        if self.index.fully_read() or total is None:
            return 0
        return total - sum(_live_rows(t) for t in tasks)

    def _prune_by_keys(self, tasks: list[FileScanTask]) -> list[FileScanTask]:
        return prune_by_keys(self.table, self.spec, self.frame, tasks)


def _inside(within: RowScope | None, rows: pl.DataFrame) -> pl.Expr | None:
    """The window's or slice's predicate over `rows` (None: the write is not scoped)."""
    return within.expr(rows.schema) if within is not None else None


def _live_rows(task: FileScanTask) -> int:
    """The file's rows its delete files leave (exact with our file-scoped delete files, which
    never repeat a position; another engine's shared delete files are not counted)."""
    if not task.delete_files:
        return int(task.file.record_count)
    return int(task.file.record_count) - sum(d.record_count for d in own_delete_files(task))
