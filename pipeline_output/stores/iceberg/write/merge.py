"""The file-level merges behind replace (of a window or a partition slice), append_new, upsert
and sync: file statistics prune the candidate files, the key columns verify them, and only files
that really change are touched — each either rewritten (copy-on-write) or kept with a positional
delete file and its replaced rows written anew (merge-on-read), as `merge.MergePolicy`
decides per file. Scoped deletes (a delta window, a Dagster partition's slice) are `row_scope`'s.

Upserts and syncs are applied by one of two sibling merges, chosen explicitly per write by
`key_scan.choose_merge_path` (which and why: the write's `merge_path`, also logged at debug):

- `FileMerge.merge_by_key_scan`, the fast path: one vectorised pass over every candidate file's
  keys (`key_scan.scan_candidates`), then only the columns needed to tell changed rows;
- `FileMerge.merge_by_frame`, the fallback where the key scan cannot be proven the same (a file
  that is not local Parquet, a renamed column, ...): candidate files read whole, one at a time
  with a bounded number in flight (`key_scan.FileReader`), rewritten rows written out as they
  come (`frame_rows.RewriteSink`), so memory follows the batch and the largest file.

Both tell a changed matched row by the one definition, `frame_rows.values_differ` (its docstring
holds the semantics and points to the legacy arm's SQL twin). append_new looks keys up the same
way (the key scan, else file by file), comparing no value.

Copy-on-write or merge-on-read: the choice a merge makes for each data file it changes.

Copy-on-write rewrites the file without the replaced/deleted rows (reads stay as fast as on a fresh
table; the write costs the whole file). Merge-on-read keeps the file, writes the replaced rows'
new versions as new data and the removed rows' positions as a positional delete file (the write
costs the changed rows; every reader then filters the file by its deletes). The choice, in order:

1. the dataset's `write_strategy_hint` (`copy-on-write` / `merge-on-read`), when not `auto`;
2. the table's own Iceberg property, as other engines read it: `write.merge.mode` for upsert and
   sync, `write.delete.mode` for a windowed replace (values `copy-on-write` / `merge-on-read`);
3. `auto`, by cost. A write whose changed files total at most `COW_BUDGET_PROPERTY` bytes
   (default 16 MiB) rewrites them all — the table keeps reading like a fresh one, with no delete
   file to apply — unless the whole write would then cost more than `COW_WEIGHT` (2) times the
   write keeping them. Costs are in bytes of rewriting: either way the write costs `WRITE_BYTES`
   (its lock, plan, key read and commit) plus its inserted rows; rewriting adds the changed
   files' bytes, keeping adds each file's changed rows' bytes (their new versions) plus
   `FIXED_BYTES` (a delete file and its manifest entries). So an upsert changing 1 % of each of
   twenty 0.4 MB files keeps them (rewriting 8 MB to change 80 KB was 3x slower than keeping
   them), while one changing a few rows of one small file rewrites it. Above the budget — an
   upsert whose keys are spread over many files — each file is merged on read when it holds at
   least `MIN_ROWS` rows and, with this write's deletes, at most `MAX_DELETED_SHARE` of its rows
   are deleted; otherwise it is rewritten, which also folds the deletes it already carries, so a
   file never degrades past that share.

A file none of whose rows would stay live is dropped whatever the mode. Format-version 1 tables
cannot carry delete files: they are always copy-on-write, and an explicit merge-on-read hint on one
is refused before any I/O.

The Iceberg arm's write modes: `WRITE_HANDLERS` maps each write mode (`spec.WRITE_MODES`) to the
`FileMerge` method that applies it, and `ICEBERG_CAPABILITIES` declares them
(`Capabilities.write_modes`); a plan whose mode has no handler is refused with `UnsupportedWrite`.

The commit of a native write, under the table's writer lock: the first write of a missing
table (`create_table`: the table and its first snapshot in one commit), and a write to an existing
one (`write_existing`: schema and partition-spec evolution, the file-level merge of the plan's write
mode, then one commit — none when nothing changes).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import polars as pl
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.contract.checked_input import polars_schema, refuse_duplicate_matches
from pipeline_output.contract.plan import RowCounts, WritePlan, WriteResult
from pipeline_output.contract.spec import (
    SCOPED,
    WRITE_MODES,
    DatasetSpec,
    WriteMode,
    WriteStrategyHint,
)
from pipeline_output.contract.store_protocol import KEY_TYPES, Capabilities
from pipeline_output.errors import EmptyComputeRefused, UnsupportedWrite, WriteConflict
from pipeline_output.infra.locks import LockStats
from pipeline_output.stores.iceberg.snapshot.commit import (
    CommitRequest,
    commit,
    delete_quietly,
    row_properties,
)
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter, own_delete_files
from pipeline_output.stores.iceberg.snapshot.manifests import (
    FlatTransaction,
    ManifestIndex,
    read_index,
    upgrade_properties,
)
from pipeline_output.stores.iceberg.table.catalog import AssertUnchanged, requires_unchanged
from pipeline_output.stores.iceberg.table.changes import (
    CHANGE_TYPE,
    DELETE,
    INSERT,
    UPDATE_AFTER,
    UPDATE_BEFORE,
)
from pipeline_output.stores.iceberg.table.partitions import evolve as evolve_partitioning
from pipeline_output.stores.iceberg.table.tables import (
    FILEPOS_COLUMN,
    NEW_PREFIX,
    POS_COLUMN,
    IcebergTables,
    head,
    stage_branch,
    total_records,
)
from pipeline_output.stores.iceberg.write.frame_rows import (
    RewriteSink,
    RowScope,
    absent_mask,
    align_to_schema,
    apply_evolution,
    coalesced,
    replace_rows,
    row_scope,
    rows_differ,
    schema_names,
    sorted_for_write,
)
from pipeline_output.stores.iceberg.write.key_scan import (
    CandidateRows,
    FileReader,
    FileRows,
    G,
    KeySlices,
    L,
    MergePath,
    ObjectFiles,
    choose_merge_path,
    manifest_admission,
    prune_by_keys,
    scan_candidates,
)
from pipeline_output.stores.iceberg.write.prepare import MergeChanges, Prewritten
from pipeline_output.stores.schema import check_required, plan_evolution

_HIT = "__po_hit__"
_log = logging.getLogger(__name__)


def _nobody() -> bool:
    """No downstream consumes the table's changes (`ChangeFilePolicy`, when nobody says)."""
    return False


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
    # which merge compared the rows and why (`key_scan.choose_merge_path`); None: no comparison
    path: MergePath | None = field(default=None, init=False)
    # the write's own change for the change feed (`change`): the old rows it updated or deleted
    # (tagged update_before / delete) and the keys it matched; None: not collected
    _change_before: list[pl.DataFrame] | None = field(default=None, init=False)
    _change_matched: pl.DataFrame | None = field(default=None, init=False)
    # whether a downstream consumes the table's changes (`ChangeFilePolicy`; asked when needed)
    consumed: Callable[[], bool] = _nobody

    def __post_init__(self) -> None:
        self.reader = FileReader(self.table, self.schema)
        self._sink = RewriteSink(self.writer, self.spec)

    def run(self, plan: WritePlan) -> MergeChanges:
        """The changes of the plan's write mode (its handler in `WRITE_HANDLERS`)."""
        ICEBERG_CAPABILITIES.check_plan(self.spec, plan)  # a mode without a handler: refused
        return WRITE_HANDLERS[plan.write_mode](self, plan)

    def change(self) -> pl.DataFrame | None:
        """The change an upsert or sync made (`commit.CHANGE_FILE`): the old rows it updated or
        deleted, the compute's rows of the keys it updated (update_after) or did not match
        (insert); None when it was not collected (other modes)."""
        if self._change_before is None or self._change_matched is None:
            return None
        pk, names = list(self.spec.primary_key), schema_names(self.schema)
        before = [b.select(*names, CHANGE_TYPE) for b in self._change_before if b.height]
        old = pl.concat(before, how="vertical_relaxed") if before else None
        updated = (
            old.filter(pl.col(CHANGE_TYPE) == UPDATE_BEFORE).select(pk) if old is not None else None
        )
        inserted = self.frame.join(self._change_matched, on=pk, how="anti", nulls_equal=True)
        parts = [inserted.select(names).with_columns(pl.lit(INSERT).alias(CHANGE_TYPE))]
        if old is not None and updated is not None:
            parts.insert(0, old)
            after = self.frame.join(updated, on=pk, how="semi", nulls_equal=True)
            parts.append(after.select(names).with_columns(pl.lit(UPDATE_AFTER).alias(CHANGE_TYPE)))
        return pl.concat(parts, how="vertical_relaxed")

    def _change_policy(self) -> ChangeFilePolicy:
        return ChangeFilePolicy.of(self.table, consumed=self.consumed)

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
            deleted = sum(live_rows(t) for t in tasks)
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
                changes.preserved += live_rows(task)
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
            drop_from_file(
                changes, task, rows, drop, policy=policy, io=self.table.io, sink=self._sink
            )
        changes.written = self._sink.files
        changes.new_frames = [self.frame, *self._sink.rest()]
        return changes

    def _append_new(self, plan: WritePlan) -> MergeChanges:
        pk = list(self.spec.primary_key)
        candidates = self._prune_by_keys(self._keyed_tasks())
        scanned = self._key_scan(candidates, absent_in=None, compare=False)
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
        """The candidate files of an upsert or sync, then its merge: by the key scan, or file
        by file (`key_scan.choose_merge_path` decides)."""
        policy = self._policy(plan)
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
        changes.preserved += sum(live_rows(t) for t in tasks if id(t) not in chosen)
        changes.preserved += self._unread_rows(tasks)
        # the key scan (one vectorised pass over every candidate) when provably the same, else
        # the file-by-file fallback: both tell changed rows by `frame_rows.values_differ`
        absent_in = None if scope == "none" else pl.lit(True)
        if within is not None:  # a sync deletes absent keys inside its window or slice only
            absent_in = within.expr(polars_schema(self.schema.as_arrow()))
        scanned = self._key_scan(
            candidates,
            absent_in=absent_in,
            scope_columns=within.columns if within is not None else (),
        )
        if scanned is not None:
            return self.merge_by_key_scan(changes, scanned, policy, tasks)
        return self.merge_by_frame(changes, candidates, policy, tasks, scope=scope, within=within)

    def _key_scan(
        self,
        candidates: Sequence[FileScanTask],
        *,
        absent_in: pl.Expr | None,
        scope_columns: Sequence[str] = (),
        compare: bool = True,
    ) -> CandidateRows | None:
        """The key scan of `candidates` when `key_scan.choose_merge_path` picks it (None: the
        file-by-file fallback); the path taken and why are kept in `path` (the write's
        `merge_path`) and logged."""
        remote = ObjectFiles(self.table.io)  # footers read by both, once
        path = choose_merge_path(self.table, self.schema, candidates, remote=remote)
        scanned: CandidateRows | MergePath = path
        if path.name == "key_scan":
            scanned = scan_candidates(
                self.table,
                self.schema,
                self.frame,
                candidates,
                pk=list(self.spec.primary_key),
                absent_in=absent_in,
                scope_columns=scope_columns,
                compare=compare,
                remote=remote,
            )
            if isinstance(scanned, MergePath):
                path = scanned
        self.path = path
        _log.debug("dataset %r: merge by %s", self.spec.name, path)
        return None if isinstance(scanned, MergePath) else scanned

    # -- the two sibling merges of an upsert or sync: by the key scan, or file by file

    def merge_by_key_scan(
        self,
        changes: MergeChanges,
        scanned: CandidateRows,
        policy: MergePolicy,
        tasks: Sequence[FileScanTask],
    ) -> MergeChanges:
        """The fast merge: `changes` completed from `scanned` (the candidates of `tasks`, the
        files planned), whose matched, changed (`frame_rows.values_differ`, column by column) and
        absent rows `key_scan.scan_candidates` found in one vectorised pass. Each file that
        changes is kept with a positional delete file of its changed and absent rows
        (merge-on-read) or rewritten without them (copy-on-write), as `MergePolicy` decides; the
        rewritten files are read as one scan per chunk of files. Changed rows' new versions, and
        the compute's new keys, are the compute's own rows, written once with the rewritten
        rows."""
        spec, frame = self.spec, self.frame
        pk = list(spec.primary_key)
        relevant = [r for r in scanned.files if r.matched or r.absent.len()]
        changes.preserved += sum(r.live for r in scanned.files if not (r.matched or r.absent.len()))
        policy = policy.within_budget(
            sum(r.task.file.file_size_in_bytes for r in relevant),
            keep_bytes=sum(_keep_bytes(r) for r in relevant),
            common_bytes=_inserted_bytes(relevant, frame.height - scanned.matched_keys.height),
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
                changes.delete_positions(self.table.io, rows.task, gone, earlier=rows.own_deleted)
                merged_on_read = True
            else:
                rewritten.append(rows)
        losing = [r for r in relevant if id(r.task) in touched]
        if self._change_policy().records(r.task.file.file_size_in_bytes for r in losing):
            self._change_before = [_old_rows(scanned, losing)]  # an extra read of those files
            self._change_matched = scanned.matched_keys
        for chunk in _chunks(rewritten):
            _rewrite_scanned(self, changes, scanned, chunk)

        refuse_duplicate_matches(spec, scanned.matched_keys)  # before anything is committed
        changes.inserted = frame.height - scanned.matched_keys.height
        new_rows = frame
        if settled.height:
            new_rows = frame.join(
                settled, on=pk, how="anti", nulls_equal=True, maintain_order="left"
            )
        if merged_on_read and not self.sink.rest_height():
            self.absorb_small_file(changes, tasks, touched)
        return self.finish(changes, [new_rows])

    def merge_by_frame(
        self,
        changes: MergeChanges,
        candidates: list[FileScanTask],
        policy: MergePolicy,
        tasks: Sequence[FileScanTask],
        *,
        scope: str,
        within: RowScope | None,
    ) -> MergeChanges:
        """The fallback merge (`key_scan.choose_merge_path` says why it runs): each candidate
        file read whole, one at a time (a bounded number in flight), joined with the compute's
        rows, its changed rows told by `frame_rows.rows_differ`."""
        spec, frame = self.spec, self.frame
        pk = list(spec.primary_key)
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
        names = schema_names(self.schema)
        before: list[pl.DataFrame] = []
        if self._change_policy().in_hand():
            self._change_before = before
        # the compute's value columns under reserved names: no user column can collide with them
        renamed = {c: NEW_PREFIX + c for c in frame.columns if c not in pk}
        value_cols = [c for c in schema_names(self.schema) if c in renamed]
        for task, rows in self.reader.stream(candidates):
            rows = rows.with_row_index(POS_COLUMN)
            batch = slices.of(task)
            joined = rows.join(batch.rename(renamed), on=pk, how="inner", nulls_equal=True)
            if joined.height:
                matched_keys.append(joined.select(pk))
            changed = joined.filter(rows_differ(value_cols))
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
            before.append(
                changed.select(names).with_columns(pl.lit(UPDATE_BEFORE).alias(CHANGE_TYPE))
            )
            if gone_rows is not None and n_absent:
                lost = rows.filter(gone_rows).select(names)
                before.append(lost.with_columns(pl.lit(DELETE).alias(CHANGE_TYPE)))
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
                    settled_keys.append(joined.filter(~rows_differ(value_cols)).select(pk))
                continue
            settled_keys.append(joined.select(pk))
            content = replace_rows(rows.drop(FILEPOS_COLUMN), changed, value_cols, pk)
            if gone_rows is not None:
                content = content.filter(~gone_rows)
            self._rewrite(changes, task, content.drop(POS_COLUMN))

        all_matched = pl.concat(matched_keys) if matched_keys else frame.head(0).select(pk)
        self._change_matched = all_matched
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
        return total - sum(live_rows(t) for t in tasks)

    def _prune_by_keys(self, tasks: list[FileScanTask]) -> list[FileScanTask]:
        return prune_by_keys(self.table, self.spec, self.frame, tasks)


# The Iceberg arm's handler of each write mode (`spec.WRITE_MODES`): what the mode changes in an
# existing table (a missing table's first write is `create_table`).
WRITE_HANDLERS: dict[WriteMode, Callable[[FileMerge, WritePlan], MergeChanges]] = {
    "replace": FileMerge._replace,
    "append": FileMerge._append,
    "append_new": FileMerge._append_new,
    "upsert": FileMerge._upsert_or_sync,
    "sync": FileMerge._upsert_or_sync,
}

ICEBERG_CAPABILITIES = Capabilities(
    arm="iceberg",
    label="Iceberg arm",
    nested_types=True,  # lists, arrays and structs, to any depth
    max_identifier_length=None,
    max_columns=None,
    scalar_types=None,  # every type `frames.to_polars` leaves (it refuses durations and objects)
    key_types=KEY_TYPES,  # the same rule on both arms (contract/store_protocol.py)
    advice="",
    write_modes=frozenset(WRITE_HANDLERS),
)


def _inside(within: RowScope | None, rows: pl.DataFrame) -> pl.Expr | None:
    """The window's or slice's predicate over `rows` (None: the write is not scoped)."""
    return within.expr(rows.schema) if within is not None else None


def live_rows(task: FileScanTask) -> int:
    """The file's rows its delete files leave (exact with our file-scoped delete files, which
    never repeat a position; another engine's shared delete files are not counted)."""
    if not task.delete_files:
        return int(task.file.record_count)
    return int(task.file.record_count) - sum(d.record_count for d in own_delete_files(task))


# when an upsert or sync writes its change file (`commit.CHANGE_FILE`): `always`, `never`, or
# `auto` (default) — only for a table whose changes a downstream consumes (`consumed`: the
# ledger's `ConsumedLog.consumed`, through `IcebergStore(change_consumers=...)`), and then when its
# before rows are in hand (the file-by-file merge), or reading them costs little: the files losing
# rows total at most CHANGE_READ_BYTES
CHANGE_FILES_PROPERTY = "pipeline-output.change-files"
CHANGE_READ_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ChangeFilePolicy:
    """Whether a merge records its change: `mode` is the table's property; `consumed` (whether a
    downstream consumes the table's changes) is asked only when `auto` needs it."""

    mode: str
    consumed: Callable[[], bool] = _nobody

    @classmethod
    def of(cls, table: Table, *, consumed: Callable[[], bool] = _nobody) -> ChangeFilePolicy:
        mode = table.metadata.properties.get(CHANGE_FILES_PROPERTY, "auto")
        if mode not in ("auto", "always", "never"):
            raise UnsupportedWrite(
                f"table {'.'.join(table.name())!r}: property {CHANGE_FILES_PROPERTY}={mode!r} is "
                "not one of auto, always, never (nothing was written)"
            )
        return cls(mode, consumed)

    def in_hand(self) -> bool:
        """Whether to record the change when the merge has the before rows in hand."""
        return self.mode == "always" or (self.mode == "auto" and self.consumed())

    def records(self, sizes: Iterable[int]) -> bool:
        """Whether to read the before rows of files of `sizes` bytes to record the change."""
        if self.mode != "auto":
            return self.mode == "always"
        return sum(sizes) <= CHANGE_READ_BYTES and self.consumed()


MIN_ROWS = 10_000  # smaller files cost less to rewrite than to carry deletes for
MAX_DELETED_SHARE = 0.2  # past this share of deleted rows a file is rewritten (deletes folded)
# a write whose changed files total at most this many bytes rewrites them (auto mode)
COW_BUDGET_PROPERTY = "pipeline-output.merge.copy-on-write-max-bytes"
COW_BUDGET_BYTES = 16 * 1024 * 1024  # ~1.5M rows of six columns (zstd)
# auto rewrites under the budget only while the whole write costs at most COW_WEIGHT x what it
# costs keeping the files; costs in bytes of rewriting (~55 ms a MiB here, measured: issue 44)
COW_WEIGHT = 2.0
WRITE_BYTES = 1024 * 1024  # a write's own work either way (lock, plan, key read, commit)
FIXED_BYTES = 64 * 1024  # keeping one file (its delete file, manifest entries)


def drop_from_file(
    changes: MergeChanges,
    task: FileScanTask,
    rows: pl.DataFrame,
    drop: pl.Series,
    *,
    policy: MergePolicy,
    io: FileIO,
    sink: RewriteSink,
) -> int:
    """Remove the rows `drop` marks from `task`'s file (`rows`: its live rows, with their
    positions): by a positional delete file when `policy` says merge-on-read, else the file goes
    and its kept rows go to `sink` (copy-on-write). Counts them in `changes`; returns how many."""
    n_drop = int(drop.sum())
    changes.deleted += n_drop
    changes.preserved += rows.height - n_drop
    if n_drop == 0:
        return 0
    if policy.merge_on_read(
        file_rows=task.file.record_count,
        deleted_before=task.file.record_count - rows.height,
        deleting=n_drop,
    ):
        changes.delete_positions(io, task, rows.filter(drop).get_column(FILEPOS_COLUMN))
    else:
        changes.deleted_files.append(task.file)
        sink.add(rows.filter(~drop).drop(FILEPOS_COLUMN, strict=False))
    return n_drop


@dataclass(frozen=True)
class MergePolicy:
    """The resolved mode of one write, and the per-file decision."""

    mode: WriteStrategyHint
    source: str  # where the mode came from, for metadata and errors
    cow_budget_bytes: int = COW_BUDGET_BYTES

    @classmethod
    def resolve(cls, spec: DatasetSpec, metadata: TableMetadata, write_mode: str) -> MergePolicy:
        """The policy of a `write_mode` write of `spec` into a table with `metadata`."""
        mode: WriteStrategyHint = "auto"
        source = "auto"
        row_level = WRITE_MODES[write_mode].row_level if write_mode in WRITE_MODES else None
        prop = f"write.{row_level}.mode" if row_level else None  # the write mode's (`WriteModeDef`)
        table_value = metadata.properties.get(prop) if prop else None
        if spec.write_strategy_hint != "auto":
            mode, source = spec.write_strategy_hint, "write_strategy_hint"
        elif table_value in ("copy-on-write", "merge-on-read"):
            mode, source = table_value, f"table property {prop}"  # type: ignore[assignment]
        if metadata.format_version < 2:
            if mode == "merge-on-read":
                raise UnsupportedWrite(
                    f"dataset {spec.name!r}: {source} asks for merge-on-read, but the table is "
                    "Iceberg format version 1, which has no delete files; upgrade the table "
                    "(format-version 2) or use copy-on-write (nothing was written)"
                )
            return cls(mode="copy-on-write", source="format version 1")
        raw_budget = metadata.properties.get(COW_BUDGET_PROPERTY)
        try:
            budget = int(raw_budget) if raw_budget is not None else COW_BUDGET_BYTES
        except ValueError as exc:
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: table property {COW_BUDGET_PROPERTY}={raw_budget!r} is "
                "not a whole number of bytes (nothing was written)"
            ) from exc
        return cls(mode=mode, source=source, cow_budget_bytes=budget)

    def within_budget(
        self, changed_bytes: int, *, keep_bytes: int | None = None, common_bytes: int = 0
    ) -> MergePolicy:
        """The policy for a write whose changed files total `changed_bytes`: `auto` under the
        budget rewrites them all — unless the whole write would then cost more than `COW_WEIGHT`
        times the write keeping them. Either way the write costs `WRITE_BYTES` plus
        `common_bytes` (its inserted rows); rewriting adds `changed_bytes`, keeping adds
        `keep_bytes` (the changed rows' new versions plus `FIXED_BYTES` a file, when known)."""
        if self.mode != "auto" or changed_bytes > self.cow_budget_bytes:
            return self
        either = WRITE_BYTES + common_bytes
        if keep_bytes is not None and either + changed_bytes > COW_WEIGHT * (either + keep_bytes):
            return MergePolicy(
                mode="auto",
                source="auto, cheaper to keep",
                cow_budget_bytes=self.cow_budget_bytes,
            )
        return MergePolicy(mode="copy-on-write", source="auto, under the budget")

    def merge_on_read(self, *, file_rows: int, deleted_before: int, deleting: int) -> bool:
        """Whether to keep a file of `file_rows` rows (`deleted_before` of them already deleted)
        and delete `deleting` more of its rows by position, rather than rewrite it."""
        if deleting <= 0 or deleted_before + deleting >= file_rows:
            return False  # nothing to delete, or nothing would stay live: drop or keep the file
        if self.mode != "auto":
            return self.mode == "merge-on-read"
        return file_rows >= MIN_ROWS and deleted_before + deleting <= MAX_DELETED_SHARE * file_rows


