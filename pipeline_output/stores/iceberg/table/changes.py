"""The change feed: what changed in a native table between two of its snapshots.

Owns `read_changes`: the net change between the table as of `from_snapshot` (exclusive) and as
of `to_snapshot` (inclusive), as rows tagged with a change type (`CHANGE_TYPE`), the `to`
snapshot (`CHANGE_SNAPSHOT`) and its commit time (`CHANGE_COMMIT_TIME`).

This version is the simple one: both versions of the table are read whole (`native_scan`) and
compared by key (`frame_rows.values_differ`, the merges' own definition of a changed row), or as
multisets of whole rows for a table without a key. Correct for every kind of snapshot (a rewrite
changes nothing, a rollback is the reverse change), not fast: its cost is two full reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import polars as pl
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from pipeline_output.errors import ChangesExpired
from pipeline_output.stores.iceberg.table.native_scan import (
    quiet,
    snapshot_scan,
    snapshot_schema,
    target_schema,
    typed,
)
from pipeline_output.stores.iceberg.table.tables import head
from pipeline_output.stores.iceberg.write.frame_rows import values_differ

CHANGE_TYPE = "_change_type"
CHANGE_SNAPSHOT = "_change_snapshot_id"
CHANGE_COMMIT_TIME = "_change_commit_time"

INSERT = "insert"
DELETE = "delete"
UPDATE_BEFORE = "update_before"
UPDATE_AFTER = "update_after"
CHANGE_TYPES = (INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER)


@dataclass(frozen=True)
class ChangeSet:
    """The net change of a table between two snapshots.

    `frame`: the table's columns (its schema as of `to_snapshot`) and the three change columns;
    `from_snapshot`: exclusive, None for the empty table (every live row an insert);
    `to_snapshot`: inclusive, None only when the table has no snapshot;
    `counts`: rows per change type (every type, zeros included)."""

    frame: pl.DataFrame
    from_snapshot: int | None
    to_snapshot: int | None
    counts: Mapping[str, int]


def read_changes(
    table: Table,
    *,
    from_snapshot: int | None,
    to_snapshot: int | None = None,
    primary_key: Sequence[str] = (),
    branch: str = "main",
) -> ChangeSet:
    """The net change of `table` from `from_snapshot` (exclusive) to `to_snapshot` (default: the
    branch's head). Keyed (`primary_key`): per key an insert, a delete, or an update (its
    `update_before` and `update_after` rows) when a column of the `to` schema differs; unkeyed:
    the multiset difference of whole rows (inserts and deletes only). `ChangesExpired` when
    `from_snapshot` is no longer in the table's metadata."""
    name = ".".join(table.name()[1:]) or str(table.name())
    if from_snapshot is not None and table.snapshot_by_id(from_snapshot) is None:
        raise ChangesExpired(
            f"table {name!r}: snapshot {from_snapshot} was expired; the changes since it can no "
            "longer be read (read from scratch instead)"
        )
    to = to_snapshot if to_snapshot is not None else head(table, branch or MAIN_BRANCH)
    if to is not None and table.snapshot_by_id(to) is None:
        raise ChangesExpired(f"table {name!r}: snapshot {to} does not exist (expired?)")
    target = target_schema(snapshot_schema(table, to))
    new = _rows(table, to, target)
    old = _rows(table, from_snapshot, target)
    pk = list(primary_key)
    parts = _keyed(old, new, pk) if pk else _unkeyed(old, new)
    snap = table.snapshot_by_id(to) if to is not None else None
    when = (
        pl.lit(snap.timestamp_ms).cast(pl.Datetime("ms", "UTC")).cast(pl.Datetime("us", "UTC"))
        if snap is not None
        else pl.lit(None, dtype=pl.Datetime("us", "UTC"))
    )
    frame = (
        pl.concat(parts, how="vertical")
        .with_columns(
            pl.lit(to, dtype=pl.Int64).alias(CHANGE_SNAPSHOT), when.alias(CHANGE_COMMIT_TIME)
        )
        .select([*target, CHANGE_TYPE, CHANGE_SNAPSHOT, CHANGE_COMMIT_TIME])
    )
    found = frame.get_column(CHANGE_TYPE).value_counts()
    counts = {t: 0 for t in CHANGE_TYPES}
    for kind, n in found.iter_rows():
        counts[str(kind)] = int(n)
    return ChangeSet(frame=frame, from_snapshot=from_snapshot, to_snapshot=to, counts=counts)


