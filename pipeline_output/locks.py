"""Same-table writer serialization: a Postgres session advisory lock keyed by the table identifier.

The lock lives on a dedicated connection to the control-plane Postgres and is released when the
`with` block exits or the process dies (the server drops session locks of a closed connection), so a
crashed writer never leaves a table locked.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from pipeline_output import pgsession
from pipeline_output.errors import LockUnavailable


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `name` (same in every process and Python version)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass
class LockStats:
    """How long the lock took to get, and (once released) how long it was held."""

    key: str
    wait_s: float = 0.0
    held_s: float = 0.0


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
            started = time.perf_counter()
            if self.timeout_s is not None:
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, false)",
                    (f"{int(self.timeout_s * 1000)}ms",),
                )
            try:
                conn.execute("SELECT pg_advisory_lock(%s)", (lock_key(name),))
            except psycopg.errors.LockNotAvailable as exc:
                raise LockUnavailable(
                    f"timed out after {self.timeout_s}s waiting for the writer lock on {name}"
                ) from exc
            stats.wait_s = time.perf_counter() - started
            acquired = time.perf_counter()
            try:
                yield stats
            finally:
                stats.held_s = time.perf_counter() - acquired
        finally:
            conn.close()
