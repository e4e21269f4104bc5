"""Every lock the project takes, named in one place, and same-table writer serialization: a
Postgres session advisory lock keyed by the table identifier (`AdvisoryLock`).

The lock lives on a session of the process's pool of control-plane sessions (`pgsession.pooled`:
no new connection per write) and is released when the `with` block exits (the session closed
when the block raised) or the process dies (the server drops session locks of a closed connection), so a
crashed writer never leaves a table locked.

The same property means a writer can lose the lock while it works: an idle-session killer, a pooler
or a failover ends its backend and a second writer takes the lock at once. `LockStats.verify()` asks
the lock's own connection whether it still holds the lock; writers call it right before they commit
and fail with `LockLost` (nothing committed) when it does not. The commit itself is additionally
fenced by the table's snapshot (see `stores/iceberg/snapshot/commit.py`), which closes the gap between the check and
the catalog's swap.

A lock can also be taken *shared* (`AdvisoryLock.share`: any number of holders at once) or *alone*
without queueing (`AdvisoryLock.alone`: polls, so waiting for it never delays the shared holders);
`hold(..., on=held)` takes a lock on the connection of one already held (one session per write).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pipeline_output.errors import LockLost, LockUnavailable
from pipeline_output.infra import pgsession
from pipeline_output.infra.settings import mask_url, one_line

# -- every lock the project takes, by name (its Postgres advisory key is `lock_key(name)`) ---------

MIGRATIONS = "pipeline_output:migrations"  # control-plane migrations (transaction scope)


def iceberg_table(table: str) -> str:
    """Writers of one Iceberg table `namespace.name` (session scope, `AdvisoryLock.hold`)."""
    return f"iceberg:{table}"


def iceberg_files(table: str) -> str:
    """Writes of one Iceberg table whose files are not committed yet (session scope): every
    writer shares it from its first file to its commit; orphan removal takes it alone
    (`stores/iceberg/snapshot/commit.py`)."""
    return f"iceberg-files:{table}"


def legacy_dataset(dataset: str) -> str:
    """Writers of one dataset in the legacy row store (transaction scope, with its rows)."""
    return f"pg:{dataset}"


def window_plan(dataset: str) -> str:
    """Planners of a dataset's delta windows (transaction scope)."""
    return f"windows:plan:{dataset}"


def window_apply(dataset: str) -> str:
    """Appliers of a dataset's delta windows: the exactly-once decision (session scope)."""
    return f"windows:apply:{dataset}"


def consume_changes(dataset: str) -> str:
    """Runs of one incremental downstream: read its position, write, record (session scope)."""
    return f"changes:consume:{dataset}"


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
    shared: bool = False,
) -> float:
    """Take the advisory lock `name` on `conn` — until the transaction ends (`transaction=True`)
    or the session does; `shared`: beside other shared holders — waiting at most `timeout_s`
    (None: as long as it takes). Returns the seconds waited; `LockUnavailable` (naming `what`,
    default the lock) on timeout."""
    started = time.perf_counter()
    if timeout_s is not None:
        conn.execute(
            "SELECT set_config('lock_timeout', %s, %s)", (f"{int(timeout_s * 1000)}ms", transaction)
        )
    take = _TAKE[(transaction, shared)]
    try:
        conn.execute(take, (lock_key(name),))
    except psycopg.errors.LockNotAvailable as exc:
        raise LockUnavailable(
            f"timed out after {timeout_s}s waiting for {what or f'the lock on {name}'}"
        ) from exc
    if timeout_s is not None:
        conn.execute("SELECT set_config('lock_timeout', '0', %s)", (transaction,))
    return time.perf_counter() - started


_TAKE = {  # (transaction scope, shared) -> the statement taking the lock
    (False, False): "SELECT pg_advisory_lock(%s)",
    (False, True): "SELECT pg_advisory_lock_shared(%s)",
    (True, False): "SELECT pg_advisory_xact_lock(%s)",
    (True, True): "SELECT pg_advisory_xact_lock_shared(%s)",
}


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

    def covers_files(self) -> bool:
        """Whether a passing `verify()` proves no orphan removal of the project ran since the
        write's first file: this is an Iceberg table's writer lock (orphan removal takes it, and
        the table's files lock, before it decides), and every writer writes its files under it
        or, before it, under the files lock shared on the session it is then taken on
        (`hold(..., on=)`; `stores/iceberg/snapshot/commit.py`, "Writes in flight")."""
        return self._verify is not None and self.key.startswith(iceberg_table(""))


@contextmanager
def held(url: str, name: str) -> Iterator[None]:
    """Hold `name` for the block on a session of its own, waiting as long as it takes: released
    when the block ends, or by the server when the process dies."""
    with pgsession.connect(url, autocommit=True) as conn:
        acquire(conn, name, transaction=False)
        try:
            yield
        finally:
            with suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(name),))


