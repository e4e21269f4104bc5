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
(the model node) streams every batch to files before the lock the same way.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThan,
    LessThanOrEqual,
)
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.types import DateType, PrimitiveType, TimestampType, TimestamptzType

from pipeline_output import __version__
from pipeline_output.errors import (
    BadInput,
    DatasetNotWritten,
    EmptyComputeRefused,
    InvalidArgument,
    WriteConflict,
)
from pipeline_output.frames import check_in_window, check_keys, to_polars
from pipeline_output.locks import AdvisoryLock, LockStats
from pipeline_output.plan import TargetState, WritePlan, plan_write
from pipeline_output.result import WriteResult
from pipeline_output.spec import DatasetSpec
from pipeline_output.stores.iceberg_files import DataFileWriter
from pipeline_output.stores.iceberg_schema import Evolution, initial_schema, plan_evolution
from pipeline_output.windows import Window

PROPERTY_PREFIX = "pipeline-output."
TABLE_PROPERTIES = {
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": "1",
    "write.target-file-size-bytes": str(512 * 1024 * 1024),
    "commit.retry.num-retries": "10",
    "commit.retry.min-wait-ms": "50",
    "commit.retry.max-wait-ms": "5000",
}
_DEFAULT_LOCK: Any = object()
_READ_THREADS = 4
_POS = "__po_pos__"  # every internal column name starts with frames.RESERVED_PREFIX
_NEW = "__po_new__"  # the compute's value of column `c` in a merge join is `__po_new__c`


