"""The native arm: `IcebergStore` writes every write mode as one atomic commit and reads back.

Owns the order of a native write — lock, probe (the freshness oracle), plan, write data files,
commit once — and the file-level copy-on-write merges behind upsert, append_new, sync and windowed
replace: file statistics prune the candidate files, the key columns verify them, and only files that
really change are rewritten. Every commit produces exactly one snapshot whose summary carries the
`pipeline-output.*` properties; a write that changes nothing commits nothing.

The per-table advisory lock covers only what correctness needs: loading the table, the plan, the key
reads and conflict checks, the file-level rewrites that depend on the current files, and the commit.
Where the strategy writes the computed frame as it is (append, replace, append_new with no key
already present) its data files are written *before* the lock, against the table metadata read
then, and committed inside it if the table's schema, partition spec and location are unchanged
(otherwise they are deleted and the frame is written again inside the lock). `replace_streaming`
(the model node) streams every batch to files before the lock the same way. A write registers as
a write in flight from before its first file until its commit (`inflight.py`), so orphan removal
never deletes its files, and takes the writer lock on that registration's session.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any, Unpack

import polars as pl
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.contract.checked_input import check_in_window
from pipeline_output.contract.plan import TargetState, WritePlan, plan_write
from pipeline_output.contract.result import RowCounts, WriteResult
from pipeline_output.contract.spec import Arm, DatasetSpec
from pipeline_output.contract.store_protocol import (
    Capabilities,
    WriteOptions,
    options_of,
)
from pipeline_output.contract.windows import Window
from pipeline_output.errors import (
    EmptyComputeRefused,
    InvalidArgument,
    WriteConflict,
)
from pipeline_output.infra.locks import AdvisoryLock, HeldLock, LockStats, iceberg_table
from pipeline_output.stores.iceberg.maintenance.compaction import compact as _compact
from pipeline_output.stores.iceberg.maintenance.expiry import expire_snapshots as _expire_snapshots
from pipeline_output.stores.iceberg.maintenance.orphans import remove_orphans as _remove_orphans
from pipeline_output.stores.iceberg.snapshot.commit import commit_write, delete_quietly
from pipeline_output.stores.iceberg.snapshot.data_files import DataFileWriter
from pipeline_output.stores.iceberg.snapshot.manifests import (
    FlatTransaction,
    read_index,
    upgrade_properties,
)
from pipeline_output.stores.iceberg.table.expressions import aligned_to_field
from pipeline_output.stores.iceberg.table.partitions import evolve as evolve_partitioning
from pipeline_output.stores.iceberg.table.partitions import partition_spec
from pipeline_output.stores.iceberg.table.properties import (
    DEFAULT_LOCK,
    ICEBERG_CAPABILITIES,
    TABLE_PROPERTIES,
)
from pipeline_output.stores.iceberg.table.reads import IcebergReads
from pipeline_output.stores.iceberg.table.refs import head, stage_branch
from pipeline_output.stores.iceberg.write.branch_target import branch_view
from pipeline_output.stores.iceberg.write.frame_rows import (
    align_to_schema,
    apply_evolution,
    sorted_for_write,
    state_of,
    total_records,
)
from pipeline_output.stores.iceberg.write.merge import FileMerge
from pipeline_output.stores.iceberg.write.prepare import (
    PreparedWrite,
    Prewritten,
    prepare_write,
    row_properties,
    summary_properties,
)
from pipeline_output.stores.iceberg.write.streaming import replace_streaming as _replace_streaming
from pipeline_output.stores.schema import check_required, initial_schema, plan_evolution


class IcebergStore(IcebergReads):
    """Writes and reads datasets as Iceberg tables `<namespace>.<dataset name>` of one catalog.

    Same-table writers are serialized with a Postgres advisory lock (default: on the control-plane
    Postgres from settings). Pass `lock=None` to opt out — every write then warns that concurrent
    writers are unsafe.
    """

    arm: Arm = "iceberg"
    capabilities: Capabilities = ICEBERG_CAPABILITIES

    def __init__(self, catalog: Catalog, namespace: str, *, lock: Any = DEFAULT_LOCK) -> None:
        self.catalog = catalog
        self.namespace = namespace
        self._lock: AdvisoryLock | Any | None = lock
        self._namespace_checked = False

    # -- identity and probing ----------------------------------------------------------------

    def identifier(self, spec: DatasetSpec | str) -> tuple[str, str]:
        """The table identifier of a dataset."""
        name = spec if isinstance(spec, str) else spec.name
        return (self.namespace, name)

    def table_name(self, spec: DatasetSpec | str) -> str:
        """`namespace.name`, for display and metadata."""
        return ".".join(self.identifier(spec))

    def load(self, spec: DatasetSpec | str) -> Table | None:
        """The table, or None when it does not exist."""
        try:
            return self.catalog.load_table(self.identifier(spec))
        except NoSuchTableError:
            return None

    def target_state(self, spec: DatasetSpec | str) -> TargetState:
        """The freshness oracle: does the table exist and has it a committed snapshot?"""
        return state_of(self.load(spec))

    def plan(self, spec: DatasetSpec, *, window: Window | None = None) -> WritePlan:
        """The write plan a write would follow now (dry run: reads table metadata only)."""
        return plan_write(spec, self.target_state(spec), window)

    # -- writing -----------------------------------------------------------------------------

    def prepare(
        self, spec: DatasetSpec, data: Any, *, window: Window | None = None
    ) -> PreparedWrite:
        """Check `data` and, where the strategy writes it as it is, write its data files now.

        Takes no writer lock (it only registers as a write in flight: the table's files lock,
        shared, `inflight.py`): callers that serialize writes themselves (the window apply lock)
        prepare before their own critical section and pass the result to `write(prepared=...)`,
        which re-validates the files under the table's lock. `PreparedWrite.discard()` deletes
        files a write did not commit and ends the registration (`write` does both).
        """
        return prepare_write(self, spec, data, window=window)

    def write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        prepared: PreparedWrite | None = None,
        branch: str | None = None,
        **options: Unpack[WriteOptions],
    ) -> WriteResult:
        """Probe, plan and write `data` for `spec` in one commit (none when nothing changes).

        With `prepared` (from `prepare` with the same spec and window) its checked frame and
        pre-written files are used instead of `data`. With `branch` the commit goes to that
        branch (created at main's head in the same commit when missing), planned against the
        branch's head; `main` does not move (write-audit-publish, `audit.py`).
        """
        started = time.perf_counter()
        window, run_id, summary = options_of(options)
        if prepared is not None and (prepared.spec != spec or prepared.window != window):
            raise InvalidArgument(
                f"dataset {spec.name!r}: the prepared write is for another spec or window"
            )
        prep = prepared if prepared is not None else self.prepare(spec, data, window=window)
        frame, pre = prep.frame, prep.pre
        try:
            with self._hold(spec, on=prep.held) as stats:
                table = self.load(spec)
                if branch is not None:
                    table = branch_view(self, spec, table, frame, branch)
                if window is not None and table is not None and spec.watermark:
                    window = aligned_to_field(window, table.schema(), spec.watermark)
                plan = plan_write(spec, state_of(table), window)
                if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
                    check_in_window(spec, frame, window)
                props = summary_properties(spec, plan, run_id, summary)
                if table is None:
                    result = self._create(spec, plan, frame, props, fence=stats.verify)
                else:
                    usable = pre if pre is not None and pre.fits(table) else None
                    result = self._write_existing(
                        spec,
                        plan,
                        table,
                        frame,
                        props,
                        pre=usable,
                        fence=stats.verify,
                        branch=branch or MAIN_BRANCH,
                    )
        finally:
            prep.discard()
        return replace(
            result,
            duration_s=time.perf_counter() - started,
            lock_wait_s=stats.wait_s,
            lock_held_s=stats.held_s,
            table=self.table_name(spec),
        )

    # Replace the whole table with batches written to data files as they arrive (one batch in
    # memory, one snapshot at the end): `streaming.replace_streaming`, as a method.
    replace_streaming = _replace_streaming

    # Table maintenance (docs/concepts.md, "Maintenance"), as methods: `compaction.compact`,
    # `expiry.expire_snapshots`, `orphans.remove_orphans`.
    compact = _compact
    expire_snapshots = _expire_snapshots
    remove_orphans = _remove_orphans

    def _advisory(self) -> AdvisoryLock | Any | None:
        """The writer lock (the default one on the control plane resolved on first use)."""
        if self._lock is DEFAULT_LOCK:
            from pipeline_output.infra.settings import get_settings

            self._lock = AdvisoryLock(get_settings().control_plane_url())
        return self._lock

    def _hold(
        self, spec: DatasetSpec, *, on: HeldLock | None = None
    ) -> AbstractContextManager[LockStats]:
        """The table's writer lock (on the session of `on`, the write's files lock, if given)."""
        lock = self._advisory()
        if lock is None:
            warnings.warn(
                f"dataset {spec.name!r}: IcebergStore(lock=None) — concurrent writers of "
                f"{self.table_name(spec)} are unsafe (no advisory lock)",
                stacklevel=3,
            )
            return nullcontext(LockStats(key=self.table_name(spec)))
        if on is not None and isinstance(lock, AdvisoryLock):
            return lock.hold(iceberg_table(self.table_name(spec)), on=on)
        return lock.hold(iceberg_table(self.table_name(spec)))  # type: ignore[no-any-return,unused-ignore]

    def _ensure_namespace(self) -> None:
        if not self._namespace_checked:
            self.catalog.create_namespace_if_not_exists(self.namespace)
            self._namespace_checked = True

    def _create_transaction(self, spec: DatasetSpec, frame: pl.DataFrame) -> Transaction:
        """The transaction that creates `spec`'s table for `frame` (schema, partition spec, sort
        order and table properties), committed with the table's first write."""
        self._ensure_namespace()
        schema, order = initial_schema(spec, frame)
        return self.catalog.create_table_transaction(
            self.identifier(spec),
            schema=schema,
            partition_spec=partition_spec(spec, schema),
            sort_order=order,
            properties=TABLE_PROPERTIES,
        )

    def _create(
        self,
        spec: DatasetSpec,
        plan: WritePlan,
        frame: pl.DataFrame,
        props: dict[str, str],
        *,
        fence: Callable[[], None] | None = None,
    ) -> WriteResult:
        """First deploy of a missing table: create it and write its first snapshot in one commit."""
        tx = self._create_transaction(spec, frame)
        data = sorted_for_write(frame, spec)
        props = {**props, **row_properties(RowCounts(inserted=frame.height))}
        try:
            table = commit_write(
                tx, props, deleted=[], frames=[data], dataset=spec.name, force=True, fence=fence
            )
        except TableAlreadyExistsError as exc:
            raise WriteConflict(
                f"dataset {spec.name!r}: {self.table_name(spec)} was created by another writer "
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

    def _write_existing(
        self,
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
            new_table = commit_write(
                tx,
                props,
                changes.deleted_files,
                frames,
                dataset=spec.name,
                force=force,
                ready=ready,
                fence=fence,
                blind_retry=plan.write_mode == "append" and not changes.deleted_files,
                index=index,
                positional=changes.positional,
                branch=branch,
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
            files_rewritten=sum(
                1 for f in changes.deleted_files if f.content == DataFileContent.DATA
            ),
            files_added=len(changes.written) + sum(1 for f in changes.new_frames if f.height),
            files_merged_on_read=len(changes.positional),
        )