@dataclass(frozen=True)
class HeldLock:
    """A lock held on its own session (`share`, `alone`): `hold(..., on=it)` takes another lock
    on the same connection."""

    name: str
    conn: psycopg.Connection[Any] = field(repr=False, compare=False)
    wait_s: float = 0.0


class AdvisoryLock:
    """Serialize writers of one table across processes and machines sharing a Postgres."""

    def __init__(self, url: str, *, timeout_s: float | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s

    @contextmanager
    def _session(self, name: str) -> Iterator[psycopg.Connection[Any]]:
        """A session of the process's pool (`pgsession.pooled`) for the lock `name`: the block
        releases what it took on it, else it raises and the session is closed."""
        try:
            lease = pgsession.pooled(self.url)
        except psycopg.Error as exc:
            raise LockUnavailable(
                f"cannot reach the control-plane Postgres for the lock on {name}: "
                f"{type(exc).__name__}: {one_line(exc).replace(self.url, mask_url(self.url))}"
            ) from exc
        with lease as conn:
            yield conn

    @contextmanager
    def hold(self, name: str, *, on: HeldLock | None = None) -> Iterator[LockStats]:
        """Hold the advisory lock for `name` for the duration of the block (on the session of
        `on` when given: released then, that session goes on; else on a pooled session)."""
        stats = LockStats(key=name)
        if on is not None:
            with self._held(name, on.conn, stats, on=on) as held:
                yield held
            return
        with self._session(name) as conn, self._held(name, conn, stats, on=None) as held:
            yield held

    @contextmanager
    def _held(
        self,
        name: str,
        conn: psycopg.Connection[Any],
        stats: LockStats,
        *,
        on: HeldLock | None,
    ) -> Iterator[LockStats]:
        """Take `name` on `conn` (the session of `on`, or a pooled one) for the block, then
        release it: on `on`'s session whatever happened, on a pooled one after a clean exit
        (an exception closes that session instead, which releases it)."""
        try:
            stats.wait_s = acquire(
                conn,
                name,
                transaction=False,
                timeout_s=self.timeout_s,
                what=f"the writer lock on {name}",
            )
        except psycopg.OperationalError as exc:
            if on is None:
                raise
            raise LockLost(
                f"the session holding {on.name} ended before the writer lock on {name} was "
                f"taken ({type(exc).__name__}); nothing was committed"
            ) from exc
        stats._verify = lambda: _verify_held(conn, name)
        acquired = time.perf_counter()
        try:
            yield stats
        finally:
            stats.held_s = time.perf_counter() - acquired
            stats._verify = None
            if on is not None:
                with suppress(psycopg.Error):
                    conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(name),))
        if on is None:
            _release(conn, name)

    @contextmanager
    def share(self, name: str) -> Iterator[HeldLock]:
        """Hold `name` shared (beside any other shared holder) on a pooled session of its own;
        waits only while someone holds it alone."""
        with self._session(name) as conn:
            waited = acquire(conn, name, transaction=False, timeout_s=self.timeout_s, shared=True)
            yield HeldLock(name=name, conn=conn, wait_s=waited)
            _release(conn, name, shared=True)

    @contextmanager
    def alone(self, name: str, *, wait_s: float, what: str | None = None) -> Iterator[HeldLock]:
        """Hold `name` alone, on a session of its own. Never queues (a queued request would make
        every new shared holder wait behind it): tries every 50-500 ms for at most `wait_s`
        seconds, then `LockUnavailable` naming `what`."""
        with self._session(name) as conn:
            started = time.perf_counter()
            pause = 0.05
            while not _try(conn, name):
                waited = time.perf_counter() - started
                if waited >= wait_s:
                    raise LockUnavailable(
                        f"timed out after {wait_s:g}s waiting for {what or f'the lock on {name}'}"
                    )
                time.sleep(min(pause, wait_s - waited))
                pause = min(pause * 2, 0.5)
            yield HeldLock(name=name, conn=conn, wait_s=time.perf_counter() - started)
            _release(conn, name)


def _release(conn: psycopg.Connection[Any], name: str, *, shared: bool = False) -> None:
    """Release the session lock `name` so that its pooled session can be reused; a session that
    cannot (it ended: the lock is gone with it) is closed, never pooled."""
    unlock = "SELECT pg_advisory_unlock_shared(%s)" if shared else "SELECT pg_advisory_unlock(%s)"
    try:
        conn.execute(unlock, (lock_key(name),))
    except psycopg.Error:
        with suppress(psycopg.Error):
            conn.close()


def _try(conn: psycopg.Connection[Any], name: str) -> bool:
    """Take the session advisory lock `name` alone if nobody holds it (never waits)."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(name),)).fetchone()
    return bool(row and row[0])


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