def summary_properties(
    spec: DatasetSpec, plan: WritePlan, run_id: str | None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The namespaced properties every snapshot of ours carries."""
    props = {
        f"{PROPERTY_PREFIX}dataset": spec.name,
        f"{PROPERTY_PREFIX}strategy": spec.strategy,
        f"{PROPERTY_PREFIX}write-mode": plan.write_mode,
        f"{PROPERTY_PREFIX}first-deploy": str(plan.first_deploy).lower(),
        f"{PROPERTY_PREFIX}run-id": run_id or "",
        f"{PROPERTY_PREFIX}version": __version__,
    }
    if plan.window is not None:
        props[f"{PROPERTY_PREFIX}window"] = str(plan.window)
        props[f"{PROPERTY_PREFIX}window-key"] = plan.window.to_key()
    for key, value in (extra or {}).items():
        props[f"{PROPERTY_PREFIX}{key}"] = value
    return props


@dataclass
class _Changes:
    """What a merge decided: files to drop, frames to write as new files, and the row counts."""

    deleted_files: list[DataFile] = field(default_factory=list)
    new_frames: list[pl.DataFrame] = field(default_factory=list)
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    preserved: int = 0
    skipped: int = 0

    @property
    def noop(self) -> bool:
        return not self.deleted_files and not any(f.height for f in self.new_frames)


_AS_IS_MODES = ("append", "replace", "append_new")


@dataclass
class _Prewritten:
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
    def of(cls, table: Table, frame: pl.DataFrame, files: list[DataFile]) -> _Prewritten:
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
            _delete_quietly(self.io, data_file.file_path)
        self.files = []


@dataclass
class PreparedWrite:
    """A checked frame and, when the strategy allows, its data files written ahead of the lock."""

    spec: DatasetSpec
    window: Window | None
    frame: pl.DataFrame
    pre: _Prewritten | None

    @property
    def files_ready(self) -> int:
        """How many data files were written ahead."""
        return len(self.pre.files) if self.pre is not None else 0

    def discard(self) -> None:
        """Delete the pre-written files unless a commit was attempted with them."""
        if self.pre is not None:
            self.pre.discard()


class IcebergStore:
    """Writes and reads datasets as Iceberg tables `<namespace>.<dataset name>` of one catalog.

    Same-table writers are serialized with a Postgres advisory lock (default: on the control-plane
    Postgres from settings). Pass `lock=None` to opt out — every write then warns that concurrent
    writers are unsafe.
    """

    def __init__(self, catalog: Catalog, namespace: str, *, lock: Any = _DEFAULT_LOCK) -> None:
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
        return _state_of(self.load(spec))

    def plan(self, spec: DatasetSpec, *, window: Window | None = None) -> WritePlan:
        """The write plan a write would follow now (dry run: reads table metadata only)."""
        return plan_write(spec, self.target_state(spec), window)

    # -- reading -----------------------------------------------------------------------------

    def read(
        self,
        spec: DatasetSpec | str,
        *,
        window: Window | None = None,
        columns: Sequence[str] | None = None,
        watermark: str | None = None,
    ) -> pl.DataFrame:
        """The table's rows (optionally only a window, only some columns) as polars."""
        table = self.load(spec)
        if table is None:
            raise DatasetNotWritten(f"dataset {self.table_name(spec)!r} has no Iceberg table yet")
        row_filter: BooleanExpression = AlwaysTrue()
        if window is not None:
            wm = watermark or (spec.watermark if isinstance(spec, DatasetSpec) else None)
            if wm is None:
                raise InvalidArgument(
                    f"reading a window of {self.table_name(spec)} needs its watermark"
                )
            row_filter = window_filter(wm, window, schema=table.schema())
        scan = table.scan(
            row_filter=row_filter, selected_fields=tuple(columns) if columns else ("*",)
        )
        return _to_polars(scan.to_arrow())

    # -- writing -----------------------------------------------------------------------------

    def prepare(
        self, spec: DatasetSpec, data: Any, *, window: Window | None = None
    ) -> PreparedWrite:
        """Check `data` and, where the strategy writes it as it is, write its data files now.

        Takes no lock: callers that serialize writes themselves (the window apply lock) prepare
        before their own critical section and pass the result to `write(prepared=...)`, which
        re-validates the files under the table's lock. `PreparedWrite.discard()` deletes files a
        write did not commit (`write` does it itself).
        """
        frame = check_keys(spec, to_polars(spec, data))
        return PreparedWrite(
            spec=spec, window=window, frame=frame, pre=self._prewrite(spec, frame, window)
        )

    def write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        window: Window | None = None,
        run_id: str | None = None,
        summary: dict[str, str] | None = None,
        prepared: PreparedWrite | None = None,
    ) -> WriteResult:
        """Probe, plan and write `data` for `spec` in one commit (none when nothing changes).

        With `prepared` (from `prepare` with the same spec and window) its checked frame and
        pre-written files are used instead of `data`.
        """
        started = time.perf_counter()
        if prepared is not None and (prepared.spec != spec or prepared.window != window):
            raise InvalidArgument(
                f"dataset {spec.name!r}: the prepared write is for another spec or window"
            )
        prep = prepared if prepared is not None else self.prepare(spec, data, window=window)
        frame, pre = prep.frame, prep.pre
        try:
            with self._hold(spec) as stats:
                table = self.load(spec)
                if window is not None and table is not None and spec.watermark:
                    window = aligned_to_field(window, table.schema(), spec.watermark)
                plan = plan_write(spec, _state_of(table), window)
                if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
                    check_in_window(spec, frame, window)
                props = summary_properties(spec, plan, run_id, summary)
                if table is None:
                    result = self._create(spec, plan, frame, props, fence=stats.verify)
                else:
                    usable = pre if pre is not None and pre.fits(table) else None
                    result = self._write_existing(
                        spec, plan, table, frame, props, pre=usable, fence=stats.verify
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

    def _prewrite(
        self, spec: DatasetSpec, frame: pl.DataFrame, window: Window | None
    ) -> _Prewritten | None:
        """Write the frame's data files before the lock when the strategy writes it as it is.

        Decided on the table as it is now; re-checked inside the lock (`_Prewritten.fits`). Input
        checks that depend on the plan run here too, so bad input still writes nothing.
        """
        if frame.height == 0:
            return None
        table = self.load(spec)
        if table is None:
            return None
        plan = plan_write(spec, _state_of(table), window)
        if plan.write_mode not in _AS_IS_MODES:
            return None
        if window is not None and plan.delete_scope in ("window", "absent_keys_in_window"):
            check_in_window(spec, frame, window)
        if not plan_evolution(spec, table.schema(), frame).empty:
            return None  # the schema changes: written inside the lock, after the evolution
        aligned = _sorted(_align(frame, table.schema()), spec)
        pre = _Prewritten.of(table, aligned, [])
        writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
        try:
            pre.files = writer.write(aligned)
        except BaseException:
            for path in writer.written:
                _delete_quietly(table.io, path)
            raise
        return pre

    def replace_streaming(
        self,
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
        current = self.load(spec)
        if current is not None and plan_evolution(spec, current.schema(), first).empty:
            return self._replace_streaming_unlocked(
                spec,
                current,
                first,
                iterator,
                run_id=run_id,
                summary=summary,
                finalize_summary=finalize_summary,
                started=started,
            )
        with self._hold(spec) as stats:
            table = self.load(spec)
            plan = plan_write(replace(spec, strategy="replace"), _state_of(table), None)
            props = summary_properties(spec, plan, run_id, summary)
            if table is None:
                self._ensure_namespace()
                schema, order = initial_schema(spec, first)
                tx: Transaction = self.catalog.create_table_transaction(
                    self.identifier(spec),
                    schema=schema,
                    sort_order=order,
                    properties=TABLE_PROPERTIES,
                )
                deleted: list[DataFile] = []
                total_before = 0
            else:
                tx = table.transaction()
                _evolve(tx, plan_evolution(spec, table.schema(), first))
                deleted = (
                    [t.file for t in table.scan().plan_files()] if table.current_snapshot() else []
                )
                total_before = _total_records(table)
            writer = DataFileWriter(tx.table_metadata, tx._table.io, write_id=uuid.uuid4())
            written: list[DataFile] = []
            try:
                rows = _stream_batches(
                    spec, first, iterator, writer, tx.table_metadata.schema(), sink=written
                )
            except BaseException:
                for path in writer.written:
                    _delete_quietly(tx._table.io, path)
                raise
            if finalize_summary is not None:
                props.update({f"{PROPERTY_PREFIX}{k}": v for k, v in finalize_summary().items()})
            new_table = _commit(
                tx,
                props,
                deleted,
                [],
                dataset=spec.name,
                force=True,
                ready=written,
                fence=stats.verify,
            )
            snap = new_table.current_snapshot()
        return self._replaced(
            spec, plan, rows, total_before, snap, len(deleted), len(writer.written), started, stats
        )

    def _replace_streaming_unlocked(
        self,
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
        pre = _Prewritten.of(current, first.head(0), [])
        writer = DataFileWriter(current.metadata, current.io, write_id=uuid.uuid4())
        try:
            try:
                rows = _stream_batches(spec, first, rest, writer, current.schema(), sink=pre.files)
            except BaseException:
                for path in writer.written:
                    _delete_quietly(current.io, path)
                pre.files = []
                raise
            extra = finalize_summary() if finalize_summary is not None else {}
            with self._hold(spec) as stats:
                table = self.load(spec)
                if table is None or not pre.fits(table):
                    raise WriteConflict(
                        f"dataset {spec.name!r}: {self.table_name(spec)} was dropped, recreated or "
                        "changed its schema or partitioning while the batches were written; "
                        "nothing was committed — run it again"
                    )
                plan = plan_write(replace(spec, strategy="replace"), _state_of(table), None)
                props = summary_properties(spec, plan, run_id, summary)
                props.update({f"{PROPERTY_PREFIX}{k}": v for k, v in extra.items()})
                deleted = (
                    [t.file for t in table.scan().plan_files()] if table.current_snapshot() else []
                )
                total_before = _total_records(table)
                pre.handed_to_commit = True
                new_table = _commit(
                    table.transaction(),
                    props,
                    deleted,
                    [],
                    dataset=spec.name,
                    force=True,
                    ready=pre.files,
                    fence=stats.verify,
                )
                snap = new_table.current_snapshot()
        finally:
            pre.discard()
        return self._replaced(
            spec, plan, rows, total_before, snap, len(deleted), len(pre.files), started, stats
        )

    def _replaced(
        self,
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
        return WriteResult(
            dataset=spec.name,
            write_mode="replace",
            first_deploy=plan.first_deploy,
            rows_in=rows,
            rows_inserted=rows,
            rows_deleted=total_before,
            rows_total_after=rows,
            snapshot_id=snap.snapshot_id if snap else None,
            files_rewritten=files_rewritten,
            files_added=files_added,
            duration_s=time.perf_counter() - started,
            lock_wait_s=stats.wait_s,
            lock_held_s=stats.held_s,
            table=self.table_name(spec),
        )

    def _hold(self, spec: DatasetSpec) -> AbstractContextManager[LockStats]:
        lock = self._lock
        if lock is _DEFAULT_LOCK:
            from pipeline_output.settings import get_settings

            lock = self._lock = AdvisoryLock(get_settings().control_plane_url())
        if lock is None:
            warnings.warn(
                f"dataset {spec.name!r}: IcebergStore(lock=None) — concurrent writers of "
                f"{self.table_name(spec)} are unsafe (no advisory lock)",
                stacklevel=3,
            )
            return nullcontext(LockStats(key=self.table_name(spec)))
        return lock.hold(f"iceberg:{self.table_name(spec)}")  # type: ignore[no-any-return,unused-ignore]

    def _ensure_namespace(self) -> None:
        if not self._namespace_checked:
            self.catalog.create_namespace_if_not_exists(self.namespace)
            self._namespace_checked = True

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
        self._ensure_namespace()
        schema, order = initial_schema(spec, frame)
        tx = self.catalog.create_table_transaction(
            self.identifier(spec), schema=schema, sort_order=order, properties=TABLE_PROPERTIES
        )
        data = _sorted(frame, spec)
        try:
            table = _commit(
                tx, props, deleted=[], frames=[data], dataset=spec.name, force=True, fence=fence
            )
        except TableAlreadyExistsError as exc:
            raise WriteConflict(
                f"dataset {spec.name!r}: {self.table_name(spec)} was created by another writer "
                "after this write was planned; nothing was committed — run it again"
            ) from exc
        snapshot = table.current_snapshot()
        return WriteResult(
            dataset=spec.name,
            write_mode=plan.write_mode,
            first_deploy=True,
            rows_in=frame.height,
            rows_inserted=frame.height,
            rows_total_after=frame.height,
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
        pre: _Prewritten | None = None,
        fence: Callable[[], None] | None = None,
    ) -> WriteResult:
        tx = table.transaction()
        evolution = plan_evolution(spec, table.schema(), frame)
        _evolve(tx, evolution)
        schema = tx.table_metadata.schema()
        if pre is not None and evolution.empty:
            frame = pre.frame  # already aligned and sorted, and its files are written
        else:
            pre = None
            frame = _sorted(_align(frame, schema), spec)
        total_before = _total_records(table)
        merge = _Merge(table=table, tx=tx, spec=spec, frame=frame, schema=schema)
        changes = merge.run(plan)
        if frame.height == 0 and changes.deleted and not spec.allow_empty:
            raise EmptyComputeRefused(
                f"dataset {spec.name!r}: the compute returned no rows and a {plan.write_mode} would "
                f"delete {changes.deleted} target row(s); set allow_empty=True to allow it "
                "(nothing was written)"
            )
        force = plan.first_deploy
        snapshot_id: int | None = None
        if not changes.noop or force:
            frames, ready = changes.new_frames, []
            if pre is not None and frames and frames[0] is frame:
                # the merge writes the computed frame as it is: its files are the pre-written ones
                frames, ready = frames[1:], pre.files
                pre.handed_to_commit = True
            new_table = _commit(
                tx,
                props,
                changes.deleted_files,
                frames,
                dataset=spec.name,
                force=force,
                ready=ready,
                fence=fence,
                blind_retry=plan.write_mode == "append" and not changes.deleted_files,
            )
            snap = new_table.current_snapshot()
            snapshot_id = snap.snapshot_id if snap else None
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
        return WriteResult(
            dataset=spec.name,
            write_mode=plan.write_mode,
            first_deploy=plan.first_deploy,
            rows_in=frame.height,
            rows_inserted=changes.inserted,
            rows_updated=changes.updated,
            rows_deleted=changes.deleted,
            rows_unchanged=changes.unchanged,
            rows_preserved=changes.preserved,
            rows_skipped=changes.skipped,
            rows_total_after=total_before + changes.inserted - changes.deleted,
            snapshot_id=snapshot_id,
            files_rewritten=len(changes.deleted_files),
            files_added=sum(1 for f in changes.new_frames if f.height),
        )


# -- the merges ------------------------------------------------------------------------------


@dataclass
class _Merge:
    """Decides, file by file, what a write mode changes in an existing table."""

    table: Table
    tx: Transaction
    spec: DatasetSpec
    frame: pl.DataFrame
    schema: Schema

    def run(self, plan: WritePlan) -> _Changes:
        handlers: dict[str, Callable[[WritePlan], _Changes]] = {
            "replace": self._replace,
            "append": self._append,
            "append_new": self._append_new,
            "upsert": self._upsert_or_sync,
            "sync": self._upsert_or_sync,
        }
        return handlers[plan.write_mode](plan)

    # -- simple modes

    def _append(self, plan: WritePlan) -> _Changes:
        total = _total_records(self.table)
        return _Changes(new_frames=[self.frame], inserted=self.frame.height, preserved=total)

    def _replace(self, plan: WritePlan) -> _Changes:
        tasks = self._tasks()
        if plan.delete_scope == "all" or plan.window is None:
            deleted = sum(t.file.record_count for t in tasks)
            return _Changes(
                deleted_files=[t.file for t in tasks],
                new_frames=[self.frame],
                inserted=self.frame.height,
                deleted=deleted,
            )
        # Rows inside the window are replaced. For a keyed dataset a computed key that exists
        # outside the window (its row moved into this window) is replaced too: keys stay unique.
        window, wm = plan.window, self._watermark()
        pk = list(self.spec.primary_key)
        by_key = {id(t) for t in self._prune_by_keys(tasks)} if pk else set()
        changes = _Changes(new_frames=[self.frame], inserted=self.frame.height)
        straddling: list[FileScanTask] = []
        for task in tasks:
            relation = _window_relation(task, self.schema, wm, window)
            if relation == "outside" and id(task) not in by_key:
                changes.preserved += task.file.record_count
            elif relation == "inside" and not task.delete_files:
                changes.deleted_files.append(task.file)
                changes.deleted += task.file.record_count
            else:
                straddling.append(task)
        keys = self.frame.select(pk).with_columns(pl.lit(True).alias("__po_hit__")) if pk else None
        for task, rows in zip(straddling, self._read(straddling), strict=True):
            drop = rows.select(window.contains(wm, rows.schema[wm]).fill_null(False)).to_series()
            if keys is not None:
                hit = rows.select(pk).join(keys, on=pk, how="left", nulls_equal=True)
                drop = drop | hit.get_column("__po_hit__").is_not_null()
            n_drop = int(drop.sum())
            if n_drop == 0:
                changes.preserved += rows.height
                continue
            kept = rows.filter(~drop)
            changes.deleted_files.append(task.file)
            changes.deleted += n_drop
            changes.preserved += kept.height
            changes.new_frames.append(_sorted(kept, self.spec))
        return changes

    def _append_new(self, plan: WritePlan) -> _Changes:
        pk = list(self.spec.primary_key)
        candidates = self._prune_by_keys(self._tasks())
        existing = self._read(candidates, columns=pk)
        keys = pl.concat(existing) if existing else self.frame.head(0).select(pk)
        fresh = self.frame.join(keys, on=pk, how="anti", nulls_equal=True)
        skipped = self.frame.height - fresh.height
        if skipped == 0:
            fresh = self.frame  # written as it is (its files may already exist: see _Prewritten)
        total = _total_records(self.table)
        return _Changes(
            new_frames=[fresh], inserted=fresh.height, skipped=skipped, preserved=total - skipped
        )

    # -- the copy-on-write merge behind upsert and sync

    def _upsert_or_sync(self, plan: WritePlan) -> _Changes:
        spec, frame = self.spec, self.frame
        pk = list(spec.primary_key)
        scope = plan.delete_scope  # none | absent_keys | absent_keys_in_window
        window = plan.window if scope == "absent_keys_in_window" else None
        wm = self._watermark() if window is not None else None
        tasks = self._tasks()
        if scope == "absent_keys":
            candidates = tasks
        elif window is not None and wm is not None:
            by_key = {id(t) for t in self._prune_by_keys(tasks)}
            candidates = [
                t
                for t in tasks
                if id(t) in by_key or _window_relation(t, self.schema, wm, window) != "outside"
            ]
        else:
            candidates = self._prune_by_keys(tasks)
        changes = _Changes()
        untouched = [t for t in tasks if t not in candidates]
        changes.preserved += sum(t.file.record_count for t in untouched)

        # Key pass: with several candidates, read only keys (+ watermark) to find files that change.
        if len(candidates) > 1:
            cols = pk + ([wm] if wm else [])
            key_frames = self._read(candidates, columns=cols)
            relevant = []
            for task, keys in zip(candidates, key_frames, strict=True):
                matched = keys.join(frame.select(pk), on=pk, how="semi", nulls_equal=True).height
                absent = self._absent(keys, scope, window, wm)
                if matched or absent:
                    relevant.append(task)
                else:
                    changes.preserved += keys.height
            candidates = relevant

        matched_keys: list[pl.DataFrame] = []
        value_cols = [c for c in _schema_names(self.schema) if c not in pk]
        # the compute's value columns under reserved names: no user column can collide with them
        incoming = frame.rename({c: _NEW + c for c in frame.columns if c not in pk})
        for task, rows in zip(candidates, self._read(candidates), strict=True):
            rows = rows.with_row_index(_POS)
            joined = rows.join(incoming, on=pk, how="inner", nulls_equal=True)
            if joined.height:
                matched_keys.append(joined.select(pk))
            changed = joined.filter(_differs(joined, value_cols))
            absent_mask = self._absent_mask(rows, scope, window, wm)
            n_absent = int(absent_mask.sum()) if absent_mask is not None else 0
            if changed.height == 0 and n_absent == 0:
                changes.unchanged += joined.height
                changes.preserved += rows.height - joined.height
                continue
            content = _replace_rows(rows, changed, value_cols, pk)
            if absent_mask is not None:
                content = content.filter(~absent_mask)
            content = content.drop(_POS)
            changes.deleted_files.append(task.file)
            changes.new_frames.append(content)
            changes.updated += changed.height
            changes.unchanged += joined.height - changed.height
            changes.deleted += n_absent
            changes.preserved += rows.height - joined.height - n_absent

        all_matched = pl.concat(matched_keys) if matched_keys else frame.head(0).select(pk)
        inserts = frame.join(all_matched, on=pk, how="anti", nulls_equal=True)
        if inserts.height:
            changes.new_frames.append(inserts)
            changes.inserted = inserts.height
        return changes

    def _absent_mask(
        self, rows: pl.DataFrame, scope: str, window: Window | None, wm: str | None
    ) -> pl.Series | None:
        """Target rows a sync deletes: key absent from the compute (and inside the window)."""
        if scope == "none":
            return None
        pk = list(self.spec.primary_key)
        present = (
            rows.select(pk)
            .join(
                self.frame.select(pk).with_columns(pl.lit(True).alias("__po_hit__")),
                on=pk,
                how="left",
                nulls_equal=True,
            )["__po_hit__"]
            .is_null()
        )
        if window is not None and wm is not None:
            present = (
                present
                & rows.select(window.contains(wm, rows.schema[wm]).fill_null(False)).to_series()
            )
        return present

    def _absent(self, keys: pl.DataFrame, scope: str, window: Window | None, wm: str | None) -> int:
        mask = self._absent_mask(keys, scope, window, wm)
        return int(mask.sum()) if mask is not None else 0

    # -- file planning and reading

    def _tasks(self) -> list[FileScanTask]:
        if self.table.current_snapshot() is None:
            return []
        return list(self.table.scan().plan_files())

    def _watermark(self) -> str:
        wm = self.spec.watermark
        # the table as it was before this write (a column added now holds no watermarks yet)
        if wm is None or wm not in _schema_names(self.table.schema()):
            raise BadInput(
                f"dataset {self.spec.name!r}: a windowed write needs the watermark column "
                f"{wm!r} in the table"
            )
        return wm

    def _prune_by_keys(self, tasks: list[FileScanTask]) -> list[FileScanTask]:
        """Files whose key statistics admit at least one of the compute's keys."""
        if not tasks or self.frame.height == 0:
            return []
        first = self.spec.primary_key[0]
        field = self.table.schema().find_field(first)
        if not isinstance(field.field_type, PrimitiveType):
            return tasks
        keys = _physical(self.frame.get_column(first), field.field_type).unique().sort()
        out = []
        for task in tasks:
            lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
            hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
            if lo_b is None or hi_b is None:
                out.append(task)
                continue
            lo = from_bytes(field.field_type, lo_b)
            hi = from_bytes(field.field_type, hi_b)
            try:
                i = int(keys.search_sorted(lo, side="left"))
                j = int(keys.search_sorted(hi, side="right"))
            except (TypeError, pl.exceptions.PolarsError):
                out.append(task)
                continue
            if j > i:
                out.append(task)
        return out

    def _read(
        self, tasks: list[FileScanTask], *, columns: Sequence[str] | None = None
    ) -> list[pl.DataFrame]:
        """Read each task into its own frame (all columns of the current schema, or `columns`)."""
        if not tasks:
            return []
        read_schema = self.table.schema()
        if columns is not None:
            read_schema = read_schema.select(*columns)

        def one(task: FileScanTask) -> pl.DataFrame:
            fast = _read_local(task, read_schema)
            if fast is None:
                scan = ArrowScan(self.table.metadata, self.table.io, read_schema, AlwaysTrue())
                fast = _to_polars(scan.to_table([task]))
            return _align(fast, self.schema, only=columns)

        if len(tasks) == 1:
            return [one(tasks[0])]
        with ThreadPoolExecutor(max_workers=min(_READ_THREADS, len(tasks))) as pool:
            return list(pool.map(one, tasks))


# -- helpers ---------------------------------------------------------------------------------


def _replace_rows(
    rows: pl.DataFrame, changed: pl.DataFrame, value_cols: list[str], pk: list[str]
) -> pl.DataFrame:
    """`rows` with the `changed` rows' new values put in place (rows keep their file order)."""
    if changed.height == 0 or not value_cols:
        return rows
    positions = changed.get_column(_POS)
    try:
        return rows.with_columns(
            [
                rows.get_column(c).clone().scatter(positions, changed.get_column(_NEW + c))
                for c in value_cols
            ]
        )
    except (pl.exceptions.PolarsError, TypeError):
        # Types scatter cannot take (nested): replace rows by position and restore the order.
        drop = pl.zeros(rows.height, dtype=pl.Boolean, eager=True).scatter(positions, True)
        updated = changed.select([_POS, *pk, *[pl.col(_NEW + c).alias(c) for c in value_cols]])
        return pl.concat([rows.filter(~drop), updated.select(rows.columns)]).sort(_POS)


def _read_local(task: FileScanTask, schema: Schema) -> pl.DataFrame | None:
    """Read a local data file straight with polars when that is provably the same as a scan.

    Only for files without delete files whose Parquet field ids name the same columns as the
    table schema (no renames); anything else goes through pyiceberg's `ArrowScan`.
    """
    path = task.file.file_path
    if task.delete_files or not (path.startswith("file://") or path.startswith("/")):
        return None
    local = path.removeprefix("file://")
    try:
        file_schema = pq.read_schema(local)
    except (OSError, pa.ArrowException):
        return None
    ids = {}
    for f in file_schema:
        raw = (f.metadata or {}).get(b"PARQUET:field_id")
        if raw is None:
            return None
        ids[f.name] = int(raw)
    wanted = []
    for f in schema.fields:
        if f.name in ids:
            if ids[f.name] != f.field_id:
                return None
            wanted.append(f.name)
        elif f.field_id in ids.values():
            return None
    return pl.read_parquet(local, columns=wanted)


def _evolve(tx: Transaction, evolution: Evolution) -> None:
    """Stage the schema changes in the write's own transaction (one commit with the data)."""
    if evolution.empty:
        return
    with tx.update_schema() as update:
        for name, new_type in evolution.add:
            update.add_column(name, new_type)
        for name, wider in evolution.widen:
            update.update_column(name, field_type=wider)


def _state_of(table: Table | None) -> TargetState:
    if table is None:
        return TargetState(exists=False, has_snapshot=False)
    snap = table.current_snapshot()
    return TargetState(
        exists=True,
        has_snapshot=snap is not None,
        snapshot_id=snap.snapshot_id if snap else None,
        total_rows=_total_records(table),
    )


def _total_records(table: Table) -> int:
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    return int(snap.summary.get("total-records", "0") or 0)


def _schema_names(schema: Schema) -> list[str]:
    return [f.name for f in schema.fields]


def _to_polars(table: pa.Table) -> pl.DataFrame:
    return pl.from_arrow(table)  # type: ignore[return-value]


def _align(
    frame: pl.DataFrame, schema: Schema, *, only: Sequence[str] | None = None
) -> pl.DataFrame:
    """`frame` with the schema's columns (missing ones null) cast to the schema's polars types."""
    target = _to_polars(schema.as_arrow().empty_table()).schema
    names = list(only) if only is not None else list(target)
    exprs = []
    for name in names:
        dtype = target[name]
        if name in frame.columns:
            col = pl.col(name)
            exprs.append(col if frame.schema[name] == dtype else col.cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return frame.select(exprs)


def _sorted(frame: pl.DataFrame, spec: DatasetSpec) -> pl.DataFrame:
    cols = [c for c in spec.sort_columns if c in frame.columns]
    if not cols or frame.height < 2:
        return frame
    if len(cols) == 1 and frame.get_column(cols[0]).is_sorted():
        return frame
    return frame.sort(cols, nulls_last=False, maintain_order=True)


def _differs(joined: pl.DataFrame, value_cols: list[str]) -> pl.Expr:
    """Rows whose values differ between the target (`c`) and the compute (`__po_new__c`).

    Nulls equal nulls and NaN equals NaN, so an unchanged row with NaN is never rewritten.
    """
    if not value_cols:
        return pl.lit(False)
    return pl.any_horizontal(
        [~pl.col(c).eq_missing(pl.col(_NEW + c)) for c in value_cols if _NEW + c in joined.columns]
        or [pl.lit(False)]
    )


def _physical(series: pl.Series, iceberg_type: PrimitiveType) -> pl.Series:
    """Key values in the representation Iceberg bounds decode to (micros, days, ...)."""
    if isinstance(iceberg_type, (TimestampType, TimestamptzType)):
        return series.dt.epoch("us")
    if isinstance(iceberg_type, DateType):
        return series.cast(pl.Int32)
    return series


def _bound_value(value: Any, iceberg_type: PrimitiveType) -> Any:
    if isinstance(iceberg_type, (TimestampType, TimestamptzType)) and isinstance(value, datetime):
        return pl.Series([value]).dt.epoch("us")[0]
    if isinstance(iceberg_type, DateType) and isinstance(value, date):
        return pl.Series([value]).cast(pl.Int32)[0]
    return value


def _window_relation(task: FileScanTask, schema: Schema, wm: str, window: Window) -> str:
    """`inside`, `outside` or `straddles`: where a file's watermark range lies against a window."""
    field = schema.find_field(wm)
    ftype = field.field_type
    lo_b = task.file.lower_bounds.get(field.field_id) if task.file.lower_bounds else None
    hi_b = task.file.upper_bounds.get(field.field_id) if task.file.upper_bounds else None
    nulls = (task.file.null_value_counts or {}).get(field.field_id, 0)
    if lo_b is None or hi_b is None or not isinstance(ftype, PrimitiveType):
        return "straddles"
    lo, hi = from_bytes(ftype, lo_b), from_bytes(ftype, hi_b)
    w_high = _bound_value(window.high, ftype)
    w_low = _bound_value(window.low, ftype) if window.low is not None else None
    if lo > w_high or (w_low is not None and hi <= w_low):
        return "outside"
    if hi <= w_high and (w_low is None or lo > w_low) and not nulls:
        return "inside"
    return "straddles"


def window_filter(
    watermark: str, window: Window, *, schema: Schema | None = None
) -> BooleanExpression:
    """An Iceberg row filter for `low < watermark <= high`.

    With the table's `schema`, datetime bounds are zoned like the watermark field (`timestamptz`
    literals carry `+00:00`, `timestamp` literals none): pyiceberg refuses the other way round.
    """
    if schema is not None:
        window = aligned_to_field(window, schema, watermark)
    high: BooleanExpression = LessThanOrEqual(watermark, _literal(window.high))  # type: ignore[call-arg,arg-type]
    if window.low is None:
        return high
    low: BooleanExpression = GreaterThan(watermark, _literal(window.low))  # type: ignore[call-arg,arg-type]
    return And(low, high)


def aligned_to_field(window: Window, schema: Schema, watermark: str) -> Window:
    """The window with bounds zoned like the table's watermark field (unchanged otherwise)."""
    try:
        field = schema.find_field(watermark)
    except ValueError:
        return window
    if isinstance(field.field_type, TimestamptzType):
        return window.aligned(aware=True)
    if isinstance(field.field_type, TimestampType):
        return window.aligned(aware=False)
    return window


def _literal(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value


def _commit(
    tx: Transaction,
    props: dict[str, str],
    deleted: list[DataFile],
    frames: list[pl.DataFrame],
    *,
    dataset: str,
    force: bool,
    ready: Sequence[DataFile] = (),
    fence: Callable[[], None] | None = None,
    blind_retry: bool = False,
) -> Table:
    """Write `frames` as data files and commit them and the `ready` (already written) files with
    `deleted` removed: exactly one snapshot.

    The commit is fenced to the snapshot the write was planned against: the snapshot producer
    asserts the branch head it started from, and unless `blind_retry` is set (plain appends, whose
    rows do not depend on the table's state) a concurrent commit is NOT retried on top of the new
    head — pyiceberg's retry re-applies a fast append without re-checking keys, which duplicated
    keys when a writer outside the lock committed in between. The commit then fails as
    `WriteConflict` and nothing is committed. `fence` (the writer lock's `verify`) runs right
    before the catalog swap: a writer whose lock ended fails with `LockLost`.
    """
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    update = tx.update_snapshot(snapshot_properties=props)
    producer = update.overwrite() if deleted or force else update.fast_append()
    for data_file in ready:
        producer.append_data_file(data_file)
    writer = DataFileWriter(tx.table_metadata, tx._table.io, write_id=producer.commit_uuid)
    for frame in frames:
        for data_file in writer.write(frame):
            producer.append_data_file(data_file)
    for data_file in deleted:
        producer.delete_data_file(data_file)
    _fault_injection("before_commit")
    try:
        if blind_retry:
            producer.commit()  # registers the producer: pyiceberg rebuilds it on a new head
        else:
            tx._apply(*producer._commit())  # staged without retry registration: fenced
        if fence is not None:
            fence()
        return tx.commit_transaction()
    except (CommitFailedException, ValidationException, WriteConflict) as exc:
        # certain: the catalog did not swap, so the files written for this commit are garbage
        with suppress(Exception):
            producer._clean_all_uncommitted()
        for path in [*writer.written, *(f.file_path for f in ready)]:
            _delete_quietly(tx._table.io, path)
        if isinstance(exc, WriteConflict):
            raise
        raise WriteConflict(
            f"dataset {dataset!r}: the table changed after this write was planned "
            f"({type(exc).__name__}: {exc}); nothing was committed — run it again"
        ) from exc


def _stream_batches(
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
        batch = _align(check_keys(spec, to_polars(spec, batch)), schema)
        sink.extend(writer.write(batch))
        rows += batch.height
        batch = next(rest, None)
    return rows


def _delete_quietly(file_io: FileIO, path: str) -> None:
    """Delete a data file nobody references (best effort: doctor lists what is left)."""
    with suppress(OSError, ValueError):
        file_io.delete(path)


def _fault_injection(point: str) -> None:
    """Tests only: with PIPELINE_OUTPUT_FAULT=<point> the process kills itself here (SIGKILL)."""
    from pipeline_output.settings import fault_point

    if fault_point() == point:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


__all__ = [
    "IcebergStore",
    "PreparedWrite",
    "aligned_to_field",
    "summary_properties",
    "window_filter",
]