def _rows(table: Table, snapshot_id: int | None, target: pl.Schema) -> pl.DataFrame:
    """The table as of `snapshot_id` in the columns of `target` (a column it lacks: nulls)."""
    if snapshot_id is None:
        return pl.DataFrame(schema=target)
    with quiet():
        frame = snapshot_scan(table, snapshot_id).collect()
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in target.items() if c not in frame.columns]
    return typed(frame.with_columns(missing).select(list(target)), target)


def _tagged(frame: pl.DataFrame, kind: str) -> pl.DataFrame:
    return frame.with_columns(pl.lit(kind).alias(CHANGE_TYPE))


def _keyed(old: pl.DataFrame, new: pl.DataFrame, pk: list[str]) -> list[pl.DataFrame]:
    values = [c for c in new.columns if c not in pk]
    hit = "__po_changes_hit__"
    inserted = new.join(old.select(pk), on=pk, how="anti", nulls_equal=True)
    deleted = old.join(new.select(pk), on=pk, how="anti", nulls_equal=True)
    both = new.join(
        old.rename({c: f"{hit}{c}" for c in values}), on=pk, how="inner", nulls_equal=True
    )
    changed = pl.lit(False)
    for c in values:
        changed = changed | values_differ(pl.col(f"{hit}{c}"), pl.col(c))
    moved = both.filter(changed)
    after = moved.select(new.columns)
    before = moved.select(
        [*(pl.col(c) for c in pk), *(pl.col(f"{hit}{c}").alias(c) for c in values)]
    ).select(new.columns)
    pairs = pl.concat(
        [_tagged(before, UPDATE_BEFORE), _tagged(after, UPDATE_AFTER)], how="vertical"
    )
    if pairs.height:  # each update's before row next to its after row
        order = "__po_changes_order__"
        n = before.height
        pairs = (
            pairs.with_columns(pl.Series(order, [*range(n), *range(n)]))
            .sort(order, maintain_order=True)
            .drop(order)
        )
    return [_tagged(inserted, INSERT), _tagged(deleted, DELETE), pairs]


def _unkeyed(old: pl.DataFrame, new: pl.DataFrame) -> list[pl.DataFrame]:
    """Multiset difference: a row held n times before and m times after is |m - n| inserts or
    deletes (nulls and NaNs equal themselves, as in `values_differ`)."""
    n = "__po_changes_n__"
    cols = list(new.columns)
    if not cols:
        return [_tagged(new, INSERT)]
    before = old.group_by(cols, maintain_order=True).agg(pl.len().alias(f"{n}o"))
    after = new.group_by(cols, maintain_order=True).agg(pl.len().alias(n))
    joined = after.join(before, on=cols, how="full", nulls_equal=True, coalesce=True).with_columns(
        (pl.col(n).fill_null(0).cast(pl.Int64) - pl.col(f"{n}o").fill_null(0).cast(pl.Int64)).alias(
            n
        )
    )
    ins = joined.filter(pl.col(n) > 0)
    dels = joined.filter(pl.col(n) < 0).with_columns(-pl.col(n))
    out = []
    for part, kind in ((ins, INSERT), (dels, DELETE)):
        rep = part.select(pl.int_ranges(pl.col(n)).alias(f"{n}r"), *cols).explode(f"{n}r")
        out.append(_tagged(rep.select(cols), kind))
    return out


def iter_change_batches(
    table: Table,
    *,
    from_snapshot: int | None,
    to_snapshot: int | None = None,
    primary_key: Sequence[str] = (),
    branch: str = "main",
) -> Iterator[pl.DataFrame]:
    """`read_changes`' frame in batches."""
    changes = read_changes(
        table,
        from_snapshot=from_snapshot,
        to_snapshot=to_snapshot,
        primary_key=primary_key,
        branch=branch,
    )
    yield from changes.frame.iter_slices()
