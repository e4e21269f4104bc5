"""The change feed: what changed in a native table between two of its snapshots.

Owns `read_changes`: the net change between the table as of `from_snapshot` (exclusive) and as
of `to_snapshot` (inclusive), as rows tagged with a change type (`CHANGE_TYPE`), the `to`
snapshot (`CHANGE_SNAPSHOT`) and its commit time (`CHANGE_COMMIT_TIME`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import polars as pl
from pyiceberg.table import Table

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
    branch's head)."""
    raise NotImplementedError  # the skeleton: the reader lands next


def iter_change_batches(
    table: Table,
    *,
    from_snapshot: int | None,
    to_snapshot: int | None = None,
    primary_key: Sequence[str] = (),
    branch: str = "main",
) -> Iterator[pl.DataFrame]:
    """`read_changes`' frame in batches."""
    raise NotImplementedError
