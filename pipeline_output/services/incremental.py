"""Incremental downstreams: a dataset computed from what changed in an upstream dataset since the
snapshot it last consumed, exactly once.

`consume_changes(ConsumeRequest(...), publisher=..., ledger=...)`, under the downstream's consume
lock:

1. **Position.** The downstream's position in the upstream is the `to` of the newest range it
   consumed. The atomic record of a range is the downstream's own snapshot summary
   (`pipeline-output.changes.<upstream>` = `<from>:<to>`, `:full` after a full refresh,
   committed with its rows); the ledger's
   `consumed_changes` is written after it. A run that finds the newest marked snapshot of the
   downstream's main history missing from the ledger (a run killed between its commit and the
   ledger record) records it first (`repaired`), and reads on from there.
2. **Changes.** The upstream's net change from the position (exclusive) to its main head now
   (inclusive): `read_changes` (`stores/iceberg/table/changes.py`), keyed by the upstream's primary key
   (a multiset of whole rows without one). No position (the first run), or a position expiry
   removed (a forced expiry): a **full refresh** — every live upstream row an insert, and the
   downstream's whole table replaced — whose `reason` says why. No upstream commit since the
   position: nothing is read, written or recorded.
3. **Compute and write.** The compute returns the rows of the downstream keys it recomputed; a
   row whose `DELETED` column is true names a key to delete (its other columns are ignored).
   The write is the downstream strategy's partition write (a sync, or a replace) scoped to those
   keys (`slices.OneOf` on the primary key): every key the compute returned a row for is
   upserted, every key named only by a deletion is deleted, every other row is untouched. It
   carries the range in its summary.
4. **Record.** The ledger records the range and the downstream snapshot. A write that changed
   nothing commits no snapshot: the range is recorded in the ledger alone.

Before step 2 reads, the ledger notes the range being read (`ConsumedLog.reading`; cleared by
the record): expiry keeps its `to` meanwhile, so a run that commits after an expiry, or is killed
between its commit and its record — a first run too, which no recorded range names yet — finds
its `to` on its next run.

A compute that raises writes and records nothing: the next run reads the same range again.
Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import polars as pl

from pipeline_output.contract.checked_input import to_polars
from pipeline_output.contract.slices import OneOf, PartitionSlice
from pipeline_output.contract.spec import STRATEGIES, DatasetSpec
from pipeline_output.errors import ChangesExpired, InvalidSpec, UnsupportedWrite
from pipeline_output.ledger.control_plane import ConsumedRange, Ledger
from pipeline_output.services.publish import Publisher, PublishResult, ResolvedMode
from pipeline_output.services.reads import scan_iceberg_dataset
from pipeline_output.stores.iceberg.table.changes import (
    CHANGE_COMMIT_TIME,
    CHANGE_SNAPSHOT,
    CHANGE_TYPE,
    CHANGE_TYPES,
    CONSUMED_PREFIX,
    ChangeSet,
    consumed_range,
    read_changes,
)

DELETED = "_deleted"  # a computed row with this column true deletes its key downstream
SUMMARY_PREFIX = CONSUMED_PREFIX  # + the upstream's name: the consumed range in a snapshot summary
# the strategies whose partition write makes the scoped keys exactly the computed rows
_SCOPED_WRITES = frozenset({"sync", "replace"})

__all__ = [
    "CHANGE_COMMIT_TIME",
    "CHANGE_SNAPSHOT",
    "CHANGE_TYPE",
    "CHANGE_TYPES",
    "DELETED",
    "Changes",
    "ConsumeOutcome",
    "ConsumeRequest",
    "check_downstream",
    "consume_changes",
    "pending_changes",
]


@dataclass(frozen=True)
class Changes:
    """What changed in `upstream` from `from_snapshot` (exclusive; None: the empty table) to
    `to_snapshot` (inclusive): `frame` holds the upstream's columns plus `_change_type`
    (`insert`, `delete`, `update_before`, `update_after`), `_change_snapshot_id` and
    `_change_commit_time`; `counts` the rows per change type. `full_refresh`: every upstream
    row is an insert and the downstream's write replaces its whole table; `reason` says why
    (first run, or the position was expired). `current`: the upstream as of `to_snapshot`, a
    LazyFrame (filters and projection pushed down) to recompute the changed keys from."""

    frame: pl.DataFrame
    upstream: str
    from_snapshot: int | None
    to_snapshot: int | None
    counts: Mapping[str, int] = field(default_factory=dict)
    full_refresh: bool = False
    reason: str = ""
    current: pl.LazyFrame | None = None

    def keys(self, *columns: str) -> pl.DataFrame:
        """The distinct values of `columns` over every change row (before and after images):
        the downstream keys to recompute when they are the upstream's group-by columns."""
        return self.frame.select(columns).unique(maintain_order=True)

    def with_deletions(self, result: pl.DataFrame | pl.LazyFrame, key: str) -> pl.DataFrame:
        """`result` (the recomputed rows of the changed keys, keyed by the upstream column
        `key`) plus a `DELETED` row for each changed key it has no row for: the key had no
        upstream row left, so the downstream deletes it."""
        rows = result.collect() if isinstance(result, pl.LazyFrame) else result
        changed = self.keys(key).cast({key: rows.schema[key]}) if key in rows.columns else None
        if changed is None:
            return rows
        gone = changed.join(rows.select(key), on=key, how="anti", nulls_equal=True)
        flagged = gone.with_columns(pl.lit(True).alias(DELETED))
        return pl.concat([rows, flagged], how="diagonal_relaxed")

    @property
    def empty(self) -> bool:
        """Whether nothing changed."""
        return self.frame.height == 0


