"""`expire_snapshots`: old snapshots removed from the table's metadata, and the files only they
referenced deleted (pyiceberg's own `expire_snapshots` deletes no file).

Owns which snapshots go and the cleanup after:

- kept: the `retain_last` newest snapshots, every snapshot younger than `older_than`, the head
  of every branch and tag, the history of every other branch back to where it left main's (an
  audit's publish checks that main is an ancestor of its branch head), and every snapshot whose
  window-attempt marker (`pipeline-output.window-attempt`) belongs to a window the window ledger
  does not record as applied — exactly-once repair (`window_apply.apply_window`) looks for that marker
  to complete a window whose commit landed but whose ledger update did not; without a ledger,
  every snapshot carrying a marker. Repair looks along main's history from its head
  (`find_marker`), so main's history down to the oldest such snapshot is kept too (expiring one
  in between would cut it). Also kept, unless `force`: every snapshot an incremental
  downstream reads its next changes from (`consumer_positions`: the `to` of its newest range in
  the ledger's `consumed_changes`, or further when its own newest marked snapshot says a killed
  run consumed further), like a consumer offset — and the snapshots the caller names (`keep`). The
  decision is taken under the dataset's window apply lock and the
  table's writer lock, so no window is being applied meanwhile;
- the removal is one metadata commit (no new snapshot), fenced to the current snapshot; it also
  records `pipeline-output.last-expiry` (a table property: durable, unlike snapshot summaries),
  `pipeline-output.time-travel-from` when it removes entries of main's snapshot log (time
  lookups before it are refused from then on: `snapshot_log`), and adds the bounded
  `metadata.json` history defaults, so old metadata files go on commit;
- after the commit (without locks) the manifest lists, manifests, data and delete files that the
  expired snapshots referenced and no remaining snapshot references are deleted. A file a writer
  is still writing was never referenced by a snapshot, so it is never among them; what a crash
  leaves behind here is an orphan for `remove_orphans`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertRefSnapshotId, RemoveSnapshotsUpdate

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER
from pipeline_output.contract.windows import WindowLog
from pipeline_output.errors import DatasetNotWritten, InvalidArgument
from pipeline_output.infra.collector import paused
from pipeline_output.infra.locks import AdvisoryLock, LockStats
from pipeline_output.ledger.control_plane import Ledger
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output.stores.iceberg.maintenance.orphans import ManifestReader, delete_paths
from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction, upgrade_properties
from pipeline_output.stores.iceberg.table.changes import CONSUMED_PREFIX, consumed_range
from pipeline_output.stores.iceberg.table.reads import last_summary
from pipeline_output.stores.iceberg.table.snapshot_log import TRAVEL_FROM, expiry_boundary, stamp
from pipeline_output.stores.iceberg.table.tables import DEFAULT_LOCK, PROPERTY_PREFIX

if TYPE_CHECKING:
    from pipeline_output.stores.iceberg.table.tables import HasTables

DEFAULT_OLDER_THAN = timedelta(days=5)
DEFAULT_RETAIN_LAST = 1
LAST_EXPIRY = f"{PROPERTY_PREFIX}last-expiry"  # table property: when, and what it did
_MARKER = f"{PROPERTY_PREFIX}{ATTEMPT_MARKER}"


@dataclass(frozen=True)
class ExpiryPlan:
    """Snapshots to expire, and those kept only because a window repair may need them."""

    expire: list[int] = field(default_factory=list)
    kept_for_repair: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ExpiryResult:
    """What an expiry did (or, with `dry_run`, would do)."""

    dataset: str
    table: str
    dry_run: bool
    snapshots_before: int
    snapshots_expired: int
    kept_for_repair: int
    files_deleted: int  # manifest lists, manifests, data and delete files
    duration_s: float

    def describe(self) -> str:
        """One line for logs and the CLI."""
        verb = "would expire" if self.dry_run else "expired"
        files = "would delete" if self.dry_run else "deleted"
        kept = f", kept {self.kept_for_repair} for window repair" if self.kept_for_repair else ""
        return (
            f"expire: {verb} {self.snapshots_expired} of {self.snapshots_before} snapshot(s)"
            f"{kept}; {files} {self.files_deleted} file(s)"
        )


def plan_expiry(
    metadata: TableMetadata,
    *,
    older_than_ms: int,
    retain_last: int,
    unapplied_windows: set[int] | None,
    keep_ids: Collection[int] = (),
) -> ExpiryPlan:
    """The expiry decision (module docstring); `unapplied_windows` None: no ledger to ask;
    `keep_ids`: snapshots kept whatever their age."""
    snapshots = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    main = _ancestry(metadata, _head(metadata, MAIN_BRANCH))  # newest first
    keep = {ref.snapshot_id for ref in metadata.refs.values()} | set(keep_ids)
    keep |= _branch_histories(metadata, set(main))
    keep.update(s.snapshot_id for s in snapshots[-retain_last:])
    keep.update(s.snapshot_id for s in snapshots if s.timestamp_ms >= older_than_ms)
    repair = {
        s.snapshot_id
        for s in snapshots
        if s.snapshot_id not in keep and _needed_for_repair(s, unapplied_windows)
    }
    # repair looks for a marker along main's history from its head (`find_marker`): keep that
    # history unbroken down to the oldest snapshot a repair may look for
    deepest = max((i for i, sid in enumerate(main) if sid in repair), default=-1)
    repair |= {sid for sid in main[: deepest + 1] if sid not in keep}
    return ExpiryPlan(
        expire=[s.snapshot_id for s in snapshots if s.snapshot_id not in keep | repair],
        kept_for_repair=[s.snapshot_id for s in snapshots if s.snapshot_id in repair],
    )


def _head(metadata: TableMetadata, ref: str) -> int | None:
    found = metadata.refs.get(ref)
    return found.snapshot_id if found is not None else None


def _ancestry(metadata: TableMetadata, snapshot_id: int | None) -> list[int]:
    """`snapshot_id` and its ancestors, newest first (stops where history was expired)."""
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    out: list[int] = []
    while snapshot_id is not None and snapshot_id in by_id and snapshot_id not in out:
        out.append(snapshot_id)
        snapshot_id = by_id[snapshot_id].parent_snapshot_id
    return out


def _branch_histories(metadata: TableMetadata, on_main: set[int]) -> set[int]:
    """Snapshots of every branch other than main, from its head back to where it left main's
    history (included): an audit branch's publish checks that main is an ancestor of its head."""
    keep: set[int] = set()
    for name, ref in metadata.refs.items():
        if name == MAIN_BRANCH or ref.snapshot_ref_type != SnapshotRefType.BRANCH:
            continue
        for snapshot_id in _ancestry(metadata, ref.snapshot_id):
            keep.add(snapshot_id)
            if snapshot_id in on_main:
                break
    return keep


