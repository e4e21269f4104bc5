"""Branches, refs and snapshot history of a native table: what write-audit-publish, rollback and
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

from collections.abc import Callable, Iterator
from datetime import datetime

from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update.snapshot import ManageSnapshots

from pipeline_output.errors import InvalidArgument, WriteConflict

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