def check_downstream(spec: DatasetSpec, upstream: str) -> None:
    """Refuse, before any I/O, a downstream `spec` whose writes cannot be scoped to keys: it
    needs a one-column primary key and the strategy `snapshot_replace`, `sync` or `replace`."""
    where = f"dataset {spec.name!r} (changes of {upstream!r})"
    if len(spec.primary_key) != 1:
        raise InvalidSpec(
            f"{where}: an incremental downstream needs a primary key of one column (got "
            f"{list(spec.primary_key)}); its write is scoped to the keys it recomputes"
        )
    decision = STRATEGIES[spec.strategy].partition
    if decision is None or decision.write_mode not in _SCOPED_WRITES:
        raise InvalidSpec(
            f"{where}: strategy {spec.strategy!r} cannot delete the keys an incremental "
            "downstream recomputes; use snapshot_replace, sync or replace"
        )
    if spec.delta is not None:
        raise InvalidSpec(f"{where}: an incremental downstream cannot also be a delta dataset")
    if spec.mode == "pg":
        raise InvalidSpec(
            f"{where}: an incremental downstream records what it consumed in its Iceberg "
            "snapshots; declare it mode='iceberg' or 'dual', not 'pg'"
        )
    if spec.audit:
        raise InvalidSpec(
            f"{where}: write-audit-publish of an incremental downstream is not supported (its "
            "consumed range commits with its rows on main)"
        )


@dataclass(frozen=True, kw_only=True)
class ConsumeRequest:
    """One run of the incremental downstream `spec` over `upstream`'s changes: `compute` maps a
    `Changes` to the downstream rows (a frame; `DELETED` rows delete keys), written in `mode`
    by run `run_id`. `upstream_mode`: the upstream's resolved mode (its Iceberg arm serves the
    changes; `pg` is refused). `columns`: only these upstream columns in the change rows
    (`read_changes(columns=...)`; None: all)."""

    spec: DatasetSpec
    upstream: DatasetSpec
    compute: Callable[[Changes], Any]
    mode: ResolvedMode
    upstream_mode: ResolvedMode
    run_id: str | None = None
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ConsumeOutcome:
    """What one run did: `applied` (written and recorded), `recorded` (the write changed
    nothing: the range recorded in the ledger alone), `noop` (no upstream change since the
    position); `repaired` is true when a previous run's commit was recorded first."""

    action: Literal["applied", "recorded", "noop"]
    changes: Changes
    result: PublishResult | None = None
    record: ConsumedRange | None = None
    repaired: bool = False

    @property
    def message(self) -> str:
        c = self.changes
        shown = ", ".join(f"{k} {c.counts.get(k, 0)}" for k in CHANGE_TYPES)
        span = f"({c.from_snapshot}, {c.to_snapshot}] of {c.upstream}"
        if self.action == "noop":
            return f"no change in {c.upstream} since snapshot {c.to_snapshot}; nothing written"
        refresh = f"; full refresh: {c.reason}" if c.full_refresh else ""
        fix = "; a previous run's commit was recorded first" if self.repaired else ""
        return f"consumed {span}: {shown}{refresh}{fix}"


def summary_value(changes: Changes) -> str:
    """The consumed range as a snapshot summary value: `<from>:<to>` (from empty: none), then
    `:full` for a full refresh."""
    low = "" if changes.from_snapshot is None else str(changes.from_snapshot)
    return f"{low}:{changes.to_snapshot}" + (":full" if changes.full_refresh else "")