def _needed_for_repair(snapshot: Snapshot, unapplied: set[int] | None) -> bool:
    marker = snapshot.summary.get(_MARKER) if snapshot.summary is not None else None
    if not marker:
        return False
    if unapplied is None:
        return True
    window_id, _, _ = str(marker).partition(":")
    return not window_id.isdigit() or int(window_id) in unapplied


def expire_snapshots(
    store: HasTables,
    spec: DatasetSpec,
    *,
    older_than: datetime | timedelta = DEFAULT_OLDER_THAN,
    retain_last: int = DEFAULT_RETAIN_LAST,
    ledger: WindowLog | None = DEFAULT_LOCK,
    dry_run: bool = False,
    keep: Collection[int] = (),
    force: bool = False,
) -> ExpiryResult:
    """Expire snapshots older than `older_than` (an age, or an instant) beyond the `retain_last`
    newest, keep what window repair needs (asking `ledger`: by default the window ledger on the
    control plane the store's lock uses), the snapshots incremental downstreams read their next
    changes from (`consumer_positions`; `force` expires them too: their next run is a full
    refresh) and the snapshots `keep` names, and delete the files only the expired snapshots
    referenced (module docstring). `dry_run`: decide and count, change nothing.
    """
    if ledger is DEFAULT_LOCK:
        ledger = _default_ledger(store)
    if retain_last < 1:
        raise InvalidArgument("expire_snapshots: retain_last must be at least 1")
    started = time.perf_counter()
    cutoff = datetime.now(UTC) - older_than if isinstance(older_than, timedelta) else older_than
    if cutoff.tzinfo is None:
        cutoff = cutoff.replace(tzinfo=UTC)
    cutoff_ms = int(cutoff.timestamp() * 1000)
    with paused():  # the entries of every manifest decoded: no collection walks them
        # what the expired snapshots referenced is read from the start (`_Reads`: manifests
        # never change) and while the commit is made; nothing is deleted before it succeeded
        reads = _Reads(store, spec, cutoff_ms, retain_last, keep)
        try:
            return _expire(
                store, spec, cutoff_ms, retain_last, ledger, dry_run, started, keep, force, reads
            )
        finally:
            reads.close()


