"""`IcebergTables`: the datasets' tables in one namespace of one catalog — naming them, loading
them, creating a table with its first write, and the two locks every writer of a table takes (the
writer lock, `hold`; and the files lock, `advisory` for `snapshot/commit.py`).

It is the part of the native arm every operation shares: the store's writes and reads, the
streaming replace and table maintenance all take an `IcebergTables` (or anything carrying one as
`.tables`, such as `IcebergStore`), never the store itself.

Names the native arm shares: the `pipeline-output.` property prefix, the table properties a
new table gets, internal column names and defaults (the arm's declared capabilities are
`write/merge.py`'s, beside its write-mode handlers).

The freshness oracle of the native arm: what the target's own history says (does the table
exist, has it a committed snapshot, how many rows does it hold) — DESIGN.md, "The freshness
oracle". Never decided by counting rows of another store.

Branches, refs and snapshot history of a native table: what write-audit-publish, rollback and
time travel need from Iceberg.

- A write to a branch plans against the branch's head: `at_branch` hands the write a view of the
  table whose `main` is the branch head, so the planner, the merges and the manifest index (which
  all read "the current snapshot") see the branch; the commit itself targets the real branch
  (`stage_branch` creates it at main's head in the write's own commit when it does not exist yet).
- Iceberg refuses branch writes into a table without any snapshot, so an audited first deploy
  first gives the table an unreferenced empty snapshot (`anchor`): `main` stays unset, and the
  freshness oracle still sees a first deploy.
- `move_main` moves `main` to a snapshot in one catalog commit, asserting where it pointed before
  (publish: a fast-forward to the audited snapshot, dropping the audit branch in the same commit;
  rollback: back to an ancestor).
- `ancestry` and `main_since` answer "which snapshots did readers of main see, and when" (which
  snapshot main pointed at at a given time is `snapshot_log`'s: it knows what expiry removed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any, Protocol

import polars as pl
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot, Summary
from pyiceberg.table.update.snapshot import ManageSnapshots

from pipeline_output.contract.plan import TargetState
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import InvalidArgument, WriteConflict
from pipeline_output.infra.locks import AdvisoryLock, HeldLock, LockStats, iceberg_table
from pipeline_output.stores.iceberg.table.partitions import partition_spec
from pipeline_output.stores.schema import initial_schema

PROPERTY_PREFIX = "pipeline-output."
# A write's metadata work must not grow with the table's history (issue 18): merge small manifests
# on commit and keep only the last 25 metadata.json files. Tables created before these defaults
# get the ones they do not set on their next write (`manifests.upgrade_properties`).
MAINTENANCE_FREE_PROPERTIES = {
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "16",
    # merged manifests of 1 MiB, not Iceberg's 8: a copy-on-write removal rewrites the manifest
    # holding the file, and a keyed write skips the manifests whose partition ranges rule its keys
    # out, so smaller manifests make both cheaper (benchmarks/results/history.md, "Manifest
    # pruning")
    "commit.manifest.target-size-bytes": str(1024 * 1024),
    "write.metadata.delete-after-commit.enabled": "true",
    # a table written per window commits often: 25 earlier metadata files (Iceberg's default is
    # 100) keep about a day of hourly windows' table states, at a quarter of the bytes
    "write.metadata.previous-versions-max": "25",
    # metadata.json lists every snapshot: gzip'd (by the project's SQL catalog) it is ~10x smaller
    "write.metadata.compression-codec": "gzip",
}
TABLE_PROPERTIES = {
    **MAINTENANCE_FREE_PROPERTIES,
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": "1",
    "write.target-file-size-bytes": str(512 * 1024 * 1024),
    "commit.retry.num-retries": "10",
    "commit.retry.min-wait-ms": "50",
    "commit.retry.max-wait-ms": "5000",
}
DEFAULT_LOCK: Any = object()
READ_THREADS = 4
POS_COLUMN = "__po_pos__"  # every internal column name starts with frames.RESERVED_PREFIX
FILEPOS_COLUMN = "__po_filepos__"  # a row's physical position in its data file (merge-on-read)
NEW_PREFIX = "__po_new__"  # the compute's value of column `c` in a merge join is `__po_new__c`


class IcebergTables:
    """The tables `<namespace>.<dataset name>` of `catalog`, and their locks.

    Same-table writers are serialized with a Postgres advisory lock (default: on the control-plane
    Postgres from settings, resolved on first use). `lock=None` opts out — every write then warns
    that concurrent writers are unsafe.
    """

    def __init__(self, catalog: Catalog, namespace: str, *, lock: Any = DEFAULT_LOCK) -> None:
        self.catalog = catalog
        self.namespace = namespace
        self._lock: AdvisoryLock | Any | None = lock
        self._namespace_checked = False
        self._written: dict[tuple[str, str], Table] = {}
        self._contended: set[tuple[str, str]] = set()

    def remember(self, spec: DatasetSpec | str, table: Table | None) -> None:
        """Keep `table` as this process's last write of it left it (its commit updated it in
        place); None forgets it (a write whose resulting table this process does not hold)."""
        if table is None:
            self._written.pop(self.identifier(spec), None)
        else:
            self._written[self.identifier(spec)] = table

    def as_written(self, spec: DatasetSpec | str) -> Table | None:
        """The table as this process's last write of it left it (no catalog request), or None
        when this process has not written it (or has since taken its writer lock for anything
        else: `hold`): what the next write plans from (`IcebergStore.write`, re-checked by its
        commit's requirements), pre-writes its files against, and what its metadata reports."""
        return self._written.get(self.identifier(spec))

    def plans_from_memory(self, spec: DatasetSpec | str) -> bool:
        """Whether a write of `spec` may plan from `as_written` without loading the table: it
        holds the project's writer lock, and no write planned that way has met another writer's
        commit since a load last found the table as this process left it (`contended`)."""
        return self.advisory() is not None and self.identifier(spec) not in self._contended

    def contended(self, spec: DatasetSpec | str, *, by_others: bool) -> None:
        """Record whether another writer committed to `spec`'s table since this process's last
        write of it (`by_others`): while one does, a write loads the table first (planning twice
        would cost more than the load)."""
        if by_others:
            self._contended.add(self.identifier(spec))
        else:
            self._contended.discard(self.identifier(spec))

    def load_since(self, spec: DatasetSpec | str, last: Table | None) -> Table | None:
        """The table loaded (under its writer lock), recording whether another writer committed
        to it since `last`, this process's last write of it (`contended`); None: no table."""
        table = self.load(spec)
        if last is not None and table is not None:
            self.contended(spec, by_others=table.metadata_location != last.metadata_location)
        return table

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

    def advisory(self) -> AdvisoryLock | Any | None:
        """The advisory lock behind the table locks (the default one, on the control plane,
        resolved on first use); None when the store was built with `lock=None`."""
        if self._lock is DEFAULT_LOCK:
            from pipeline_output.infra.settings import get_settings

            self._lock = AdvisoryLock(get_settings().control_plane_url())
        return self._lock

    def hold(
        self, spec: DatasetSpec, *, on: HeldLock | None = None
    ) -> AbstractContextManager[LockStats]:
        """The table's writer lock, held for the block (on the session of `on`, the write's files
        lock, when given): every commit to the table happens under it. Taking it forgets the
        table as this process last wrote it (`as_written`): the block may commit in any way (a
        compaction, an expiry, a publish), so only a write that took that table before, and
        remembers the table its own commit leaves, plans from it."""
        self._written.pop(self.identifier(spec), None)
        lock = self.advisory()
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

    def ensure_namespace(self) -> None:
        """Create the namespace unless this handle has seen it exist."""
        if not self._namespace_checked:
            self.catalog.create_namespace_if_not_exists(self.namespace)
            self._namespace_checked = True

    def create_transaction(self, spec: DatasetSpec, frame: pl.DataFrame) -> Transaction:
        """The transaction that creates `spec`'s table for `frame` (schema, partition spec, sort
        order and table properties), committed with the table's first write."""
        self.ensure_namespace()
        schema, order = initial_schema(spec, frame)
        return self.catalog.create_table_transaction(
            self.identifier(spec),
            schema=schema,
            partition_spec=partition_spec(spec, schema),
            sort_order=order,
            properties=TABLE_PROPERTIES,
        )


class HasTables(Protocol):
    """Anything that carries a dataset namespace's tables (`IcebergStore`, `TableMaintenance`)."""

    @property
    def tables(self) -> IcebergTables: ...


def state_of(table: Table | None) -> TargetState:
    """The freshness oracle on a loaded table: first deploy or re-deploy is decided by whether the
    table exists and has a committed snapshot on main — never by counting rows."""
    if table is None:
        return TargetState(exists=False, has_snapshot=False)
    snap = table.current_snapshot()
    return TargetState(
        exists=True,
        has_snapshot=snap is not None,
        snapshot_id=snap.snapshot_id if snap else None,
        total_rows=total_records(table),
    )


def total_records(table: Table) -> int:
    """The rows of main's current snapshot (its summary; position deletes subtracted)."""
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    return summary_rows(snap.summary) or 0


def summary_rows(summary: Summary) -> int | None:
    """The rows a snapshot holds, from its summary: `total-records` less `total-position-deletes`
    (rows deleted by position are still counted in their data files' records). None when the
    summary does not count them."""
    total = summary.get("total-records")
    if total in (None, ""):
        return None
    return int(total) - int(summary.get("total-position-deletes", "0") or 0)


AUDIT_PREFIX = "audit-"  # branches named for an audited run: `audit-<run id>`


def audit_branch(run_id: str) -> str:
    """The branch an audited run's native writes commit to."""
    return f"{AUDIT_PREFIX}{run_id}"


def head(table: Table, ref: str = MAIN_BRANCH) -> int | None:
    """The snapshot id `ref` points at (None: the ref does not exist)."""
    found = table.metadata.refs.get(ref)
    return found.snapshot_id if found is not None else None


def at_branch(table: Table, branch: str) -> Table:
    """A view of `table` whose `main` (and current snapshot) is `branch`'s head — or the real
    main's when the branch does not exist yet. Only for planning a write to `branch`: its commit
    goes through the real catalog, which applies the branch update to the real metadata."""
    meta = table.metadata
    tip = head(table, branch)
    if tip is None:
        return table
    refs = dict(meta.refs)
    refs[MAIN_BRANCH] = SnapshotRef.model_validate(
        {"snapshot-id": tip, "type": SnapshotRefType.BRANCH}
    )
    view = meta.model_copy(update={"current_snapshot_id": tip, "refs": refs})
    return Table(
        table.name(),
        metadata=view,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )


def stage_branch(tx: Transaction, branch: str) -> None:
    """Create `branch` at main's head inside `tx` unless it exists (or main has no snapshot: the
    branch write then creates it, from no parent, on the `anchor`ed table)."""
    metadata = tx.table_metadata
    if branch in metadata.refs or metadata.current_snapshot_id is None:
        return
    manage = ManageSnapshots(tx)
    manage.create_branch(snapshot_id=metadata.current_snapshot_id, branch_name=branch)
    manage.commit()


def needs_anchor(table: Table | None) -> bool:
    """True when a branch write is impossible yet: no table, or a table without any snapshot."""
    return table is None or not table.metadata.snapshots


def anchor(tx: Transaction) -> Table:
    """Commit `tx` (a table creation, or a transaction on a table without snapshots) with an
    empty snapshot no ref points at, so that branches can be written; main stays unset."""
    tx.update_snapshot(branch=None).fast_append().commit()
    return tx.commit_transaction()


def move_main(
    table: Table,
    snapshot_id: int,
    *,
    expected: int | None,
    drop_branch: str | None = None,
    fence: Callable[[], None] | None = None,
) -> Table:
    """Point `main` at `snapshot_id` in one catalog commit, only if it still points at `expected`
    (asserted by the catalog), and drop `drop_branch` in the same commit. `fence` (the writer
    lock's `verify`) runs right before the swap."""
    from pyiceberg.exceptions import CommitFailedException

    if head(table) != expected:
        raise WriteConflict(
            f"table {'.'.join(table.name())}: main points at {head(table)}, not at {expected}; "
            "nothing was moved"
        )
    tx = Transaction(table)
    # main's assertion is staged first: a transaction keeps one ref assertion (pyiceberg keeps the
    # first requirement of each type), and main's is the one that protects readers
    tx._stage(*tx._set_ref_snapshot(snapshot_id, MAIN_BRANCH, SnapshotRefType.BRANCH))
    if drop_branch is not None and drop_branch in table.metadata.refs:
        manage = ManageSnapshots(tx)
        manage.remove_branch(drop_branch)
        manage.commit()
    if fence is not None:
        fence()
    try:
        return tx.commit_transaction()
    except CommitFailedException as exc:
        raise WriteConflict(
            f"table {'.'.join(table.name())}: main moved while it was being set to "
            f"{snapshot_id} ({exc}); nothing was moved"
        ) from exc


def drop_branch(table: Table, branch: str) -> Table:
    """Remove `branch` (one commit; nothing when it does not exist)."""
    if branch not in table.metadata.refs:
        return table
    tx = Transaction(table)
    manage = ManageSnapshots(tx)
    manage.remove_branch(branch)
    manage.commit()
    return tx.commit_transaction()


def snapshots_by_id(table: Table) -> dict[int, Snapshot]:
    """Every snapshot of the table's metadata by id."""
    return {s.snapshot_id: s for s in table.metadata.snapshots}


def ancestry(table: Table, snapshot_id: int | None) -> Iterator[Snapshot]:
    """`snapshot_id` and its ancestors, newest first (stops where history was expired)."""
    by_id = snapshots_by_id(table)
    current = by_id.get(snapshot_id) if snapshot_id is not None else None
    seen: set[int] = set()
    while current is not None and current.snapshot_id not in seen:
        seen.add(current.snapshot_id)
        yield current
        parent = current.parent_snapshot_id
        current = by_id.get(parent) if parent is not None else None


def ancestor_ids(table: Table, snapshot_id: int | None) -> set[int]:
    """The ids of `snapshot_id` and its ancestors."""
    return {s.snapshot_id for s in ancestry(table, snapshot_id)}


def to_millis(moment: datetime, *, what: str) -> int:
    """Milliseconds since the epoch of a timezone-aware datetime (a naive one is refused: it
    names no instant)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidArgument(
            f"{what} {moment.isoformat()} has no time zone; give an aware time (e.g. "
            f"{moment.isoformat()}+00:00 or ...Z for UTC)"
        )
    return int(moment.timestamp() * 1000)


def main_since(table: Table) -> dict[int, int]:
    """For each snapshot main pointed at, the last time (epoch ms) it started pointing there."""
    return {e.snapshot_id: e.timestamp_ms for e in table.metadata.snapshot_log}
