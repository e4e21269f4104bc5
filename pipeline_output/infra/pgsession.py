"""Every Postgres session the project opens: psycopg and ADBC connections pinned to UTC.

A server's (or database's, or role's) `TimeZone` setting changes how `timestamp` parameters compare
with `timestamptz` columns and how `timestamptz` values are rendered; nothing the project reads or
writes may depend on it. Every connection is opened with `options=-c TimeZone=UTC` (merged with any
`options` the URL already carries), so the setting holds from the first statement of the session,
for every transaction, whatever the server's default. Pure core: no Dagster.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SESSION_OPTIONS = "-c TimeZone=UTC"


def _options(existing: object) -> str:
    text = str(existing or "").strip()
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


def adbc_connect(url: str) -> Any:
    """An ADBC Postgres connection with the session pinned to UTC."""
    import adbc_driver_postgresql.dbapi as adbc

    return adbc.connect(session_conninfo(url))


__all__ = ["SESSION_OPTIONS", "adbc_connect", "connect", "session_conninfo"]