def position(
    spec: DatasetSpec, upstream: str, *, publisher: Publisher, ledger: Ledger, run_id: str | None
) -> tuple[int | None, bool]:
    """The upstream snapshot the downstream consumed up to (None: never), and whether a commit
    missing from the ledger was recorded first (the repair)."""
    log = ledger.consumed_log
    found = publisher.iceberg.last_summary(spec, SUMMARY_PREFIX + upstream)
    repaired = False
    if found is not None:
        snapshot_id, value = found
        low, high, full = consumed_range(value)
        before = log.last(spec.name, upstream)
        record = log.record(
            spec.name,
            upstream,
            from_snapshot=low,
            to_snapshot=high,
            downstream_snapshot=snapshot_id,
            full_refresh=full,
            run_id=run_id,
        )
        repaired = before is None or record.id > before.id
    last = log.last(spec.name, upstream)
    return (last.to_snapshot if last is not None else None), repaired


def _check_upstream_arm(spec: DatasetSpec, upstream: DatasetSpec, mode: ResolvedMode) -> None:
    """Changes come from the upstream's Iceberg arm: a `pg` upstream is refused."""
    if "iceberg" not in mode.arms:
        raise UnsupportedWrite(
            f"dataset {spec.name!r} reads the changes of {upstream.name!r}, whose mode is "
            f"'pg' (from {mode.source}): changes come from the Iceberg arm "
            "(flip it to iceberg or dual); nothing was written"
        )


def read_since(
    table: Any,
    upstream: DatasetSpec,
    since: int | None,
    to: int | None,
    *,
    columns: tuple[str, ...] | None = None,
) -> Changes:
    """The changes of `upstream` from `since` to `to` (`columns` of its rows: None, all), or a
    full refresh saying why."""
    pk = upstream.primary_key
    if since is None:
        got = read_changes(
            table, from_snapshot=None, to_snapshot=to, primary_key=pk, columns=columns
        )
        reason = "first run: every upstream row is an insert"
        return _changes(got, upstream.name, full_refresh=True, reason=reason)
    try:
        got = read_changes(
            table, from_snapshot=since, to_snapshot=to, primary_key=pk, columns=columns
        )
    except ChangesExpired:
        got = read_changes(
            table, from_snapshot=None, to_snapshot=to, primary_key=pk, columns=columns
        )
        reason = (
            f"the snapshot last consumed ({since}) was expired (a forced expiry): the whole "
            "upstream is read again and the downstream replaced"
        )
        return _changes(got, upstream.name, full_refresh=True, reason=reason, since=since)
    return _changes(got, upstream.name)


def _changes(
    got: ChangeSet,
    upstream: str,
    *,
    full_refresh: bool = False,
    reason: str = "",
    since: int | None = None,
) -> Changes:
    return Changes(
        frame=got.frame,
        upstream=upstream,
        from_snapshot=since if full_refresh and since is not None else got.from_snapshot,
        to_snapshot=got.to_snapshot,
        counts=dict(got.counts),
        full_refresh=full_refresh,
        reason=reason,
    )


def pending_changes(
    spec: DatasetSpec,
    upstream: DatasetSpec,
    *,
    publisher: Publisher,
    ledger: Ledger,
    upstream_mode: ResolvedMode,
) -> Changes | None:
    """What the downstream's next run would consume (a dry run: reads, writes nothing; None: the
    upstream has no table yet)."""
    _check_upstream_arm(spec, upstream, upstream_mode)
    table = publisher.iceberg.load(upstream)
    if table is None:
        return None
    last = ledger.consumed_log.last(spec.name, upstream.name)
    found = publisher.iceberg.last_summary(spec, SUMMARY_PREFIX + upstream.name)
    since = last.to_snapshot if last is not None else None
    if found is not None and (last is None or last.downstream_snapshot != found[0]):
        since = consumed_range(found[1])[1]
    head = table.current_snapshot()
    to = head.snapshot_id if head is not None else None
    if since is not None and since == to:
        return Changes(
            frame=pl.DataFrame(), upstream=upstream.name, from_snapshot=since, to_snapshot=to
        )
    return read_since(table, upstream, since, to)


