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
a write in flight from before its first file until its commit (`commit.py`), so orphan removal
never deletes its files, and takes the writer lock on that registration's session.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from functools import cache, partial
from typing import Any, Unpack

import polars as pl
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.contract.checked_input import check_in_window, checked_frame
from pipeline_output.contract.plan import TargetState, WritePlan, WriteResult, plan_write
from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.contract.spec import Arm, DatasetSpec
from pipeline_output.contract.store_protocol import (
    Capabilities,
    ReadOptions,
    WriteOptions,
    WriteScope,
    options_of,
)
from pipeline_output.contract.windows import Window
from pipeline_output.errors import FilesRemoved, InvalidArgument, LockLost, WriteConflict
from pipeline_output.infra.locks import LockStats
from pipeline_output.stores.iceberg.maintenance import TableMaintenance
from pipeline_output.stores.iceberg.maintenance.compaction import CompactionResult
from pipeline_output.stores.iceberg.maintenance.expiry import ExpiryResult
from pipeline_output.stores.iceberg.maintenance.orphans import OrphanResult
from pipeline_output.stores.iceberg.snapshot.commit import summary_properties
from pipeline_output.stores.iceberg.table import reads
from pipeline_output.stores.iceberg.table.partitions import aligned_to_field
from pipeline_output.stores.iceberg.table.tables import DEFAULT_LOCK, IcebergTables, state_of
from pipeline_output.stores.iceberg.write.branch_target import branch_view
from pipeline_output.stores.iceberg.write.merge import (
    ICEBERG_CAPABILITIES,
    create_table,
    write_existing,
)
from pipeline_output.stores.iceberg.write.prepare import PreparedWrite, Prewritten, prepare_write
from pipeline_output.stores.iceberg.write.range_write import (
    LoadedAhead,
    RangeWrite,
    loaded_ahead,
    write_range,
)
from pipeline_output.stores.iceberg.write.streaming import replace_streaming


