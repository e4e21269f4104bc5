"""Every Postgres session the project opens: psycopg and ADBC connections pinned to UTC.

A server's (or database's, or role's) `TimeZone` setting changes how `timestamp` parameters compare
with `timestamptz` columns and how `timestamptz` values are rendered; nothing the project reads or
writes may depend on it. Every connection is opened with `options=-c TimeZone=UTC` (merged with any
`options` the URL already carries), so the setting holds from the first statement of the session,
for every transaction, whatever the server's default. Pure core: no Dagster.

`pooled(url)`: this process's reusable autocommit sessions (the ledger's short transactions, the
advisory locks of a write), so a write opens no new connection: a session is handed to one caller
at a time (threads each get their own), checked with an empty query before reuse, returned only
when it is idle and its caller ended cleanly (else closed), and a forked child never touches the
sessions it inherited (they stay its parent's).
"""

from __future__ import annotations

import functools
import os
import threading
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SESSION_OPTIONS = "-c TimeZone=UTC"


def _options(existing: object) -> str:
    text = str(existing or "").strip()
    if text == SESSION_OPTIONS or text.endswith(" " + SESSION_OPTIONS):
        return text  # added already: `session_conninfo` of its own result is that result
    return f"{text} {SESSION_OPTIONS}".strip()


def session_conninfo(url: str) -> str:
    """`url` with the session options added (a URI stays a URI: ADBC and libpq take both)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        existing = next((v for k, v in query if k == "options"), "")
        query = [(k, v) for k, v in query if k != "options"]
        query.append(("options", _options(existing)))
        return urlunsplit(parts._replace(query=urlencode(query, safe="/", quote_via=quote)))
    params = conninfo_to_dict(url)
    return make_conninfo(url, options=_options(params.get("options")))


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """`psycopg.connect` with the session pinned to UTC (same keyword arguments)."""
    return psycopg.connect(session_conninfo(url), **kwargs)


MAX_IDLE = 4  # idle sessions kept per URL


class _Pool:
    """Idle autocommit sessions per URL, of the process that opened them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.idle: dict[str, list[psycopg.Connection[Any]]] = {}
        self.inherited: list[psycopg.Connection[Any]] = []  # a parent's: never used nor closed

    def _mine(self) -> None:
        if self.pid != os.getpid():  # forked: the sessions belong to the parent
            self.inherited.extend(c for idle in self.idle.values() for c in idle)
            self.idle, self.pid = {}, os.getpid()

    def take(self, url: str) -> psycopg.Connection[Any] | None:
        while True:
            with self.lock:
                self._mine()
                idle = self.idle.get(url)
                conn = idle.pop() if idle else None
            if conn is None:
                return None
            try:
                conn.execute("")  # the server may have ended it while it was idle
                return conn
            except psycopg.Error:
                with suppress(psycopg.Error):
                    conn.close()

    def give(self, url: str, conn: psycopg.Connection[Any], *, clean: bool) -> None:
        with self.lock:
            self._mine()
            idle = self.idle.setdefault(url, [])
            reuse = (
                clean
                and not conn.closed
                and not conn.broken
                and conn.info.transaction_status == pq.TransactionStatus.IDLE
                and len(idle) < MAX_IDLE
            )
            if reuse:
                idle.append(conn)
                return
        with suppress(psycopg.Error):
            conn.close()


_POOL = _Pool()


class _Lease:
    """One pooled session, for one `with` block (or, `share`d, the session of a block this
    thread is in)."""

    def __init__(self, url: str, connect_timeout: int | None, *, share: bool = False) -> None:
        # pooled by the session's conninfo: a URL given with the session options already (the
        # SQL catalog's, derived from its SQLAlchemy URL) shares the control plane's sessions
        url = _session_key(url)
        self.url = url
        self.shared = _in_use(url) if share else None
        if self.shared is not None:
            self.conn = self.shared
            return
        conn = _POOL.take(url)
        if conn is None:
            timeout = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
            conn = connect(url, autocommit=True, **timeout)
        self.conn = conn

    def __enter__(self) -> psycopg.Connection[Any]:
        if self.shared is None:
            _leased().append((self.url, self.conn))
        return self.conn

    def __exit__(self, kind: object, *_: object) -> None:
        if self.shared is not None:  # the block that leased it returns or closes it
            return
        leased = _leased()
        with suppress(ValueError):
            leased.remove((self.url, self.conn))
        _POOL.give(self.url, self.conn, clean=kind is None)


_THREAD = threading.local()


def _leased() -> list[tuple[str, psycopg.Connection[Any]]]:
    """The sessions this thread's open `with pooled(...)` blocks hold, innermost last."""
    found: list[tuple[str, psycopg.Connection[Any]]] | None = getattr(_THREAD, "leased", None)
    if found is None:
        found = []
        _THREAD.leased = found
    return found


def _in_use(url: str) -> psycopg.Connection[Any] | None:
    """The innermost session of `url` this thread holds in a `with pooled(...)` block, when it
    is usable for one more statement: open and outside any transaction."""
    conn = next((c for held, c in reversed(_leased()) if held == url), None)
    if conn is None or conn.closed or conn.broken:
        return None
    idle: bool = conn.info.transaction_status == pq.TransactionStatus.IDLE
    return conn if idle else None


@functools.lru_cache(maxsize=32)
def _session_key(url: str) -> str:
    return session_conninfo(url)


def pooled(url: str, *, connect_timeout: int | None = None, share: bool = False) -> _Lease:
    """An autocommit session of this process's pool (opened now when none is idle — within
    `connect_timeout` seconds when given —: a `psycopg.Error` then), for a `with` block;
    returned to the pool after it when the block ended without an exception and the session is
    idle — the caller leaves no session state behind (its session advisory locks released,
    settings reset); a failed block's session is closed (closing releases whatever it held).

    `share`: for a block of single autocommit statements that leave no session state (the SQL
    catalog's lookups and swaps), the session of a `with pooled(url)` block this thread is in
    already — a write's lock session: one session for both, no second connection opened while
    the lock is held — when that session is outside any transaction; that block returns or
    closes it, not this one."""
    return _Lease(url, connect_timeout, share=share)


def adbc_connect(url: str) -> Any:
    """An ADBC Postgres connection with the session pinned to UTC."""
    import adbc_driver_postgresql.dbapi as adbc

    return adbc.connect(session_conninfo(url))


__all__ = ["SESSION_OPTIONS", "adbc_connect", "connect", "pooled", "session_conninfo"]