def consume_changes(
    request: ConsumeRequest,
    *,
    publisher: Publisher,
    ledger: Ledger,
    on_written: Callable[[], None] | None = None,
) -> ConsumeOutcome:
    """One run of an incremental downstream, exactly once (the module docstring); `on_written`
    (tests' fault injection) runs between the downstream's commit and the ledger record."""
    spec, up = request.spec, request.upstream
    check_downstream(spec, up.name)
    if "iceberg" not in request.mode.arms:
        raise UnsupportedWrite(
            f"dataset {spec.name!r}: an incremental downstream records what it consumed in its "
            f"Iceberg snapshot, but its mode is 'pg' (from {request.mode.source}); nothing was "
            "written"
        )
    _check_upstream_arm(spec, up, request.upstream_mode)
    with ledger.consumed_log.consume_lock(spec.name):
        since, repaired = position(
            spec, up.name, publisher=publisher, ledger=ledger, run_id=request.run_id
        )
        table = publisher.iceberg.load(up)  # its head now, under the lock
        if table is None:
            empty = Changes(pl.DataFrame(), up.name, since, None)
            return ConsumeOutcome("noop", empty, repaired=repaired)
        head = table.current_snapshot()
        to = head.snapshot_id if head is not None else None
        if to is None or (since is not None and since == to):
            quiet = Changes(pl.DataFrame(), up.name, since, since)
            return ConsumeOutcome("noop", quiet, repaired=repaired)
        # expiry keeps `to` from now until the range is recorded (even if this run is killed)
        ledger.consumed_log.reading(spec.name, up.name, to_snapshot=to, run_id=request.run_id)
        changes = replace(
            read_since(table, up, since, to, columns=request.columns),
            current=scan_iceberg_dataset(publisher.iceberg, up, as_of=to),
        )
        computed = to_polars(spec, request.compute(changes))
        result = _write(request, changes, computed, publisher)
        if on_written is not None:
            on_written()  # fault-injection hook (tests): between the commit and the ledger record
        ice = result.results.get("iceberg") if result is not None else None
        committed = ice is not None and not ice.noop and ice.snapshot_id is not None
        record = ledger.consumed_log.record(
            spec.name,
            up.name,
            from_snapshot=changes.from_snapshot,
            to_snapshot=to,
            downstream_snapshot=ice.snapshot_id if committed and ice is not None else None,
            full_refresh=changes.full_refresh,
            run_id=request.run_id,
        )
        action: Literal["applied", "recorded"] = "applied" if committed else "recorded"
        return ConsumeOutcome(action, changes, result, record, repaired)


def planned_effect(spec: DatasetSpec, pending: Changes | None) -> str:
    """What the downstream's next run writes, in one sentence (`plan`): a full refresh replaces
    its table; otherwise its strategy's write scoped to the keys the compute returns."""
    if pending is None:
        return "nothing yet (the upstream has no table)"
    if pending.full_refresh:
        return "replace (full refresh): the downstream's table becomes the compute's rows"
    if pending.from_snapshot == pending.to_snapshot:
        return "nothing (no upstream change to consume)"
    (key,) = spec.primary_key
    return (
        f"{spec.strategy} scoped to the {key} values the compute returns: those rows upserted, "
        f"keys flagged {DELETED} deleted, every other row untouched"
    )


def split_deleted(spec: DatasetSpec, frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(rows to upsert, keys to delete) of a computed frame: rows whose `DELETED` is true are
    deletions (only their key is kept); the column itself is never written."""
    pk = list(spec.primary_key)
    if DELETED not in frame.columns:
        return frame, frame.select(pk).head(0)
    flag = pl.col(DELETED).fill_null(False)
    return frame.filter(~flag).drop(DELETED), frame.filter(flag).select(pk)


def _write(
    request: ConsumeRequest, changes: Changes, computed: pl.DataFrame, publisher: Publisher
) -> PublishResult | None:
    """The downstream's write of `computed`, carrying the consumed range in its summary (None:
    no key to write)."""
    spec = replace(request.spec, allow_empty=True)
    upserts, deleted = split_deleted(spec, computed)
    summary = {SUMMARY_PREFIX + request.upstream.name: summary_value(changes)}
    if changes.full_refresh:
        return publisher.publish(
            replace(spec, strategy="replace"),
            upserts,
            mode=request.mode,
            run_id=request.run_id,
            summary=summary,
        )
    (key,) = spec.primary_key
    values = pl.concat([upserts.get_column(key), deleted.get_column(key).cast(upserts.schema[key])])
    keys = tuple(values.drop_nulls().unique(maintain_order=True).to_list())
    if not keys:
        return None
    scope = PartitionSlice(key=f"changes of {request.upstream.name}", terms=(OneOf(key, keys),))
    return publisher.publish(
        spec, upserts, mode=request.mode, partition=scope, run_id=request.run_id, summary=summary
    )
