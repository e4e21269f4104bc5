"""Every lock the project takes, named in one place, and same-table writer serialization: a
Postgres session advisory lock keyed by the table identifier (`AdvisoryLock`).

The lock lives on a dedicated connection to the control-plane Postgres and is released when the
`with` block exits or the process dies (the server drops session locks of a closed connection), so a
crashed writer never leaves a table locked.

The same property means a writer can lose the lock while it works: an idle-session killer, a pooler
or a failover ends its backend and a second writer takes the lock at once. `LockStats.verify()` asks
the lock's own connection whether it still holds the lock; writers call it right before they commit
and fail with `LockLost` (nothing committed) when it does not. The commit itself is additionally
fenced by the table's snapshot (see `stores/iceberg/commit.py`), which closes the gap between the check and
the catalog's swap.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pipeline_output import pgsession
from pipeline_output.errors import LockLost, LockUnavailable

# -- every lock the project takes, by name (its Postgres advisory key is `lock_key(name)`) ---------

MIGRATIONS = "pipeline_output:migrations"  # control-plane migrations (transaction scope)


def iceberg_table(table: str) -> str:
    """Writers of one Iceberg table `namespace.name` (session scope, `AdvisoryLock.hold`)."""
    return f"iceberg:{table}"


def legacy_dataset(dataset: str) -> str:
    """Writers of one dataset in the legacy row store (transaction scope, with its rows)."""
    return f"pg:{dataset}"


def window_plan(dataset: str) -> str:
    """Planners of a dataset's delta windows (transaction scope)."""
    return f"windows:plan:{dataset}"


def window_apply(dataset: str) -> str:
    """Appliers of a dataset's delta windows: the exactly-once decision (session scope)."""
    return f"windows:apply:{dataset}"


def mode_flip(dataset: str) -> str:
    """Flips of a dataset's mode (transaction scope)."""
    return f"flip:{dataset}"


def acquire(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    transaction: bool,
    timeout_s: float | None = None,
    what: str | None = None,
) -> float:
    """Take the advisory lock `name` on `conn` — until the transaction ends (`transaction=True`)
    or the session does — waiting at most `timeout_s` (None: as long as it takes). Returns the
    seconds waited; `LockUnavailable` (naming `what`, default the lock) on timeout."""
    started = time.perf_counter()
    if timeout_s is not None:
        conn.execute(
            "SELECT set_config('lock_timeout', %s, %s)", (f"{int(timeout_s * 1000)}ms", transaction)
        )
    take = "SELECT pg_advisory_xact_lock(%s)" if transaction else "SELECT pg_advisory_lock(%s)"
    try:
        conn.execute(take, (lock_key(name),))
    except psycopg.errors.LockNotAvailable as exc:
        raise LockUnavailable(
            f"timed out after {timeout_s}s waiting for {what or f'the lock on {name}'}"
        ) from exc
    if timeout_s is not None:
        conn.execute("SELECT set_config('lock_timeout', '0', %s)", (transaction,))
    return time.perf_counter() - started


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `name` (same in every process and Python version)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _advisory_ids(key: int) -> tuple[int, int]:
    """`pg_locks` (classid, objid) of a bigint advisory lock key (high and low 32 bits)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


@dataclass
class LockStats:
    """How long the lock took to get, (once released) how long it was held, and `verify()`."""

    key: str
    wait_s: float = 0.0
    held_s: float = 0.0
    _verify: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def verify(self) -> None:
        """Raise `LockLost` unless the lock is still held by this writer (no-op without a lock)."""
        if self._verify is not None:
            self._verify()


class AdvisoryLock:
    """Serialize writers of one table across processes and machines sharing a Postgres."""

    def __init__(self, url: str, *, timeout_s: float | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s

    @contextmanager
    def hold(self, name: str) -> Iterator[LockStats]:
        """Hold the advisory lock for `name` for the duration of the block."""
        stats = LockStats(key=name)
        try:
            conn = pgsession.connect(self.url, autocommit=True)
        except psycopg.Error as exc:
            raise LockUnavailable(
                f"cannot reach the control-plane Postgres for the lock on {name}: "
                f"{type(exc).__name__}"
            ) from exc
        try:
            stats.wait_s = acquire(
                conn,
                name,
                transaction=False,
                timeout_s=self.timeout_s,
                what=f"the writer lock on {name}",
            )
            stats._verify = lambda: _verify_held(conn, name)
            acquired = time.perf_counter()
            try:
                yield stats
            finally:
                stats.held_s = time.perf_counter() - acquired
                stats._verify = None
        finally:
            conn.close()


def _verify_held(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    """Ask the lock's connection whether its backend still holds the advisory lock for `name`."""
    classid, objid = _advisory_ids(lock_key(name))
    try:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = pg_backend_pid() AND classid = %s::oid AND objid = %s::oid "
            "AND objsubid = 1)",
            (classid, objid),
        ).fetchone()
    except psycopg.Error as exc:
        raise LockLost(
            f"the writer lock on {name} was lost before the commit (its Postgres session ended: "
            f"{type(exc).__name__}); another writer may hold it now, so nothing was committed"
        ) from exc
    if not row or not row[0]:
        raise LockLost(
            f"the writer lock on {name} is no longer held by this writer; nothing was committed"
        )
