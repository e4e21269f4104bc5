"""Postgres URL helpers: masking passwords, libpq URI to SQLAlchemy URL, another database, and
the project error for a failed connection to a URL (`connect_failure`).

Pure functions (no environment, no I/O); `settings` re-exports the URL helpers.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from pipeline_output.errors import (
    PipelineOutputError,
    PostgresUnavailable,
    SettingsError,
    connection_refused,
    driver_message,
)

PG_URL = "PIPELINE_OUTPUT_PG_URL"


def mask_url(url: str) -> str:
    """`url` with its password (in the userinfo or a `password=` parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hostinfo = netloc.rsplit("@", 1)
        if ":" in userinfo:
            user, password = userinfo.split(":", 1)
            if password:
                userinfo = f"{user}:***"
        netloc = f"{userinfo}@{hostinfo}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key == "password" for key, _ in pairs):
            masked = [(k, "***" if k == "password" else v) for k, v in pairs]
            query = urlencode(masked, safe="/*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    """True if `url` carries a password (so it must not be printed as is)."""
    return mask_url(url) != url


def to_sqlalchemy_url(url: str, *, driver: str) -> str:
    """Turn a libpq URI (`postgresql://` or `postgres://`) into `postgresql+<driver>://`."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise SettingsError(PG_URL, f"not a libpq URI (postgresql://...): {mask_url(url)}")
    return f"postgresql+{driver}://{rest}"


def with_database(url: str, *, database: str) -> str:
    """The libpq URI `url` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(
        (parts.scheme, parts.netloc, "/" + quote(database), parts.query, parts.fragment)
    )


def check_libpq_url(url: str, *, setting: str = PG_URL) -> str:
    """`url` if it is a well-formed libpq URI (`postgresql://`), else `SettingsError` naming
    `setting` (the password masked). Parses only: no connection."""
    import psycopg.conninfo

    scheme = url.partition("://")[0] if isinstance(url, str) else ""
    if scheme not in ("postgresql", "postgres"):
        shown = mask_url(url) if isinstance(url, str) else type(url).__name__
        raise SettingsError(
            setting,
            f"expected a libpq URI postgresql://user:password@host:port/dbname, got {shown}",
        )
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise SettingsError(setting, f"malformed URI {mask_url(url)}: {one_line(exc)}") from exc
    return url


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its class name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def connect_failure(exc: BaseException, *, setting: str, url: str) -> PipelineOutputError:
    """The error for a failed connection to `url` (from `setting`): `SettingsError` naming the
    setting when the server refused the URL (no such database or role, authentication failed:
    change the setting), else `PostgresUnavailable` (down, starting, dropped: retry). One line,
    the password masked, the driver's message without SQLAlchemy's link."""
    cause = f"cannot connect to {mask_url(url)}: {driver_message(exc)}"
    if connection_refused(exc):
        return SettingsError(setting, cause)
    return PostgresUnavailable(f"{setting}: {cause}")