def _expire(
    store: HasTables,
    spec: DatasetSpec,
    cutoff_ms: int,
    retain_last: int,
    ledger: WindowLog | None,
    dry_run: bool,
    started: float,
    keep: Collection[int],
    force: bool,
    reads: _Reads,
) -> ExpiryResult:
    with ExitStack() as locks:
        stats = LockStats(key=store.tables.table_name(spec))  # a dry run takes no lock
        if not dry_run:
            locks.enter_context(_apply_lock(ledger, spec))
            stats = locks.enter_context(store.tables.hold(spec))
        if not force:  # asked under the writer lock: no upstream commit moves a head meanwhile
            keep = {*keep, *consumer_positions(store, spec)}
        before = store.tables.load(spec)
        if before is None:
            raise DatasetNotWritten(f"dataset {spec.name!r} has no Iceberg table to expire")
        plan = plan_expiry(
            before.metadata,
            older_than_ms=cutoff_ms,
            retain_last=retain_last,
            unapplied_windows=_unapplied(ledger, spec),
            keep_ids=keep,
        )
        snapshots = list(before.metadata.snapshots)  # the commit updates `before` in place
        gone = set(plan.expire)
        expired = reads.read(before.io, snapshots, gone) if gone else None
        if plan.expire and not dry_run:
            _commit(before, plan, stats.verify)
    doomed: list[str] = []
    if expired is not None:
        remaining = [s for s in snapshots if s.snapshot_id not in gone]
        if not dry_run:  # the table now (commits after ours reference only live files)
            now = store.tables.load(spec)
            remaining = list(now.metadata.snapshots) if now is not None else remaining
        kept = ManifestReader(before.io).files_of(remaining)
        reader, found = expired()
        doomed = [p for p in found if p not in kept]
        if reader.locations:  # (a local file is deleted by its normalized path)
            doomed = [reader.location(p) for p in doomed]
    deleted = len(doomed)
    if doomed and not dry_run:
        deleted = delete_paths(before.io, doomed)
    return ExpiryResult(
        dataset=spec.name,
        table=store.tables.table_name(spec),
        dry_run=dry_run,
        snapshots_before=len(snapshots),
        snapshots_expired=len(plan.expire),
        kept_for_repair=len(plan.kept_for_repair),
        files_deleted=deleted,
        duration_s=time.perf_counter() - started,
    )


def expired_files(reader: ManifestReader, snapshots: list[Snapshot], gone: set[int]) -> list[str]:
    """The files the expired snapshots (`gone`, among `snapshots`) referenced that may be
    referenced by none of the others (normalized, each once): their manifest lists and
    manifests, and of their data and delete files only those that can have left the table
    since — those in the order of the manifest entries that removed them: about the order the
    files were written in, which ext4 unlinks ~25 % faster than a hash order (20,000 files in
    16 threads: 0.36 against 0.45 s, benchmarks/results/small-files-maintenance.md).

    An expired snapshot's live files are the live files of any descendant plus those removed on
    the way there. So instead of every expired snapshot's entries, read: the live entries of the
    expired snapshots without a child (tips), and the entries each child of an expired snapshot
    marked DELETED in the manifests it added (what it removed from its parent). After a
    compaction of 20,000 small files that is its 20,000 removed entries, not the ~40,000
    entries the appends before it listed. A removal another writer did not record as a DELETED
    entry leaves its file behind: an orphan for `remove_orphans`, never a file deleted while
    referenced (the caller subtracts everything the remaining snapshots reference)."""
    out = dict.fromkeys(_expired_own(reader, snapshots, gone))
    out.update(dict.fromkeys(_removed_after(reader, snapshots, gone)))
    return list(out)