CHUNK_BYTES = 64 * 1024 * 1024  # stored bytes of the rewritten files read by one scan


def _keep_bytes(rows: FileRows) -> int:
    """What keeping a file with a delete file costs, in bytes of rewriting (the `MergePolicy` above)."""
    size, count = rows.task.file.file_size_in_bytes, max(1, int(rows.task.file.record_count))
    return FIXED_BYTES + (rows.changed.len() + rows.absent.len()) * size // count


def _inserted_bytes(files: list[FileRows], inserted: int) -> int:
    """What writing `inserted` new rows costs, at the changed `files`' stored bytes a row."""
    rows = sum(int(r.task.file.record_count) for r in files)
    size = sum(r.task.file.file_size_in_bytes for r in files)
    return inserted * size // rows if rows else 0


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


def _old_rows(scanned: CandidateRows, files_: list[FileRows]) -> pl.DataFrame:
    """The old rows `files_` lose (their changed rows, tagged update_before, and absent ones,
    tagged delete), read as one scan of those files: the change's before side."""
    reader = scanned.reader
    target = list(reader.target)
    kinds = pl.DataFrame(
        {
            G: [
                reader.offsets[r.index] + p
                for r in files_
                for s in (r.changed, r.absent)
                for p in s.to_list()
            ],
            CHANGE_TYPE: [
                kind
                for r in files_
                for s, kind in ((r.changed, UPDATE_BEFORE), (r.absent, DELETE))
                for _ in range(s.len())
            ],
        },
        schema={G: pl.Int64, CHANGE_TYPE: pl.String},
    )
    if not kinds.height:
        return pl.DataFrame(schema={**reader.target, CHANGE_TYPE: pl.String})
    files = [r.index for r in files_]
    wanted = kinds.with_columns(reader.local(files, pl.col(G)).alias(L)).drop(G)
    content = reader.scan(files, target).filter(pl.col(L).is_in(wanted.get_column(L).implode()))
    return content.collect().join(wanted, on=L, how="inner").select(*target, CHANGE_TYPE)