class IcebergStore:
    """Writes and reads datasets as Iceberg tables `<namespace>.<dataset name>` of one catalog.

    Same-table writers are serialized with a Postgres advisory lock (default: on the control-plane
    Postgres from settings). Pass `lock=None` to opt out — every write then warns that concurrent
    writers are unsafe. The tables, their naming and their locks are `store.tables`
    (`table/tables.py`); table maintenance is `store.maintenance` (`maintenance/`).
    """

    arm: Arm = "iceberg"
    capabilities: Capabilities = ICEBERG_CAPABILITIES

    def __init__(
        self,
        catalog: Catalog,
        namespace: str,
        *,
        lock: Any = DEFAULT_LOCK,
        change_consumers: Callable[[str], bool] | None = None,
    ) -> None:
        self.tables = IcebergTables(catalog, namespace, lock=lock)
        self.change_consumers = change_consumers

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg catalog the tables live in."""
        return self.tables.catalog

    @property
    def namespace(self) -> str:
        """The Iceberg namespace of the datasets' tables."""
        return self.tables.namespace

    @property
    def maintenance(self) -> TableMaintenance:
        """Table maintenance (compaction, expiry, orphan removal, health) of these tables."""
        return TableMaintenance(self.tables)

    # -- identity and probing ----------------------------------------------------------------

    def identifier(self, spec: DatasetSpec | str) -> tuple[str, str]:
        """The table identifier of a dataset."""
        return self.tables.identifier(spec)

    def table_name(self, spec: DatasetSpec | str) -> str:
        """`namespace.name`, for display and metadata."""
        return self.tables.table_name(spec)

    def load(self, spec: DatasetSpec | str) -> Table | None:
        """The table, or None when it does not exist."""
        return self.tables.load(spec)

    def target_state(self, spec: DatasetSpec | str) -> TargetState:
        """The freshness oracle: does the table exist and has it a committed snapshot?"""
        return state_of(self.load(spec))

    def plan(self, spec: DatasetSpec, **scope: Unpack[WriteScope]) -> WritePlan:
        """The write plan a write would follow now (dry run: reads table metadata only)."""
        return plan_write(spec, self.target_state(spec), **scope)

    # -- writing -----------------------------------------------------------------------------

    def prepare(self, spec: DatasetSpec, data: Any, **scope: Unpack[WriteScope]) -> PreparedWrite:
        """Check `data` and, where the strategy writes it as it is, write its data files now.

        Takes no writer lock (it only registers as a write in flight: the table's files lock,
        shared, `snapshot/commit.py`): callers that serialize writes themselves (the window
        apply lock) prepare before their own critical section and pass the result to
        `write(prepared=...)`, which re-validates the files under the table's lock.
        `PreparedWrite.discard()` deletes files a write did not commit and ends the registration
        (`write` does both).
        """
        frame = checked_frame(spec, data)
        self.capabilities.check_frame(spec, frame)  # before any I/O (float or nested keys...)
        return prepare_write(
            self, spec, frame, window=scope.get("window"), partition=scope.get("partition")
        )

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
        branch's head; `main` does not move (write-audit-publish, `services/audit.py`).
        """
        started = time.perf_counter()
        window, run_id, summary = options_of(options)
        partition = options.get("partition")
        if prepared is not None and not prepared.fits(spec, window, partition):
            raise InvalidArgument(
                f"dataset {spec.name!r}: the prepared write is for another spec, window or "
                "partition"
            )
        prep = (
            prepared
            if prepared is not None
            else self.prepare(spec, data, window=window, partition=partition)
        )
        frame, pre = prep.frame, prep.pre
        tables = self.tables
        # a write to main plans from the table as this process's last write left it (no catalog
        # request) while it holds the project's writer lock; its commit asserts what it planned on
        last = tables.as_written(spec) if branch is None else None
        remembered = last if last is not None and tables.plans_from_memory(spec) else None
        try:
            with tables.hold(spec, on=prep.held) as stats:
                attempt = partial(
                    self._write_held,
                    spec,
                    frame,
                    fence=stats,
                    window=window,
                    partition=partition,
                    run_id=run_id,
                    summary=summary,
                    branch=branch,
                )
                result = None
                if remembered is not None:
                    result = self._from_memory(spec, remembered, attempt, pre)
                if result is None:
                    table = tables.load_since(spec, last)
                    usable = pre if pre is not None and not pre.handed_to_commit else None
                    result = attempt(table, pre=usable)
        finally:
            prep.discard()
        return replace(
            result,
            duration_s=time.perf_counter() - started,
            lock_wait_s=stats.wait_s,
            lock_held_s=stats.held_s,
            table=self.table_name(spec),
        )

    def _write_held(
        self,
        spec: DatasetSpec,
        frame: pl.DataFrame,
        table: Table | None,
        *,
        pre: Prewritten | None,
        fence: LockStats,
        window: Window | None,
        partition: PartitionSlice | None,
        run_id: str | None,
        summary: dict[str, str] | None,
        branch: str | None,
        remembered: bool = False,
    ) -> WriteResult:
        """Plan and commit the write on `table` (under its writer lock), and remember the table
        the commit left. `remembered`: `table` was not loaded but is as this process's last write
        left it — the commit asserts it (`merge.write_existing(asserted=True)`)."""
        if branch is not None:
            table = branch_view(self, spec, table, frame, branch)
        if window is not None and table is not None and spec.watermark:
            window = aligned_to_field(window, table.schema(), spec.watermark)
        plan = plan_write(spec, state_of(table), window, partition=partition)
        self.capabilities.check_plan(spec, plan)  # a write mode without a handler
        if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
            check_in_window(spec, frame, window)
        props = summary_properties(spec, plan, run_id, summary)
        if table is None:
            result = create_table(self.tables, spec, plan, frame, props, fence=fence)
            # the created table, for this process's next write (still under the lock)
            self.tables.remember(spec, self.load(spec) if branch is None else None)
            return result
        usable = pre if pre is not None and pre.fits(table) else None
        result = write_existing(
            spec,
            plan,
            table,
            frame,
            props,
            pre=usable,
            fence=fence,
            branch=branch or MAIN_BRANCH,
            consumed=self._consumed(spec.name),
            asserted=remembered,
        )
        # its commit updated `table` in place (a branch's: a view, not kept)
        self.tables.remember(spec, table if branch is None else None)
        return result

    def _from_memory(
        self,
        spec: DatasetSpec,
        table: Table,
        attempt: Callable[..., WriteResult],
        pre: Prewritten | None,
    ) -> WriteResult | None:
        """The write planned on `table` as this process's last write left it, without loading
        it; None when the table moved since (another engine's commit: its requirements failed,
        or a file it planned from is gone; or a plan that commits nothing, which no requirement
        checks, met a table that moved), with nothing committed — the caller then loads the
        table and plans the whole write again, once."""
        location = table.metadata_location
        try:
            result = attempt(table, pre=pre, remembered=True)
        except (LockLost, FilesRemoved):
            raise
        except (WriteConflict, FileNotFoundError, NoSuchTableError):
            self.tables.contended(spec, by_others=True)
            return None
        if table.metadata_location != location:
            return result  # committed: the catalog checked the plan's base
        # nothing committed: a plan on the table as it is now? (one load, as without memory)
        now = self.load(spec)
        if now is not None and now.metadata_location == location:
            return result
        self.tables.contended(spec, by_others=True)
        return None

    def write_range(
        self,
        spec: DatasetSpec,
        items: Iterator[tuple[PartitionSlice, Callable[[], Any]]],
        *,
        run_id: str | None = None,
        ahead: LoadedAhead | None = None,
    ) -> RangeWrite:
        """A range run's partitions of a `replace` dataset (`range_write.combines`): each
        computed and written to files in turn, then at most one load, one lock and one commit
        replacing every slice: `range_write.write_range` (`ahead`: the table `load_ahead`
        loaded while the caller computed the first partition)."""
        return write_range(
            self, spec, items, capabilities=self.capabilities, run_id=run_id, ahead=ahead
        )

    def load_ahead(self, spec: DatasetSpec) -> LoadedAhead:
        """The table a range run of `spec` would load before its first partition, loaded now,
        for a caller to compute that partition meanwhile (on another thread) and hand to
        `write_range`: nothing is loaded when this process's last write left the table (the
        run plans from that)."""
        last = self.tables.as_written(spec)
        return loaded_ahead(last if last is not None else self.tables.load(spec))

    def _consumed(self, dataset: str) -> Callable[[], bool]:
        """Whether a downstream consumes `dataset`'s changes, asked at most once, when needed."""
        lookup = self.change_consumers
        return cache(lambda: lookup is not None and lookup(dataset))

    def replace_streaming(self, spec: DatasetSpec, batches: Any, **options: Any) -> WriteResult:
        """Replace the whole table with batches written to data files as they arrive (one batch
        in memory, one snapshot at the end): `streaming.replace_streaming`."""
        return replace_streaming(self, spec, batches, **options)

    # -- reading (`table/reads.py`) ----------------------------------------------------------

    def read(
        self,
        spec: DatasetSpec | str,
        *,
        as_of: int | datetime | None = None,
        **options: Unpack[ReadOptions],
    ) -> pl.DataFrame:
        """The table's rows (optionally only a window, only some columns), or a past version's
        (`as_of`: a snapshot id or a timezone-aware time), as polars: `reads.read`."""
        return reads.read(self.tables, spec, as_of=as_of, **options)

    def snapshot_as_of(
        self, spec: DatasetSpec | str, as_of: int | datetime, *, table: Table | None = None
    ) -> int:
        """The snapshot id `as_of` names in the dataset's table: `reads.snapshot_as_of`."""
        return reads.snapshot_as_of(self.tables, spec, as_of, table=table)

    def find_marker(
        self, spec: DatasetSpec | str, marker: str, *, ref: str = MAIN_BRANCH
    ) -> int | None:
        """The snapshot of `ref`'s history carrying the window attempt `marker`, if any."""
        return reads.find_marker(self.tables, spec, marker, ref=ref)

    def last_summary(
        self, spec: DatasetSpec | str, key: str, *, ref: str = MAIN_BRANCH
    ) -> tuple[int, str] | None:
        """The newest snapshot of `ref`'s history carrying the summary property `key`, and its
        value: `reads.last_summary`."""
        return reads.last_summary(self.tables, spec, key, ref=ref)

    # -- table maintenance (`store.maintenance`; these are its methods, kept on the store) -----

    def compact(self, spec: DatasetSpec, **options: Any) -> CompactionResult:
        """`store.maintenance.compact` (`maintenance/compaction.py`)."""
        return self.maintenance.compact(spec, **options)

    def expire_snapshots(self, spec: DatasetSpec, **options: Any) -> ExpiryResult:
        """`store.maintenance.expire_snapshots` (`maintenance/expiry.py`)."""
        return self.maintenance.expire_snapshots(spec, **options)

    def remove_orphans(self, spec: DatasetSpec, **options: Any) -> OrphanResult:
        """`store.maintenance.remove_orphans` (`maintenance/orphans.py`)."""
        return self.maintenance.remove_orphans(spec, **options)