def _expired_own(reader: ManifestReader, snapshots: list[Snapshot], gone: set[int]) -> list[str]:
    """`expired_files`' manifest lists, change files and manifests of the expired snapshots,
    and the live files of those without a child."""
    expired = [s for s in snapshots if s.snapshot_id in gone]
    parents = {s.parent_snapshot_id for s in snapshots}
    own, _ = reader.metadata_of(expired)
    return [*own, *reader.files_of(s for s in expired if s.snapshot_id not in parents)]


def _removed_after(reader: ManifestReader, snapshots: list[Snapshot], gone: set[int]) -> list[str]:
    """`expired_files`' files the children of the expired snapshots removed."""
    by_id = {s.snapshot_id: s for s in snapshots}
    children = [
        s for s in snapshots if s.parent_snapshot_id in gone and s.parent_snapshot_id in by_id
    ]
    out: list[str] = []
    # the children that stay first (a compaction's removals): the manifest lists of the expired
    # ones are being read meanwhile (`_Reads.read`)
    for snapshot in sorted(children, key=lambda s: s.snapshot_id in gone):
        out += reader.removed_by(snapshot)
    return out


class _Reads:
    """An expiry's manifest reads, started with it, before its locks and plan. On one thread,
    first a guess: the removals of the children of the snapshots the plan would expire if
    nothing were kept for a window repair or a downstream (`plan_expiry` on the table loaded
    without the locks) — read into the reader the plan's reads share; since manifests never
    change, what the guess read is right whatever the plan decides, it only saves the plan's
    reads the time (a compaction's 20,000 removed entries: ~0.03 s earlier,
    benchmarks/results/small-files-maintenance.md).
    Then, on the same thread, the plan's own reads (`read`)."""

    def __init__(
        self,
        store: HasTables,
        spec: DatasetSpec,
        cutoff_ms: int,
        retain_last: int,
        keep: Collection[int],
    ) -> None:
        self._made: Future[ManifestReader | None] = Future()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="expiry-read")
        # the expired snapshots' own manifest lists (fastavro, with the GIL): the guess's read
        # here while the locks are taken, not during the commit (`read`)
        self._other = ThreadPoolExecutor(max_workers=1, thread_name_prefix="expiry-read")
        guess = partial(
            plan_expiry,
            older_than_ms=cutoff_ms,
            retain_last=retain_last,
            unapplied_windows=set(),
            keep_ids=keep,
        )
        self._pool.submit(self._guess, store, spec, guess)

    def _guess(
        self, store: HasTables, spec: DatasetSpec, guess: Callable[[TableMetadata], ExpiryPlan]
    ) -> None:
        try:
            table = store.tables.load(spec)
            reader = ManifestReader(table.io) if table is not None else None
            self._made.set_result(reader)
            if table is None or reader is None:
                return
            plan = guess(table.metadata)
            if plan.expire:
                snapshots, gone = list(table.metadata.snapshots), set(plan.expire)
                self._other.submit(_expired_own, reader, snapshots, gone)
                _removed_after(reader, snapshots, gone)
        except Exception:  # only a read ahead: the plan's reads read what it could not
            if not self._made.done():
                self._made.set_result(None)

    def read(
        self, io: FileIO, snapshots: list[Snapshot], gone: set[int]
    ) -> Callable[[], tuple[ManifestReader, list[str]]]:
        """`expired_files` read in two threads sharing the guess's reader — what the children
        of the expired snapshots removed (big manifests decoded natively, without the GIL) on
        the guess's thread, after it, and the expired snapshots' own manifest lists and
        manifests (decoded by fastavro, holding the GIL) on the other, after the guess's — and
        a call that waits for them: (the reader, whose `location` of each file is what to
        delete it by; the files)."""
        fallback = ManifestReader(io)

        def shared() -> ManifestReader:
            made = self._made.result()
            ok = made is not None and dict(made.io.properties) == dict(io.properties)
            return made if made is not None and ok else fallback

        removed = self._pool.submit(lambda: _removed_after(shared(), snapshots, gone))
        own = self._other.submit(lambda: _expired_own(shared(), snapshots, gone))

        def wait() -> tuple[ManifestReader, list[str]]:
            files = list(dict.fromkeys([*own.result(), *removed.result()]))
            return shared(), files

        return wait

    def close(self) -> None:
        self._pool.shutdown(wait=False)  # the threads end with their tasks
        self._other.shutdown(wait=False)