def _rewrite_scanned(
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


def create_table(
    tables: IcebergTables,
    spec: DatasetSpec,
    plan: WritePlan,
    frame: pl.DataFrame,
    props: dict[str, str],
    *,
    fence: LockStats | None = None,
) -> WriteResult:
    """First deploy of a missing table: create it and write its first snapshot in one commit."""
    tx = tables.create_transaction(spec, frame)
    data = sorted_for_write(frame, spec)
    # the first snapshot's files are its inserts
    props = {**props, **row_properties(RowCounts(inserted=frame.height), added_are_inserts=True)}
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
    return WriteResult.inserts(
        plan,
        frame.height,
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
    fence: LockStats | None = None,
    branch: str = MAIN_BRANCH,
    consumed: Callable[[], bool] = _nobody,
    asserted: bool = False,
) -> WriteResult:
    """A write to an existing table: its evolution, the merge of the plan's write mode, one
    commit (none when nothing changes). `consumed`: whether a downstream consumes the table's
    changes (`ChangeFilePolicy`). `asserted`: `table` was not loaded for this write (it is as
    this process's last write left it), so its commit — a schema-only one too — asserts the
    whole base it planned on (`assert_base`) and is never retried blind on a new head."""
    tx = FlatTransaction(table)
    if asserted:
        assert_base(tx, branch)
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
            consumed=consumed,
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
    # an append that removed no file: its added data files are its inserts
    appended = plan.write_mode in ("append", "append_new") and not changes.deleted_files
    props = {**props, **row_properties(changes, added_are_inserts=appended)}
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
                blind_retry=WRITE_MODES[plan.write_mode].blind_retry
                and not changes.deleted_files
                and not asserted,
                fence=fence,
                index=index,
                branch=branch,
                change=merge.change(),
            )
        )
        snapshot_id = head(new_table, branch)
    elif not evolution.empty:
        if fence is not None:
            fence.verify()
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
        merge_path=str(merge.path) if merge.path is not None else "",
    )