def _commit(table: Table, plan: ExpiryPlan, verify: Callable[[], None]) -> Table:
    """Remove the snapshots in one metadata commit fenced to the current snapshot."""
    current = table.current_snapshot()
    tx = FlatTransaction(table)
    upgrade_properties(tx)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    recorded = {LAST_EXPIRY: f"{when} expired {len(plan.expire)} snapshot(s)"}
    boundary = expiry_boundary(table.metadata, set(plan.expire))
    if boundary is not None:  # times before it lose their answer (`snapshot_log`)
        recorded[TRAVEL_FROM] = stamp(boundary)
    tx.set_properties(recorded)
    tx._apply(
        (RemoveSnapshotsUpdate(snapshot_ids=plan.expire),),  # type: ignore[call-arg]
        (
            AssertRefSnapshotId(  # type: ignore[call-arg]
                snapshot_id=current.snapshot_id if current else None, ref="main"
            ),
        ),
    )
    verify()
    return tx.commit_transaction()


def _apply_lock(ledger: WindowLog | None, spec: DatasetSpec) -> AbstractContextManager[Any]:
    """The dataset's window apply lock (no window is applied while expiry decides)."""
    return ledger.apply_lock(spec.name) if ledger is not None else nullcontext()


def consumer_positions(store: HasTables, spec: DatasetSpec) -> set[int]:
    """The snapshots of `spec`'s table incremental downstreams read their next changes from:
    per downstream the `to` of its newest range in the ledger's `consumed_changes` (on the
    control plane the store's lock is on; none without one), the `to` a run is reading now or
    was killed reading (`ConsumedLog.reading_of`), and the `to` its own newest marked snapshot
    names when a run was killed between that commit and the ledger record (its next run records
    it and reads on from there: a killed first run included, as it noted its range first)."""
    lock = store.tables.advisory()
    if not isinstance(lock, AdvisoryLock):
        return set()
    log = Ledger(lock.url).consumed_log
    try:
        positions = log.positions_of(spec.name)
    except psycopg.errors.UndefinedTable:  # a control plane without the consumers' table
        return set()
    try:
        reading = log.reading_of(spec.name)
    except psycopg.errors.UndefinedTable:  # one from before the in-flight ranges' table
        reading = {}
    kept = {*positions.values(), *reading.values()}
    for downstream in {*positions, *reading}:
        found = last_summary(store.tables, downstream, CONSUMED_PREFIX + spec.name)
        if found is not None:
            kept.add(consumed_range(found[1])[1])
    return kept


def _default_ledger(store: HasTables) -> WindowLog | None:
    """The window ledger of the control plane the store's lock is on (None: no lock); callers
    that hold one (`services.maintenance`, the runtime) pass it instead."""
    lock = store.tables.advisory()
    return WindowLedger(lock.url) if isinstance(lock, AdvisoryLock) else None


def _unapplied(ledger: WindowLog | None, spec: DatasetSpec) -> set[int] | None:
    if ledger is None:
        return None
    try:
        return ledger.unapplied_ids(spec.name)
    except psycopg.errors.UndefinedTable:
        return None  # a control plane without the window ledger: keep every marked snapshot