def assert_base(tx: Transaction, branch: str) -> None:
    """Make `tx`'s commit require the table as `tx` starts from: the head of `branch`, the
    current schema, the last assigned field id and the default partition spec (Iceberg REST's
    `assert-ref-snapshot-id`, `assert-current-schema-id`, `assert-last-assigned-field-id`,
    `assert-default-spec-id`, `assert-default-sort-order-id`; the SQL catalog checks the same
    against its current metadata, and more: `AssertUnchanged`, any commit at all — a
    property-only one too, which no REST requirement can express). Staged before any other
    change: a schema or spec evolution asserts the same values, and a transaction keeps one
    requirement of each kind. Another engine's commit in between then fails the commit
    (`CommitFailedException`), nothing committed."""
    from pyiceberg.table.update import (
        AssertCurrentSchemaId,
        AssertDefaultSortOrderId,
        AssertDefaultSpecId,
        AssertLastAssignedFieldId,
        AssertRefSnapshotId,
        TableRequirement,
    )

    meta = tx.table_metadata
    # pydantic models populated by field name (their aliases are the REST names)
    requirements: list[TableRequirement] = [
        AssertRefSnapshotId(snapshot_id=head(tx._table, branch), ref=branch),  # type: ignore[call-arg]
        AssertCurrentSchemaId(current_schema_id=meta.current_schema_id),  # type: ignore[call-arg]
        AssertLastAssignedFieldId(last_assigned_field_id=meta.last_column_id),  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=meta.default_spec_id),  # type: ignore[call-arg]
        AssertDefaultSortOrderId(default_sort_order_id=meta.default_sort_order_id),  # type: ignore[call-arg]
    ]
    if requires_unchanged(tx._table.catalog):
        requirements.append(AssertUnchanged.of(meta))  # type: ignore[arg-type]
    tx._stage((), tuple(requirements))
