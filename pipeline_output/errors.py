"""Domain errors: every error pipeline-output raises on purpose lives here.

Each carries a one-line message that names the dataset (or the setting) and the cause, so the CLI and
Dagster can show it without a traceback wall. Every class derives from exactly one of two bases:

- `RetryableError`: running the same thing again may succeed without changing anything (a
  concurrent writer won, a lock was busy or lost, Postgres was unreachable). Nothing was written.
- `TerminalError`: something must change first (the spec, the input, a setting, the data).

`from_third_party` maps the errors of our dependencies that a user can meet in normal operation
(pyiceberg commit failures, psycopg connection errors, a REST catalog refusing the credentials or
not answering) onto these classes, so the CLI prints one line for them too; a connection the
server refuses for its URL (`connection_refused`: no such database or role, authentication
failed), or a REST catalog's refusal of the credentials, is terminal, a server down or a dropped
session retryable. Errors that keep a builtin base (`LookupError`, `ValueError`,
`RuntimeError`) do so for callers that caught the builtin before these classes existed.
"""

from __future__ import annotations


class PipelineOutputError(Exception):
    """Base class of every deliberate pipeline-output error."""

    retryable = False


class RetryableError(PipelineOutputError):
    """Running again may succeed as it is; nothing was written."""

    retryable = True


class TerminalError(PipelineOutputError):
    """Something must change (spec, input, setting, data) before running again."""


# --- terminal: definitions, settings, input -------------------------------------------------------


class SettingsError(TerminalError):
    """A setting (environment variable or config file) is malformed or points nowhere usable."""

    def __init__(self, setting: str, cause: str) -> None:
        self.setting = setting
        self.cause = cause
        super().__init__(f"{setting}: {cause}")


class InvalidSpec(TerminalError):
    """A dataset spec is invalid (raised at construction, before any I/O)."""


class UnknownOption(InvalidSpec, TypeError):
    """A keyword no builder takes (`dataset(poool=...)`): Python's own `TypeError` for an
    unexpected keyword argument, naming the builder."""


class InvalidArgument(TerminalError, ValueError):
    """A call names something that does not exist (an arm, a status, a demo table) or misses a
    required argument (who flips)."""


class SnapshotExpired(InvalidArgument, LookupError):
    """A read or rollback names a version of a table that snapshot expiry removed: a time whose
    version of main is no longer known (the message names the earliest time that can still be
    answered), or a snapshot a lazy read was pinned to. Nothing was read or moved."""


class ChangesExpired(SnapshotExpired):
    """A read of a table's changes starts at a snapshot expiry removed: the change since it can no
    longer be computed (the message names the table and the snapshot); read from scratch instead."""


class ChangesUnsupported(TerminalError):
    """A table's changes cannot be read as asked: a primary key not in its schema, or a delete
    file kind the change feed does not read (equality deletes, which this project never writes)."""


class UnknownMode(InvalidArgument):
    """A flip names a mode that does not exist."""


class UnknownDataset(TerminalError, LookupError):
    """A name is not a dataset of the loaded code location (or of the demo)."""


class DatasetNotWritten(TerminalError, LookupError):
    """A read asks for a dataset that has no table (no rows) on that arm yet."""


class UnsupportedWrite(TerminalError):
    """The (strategy, target state, window) combination is not implemented; nothing was written."""


class BadInput(TerminalError):
    """The compute's rows cannot be written as they are; nothing was written."""


class DuplicateKeys(BadInput):
    """The compute returned the same primary key more than once."""


class NullKey(BadInput):
    """A primary-key column holds a null."""


class MissingKeyColumn(BadInput):
    """A primary-key column is absent from the compute's output."""


class RowsOutsideWindow(BadInput):
    """A windowed write received rows whose watermark lies outside the window."""


class EmptyComputeRefused(BadInput):
    """An empty compute would wipe a non-empty target (replace/sync) and `allow_empty` is off."""


class SchemaMismatch(BadInput):
    """The compute's schema cannot be written into the table's schema (incompatible type change)."""


class UndecodableManifestLayout(TerminalError):
    """A manifest (list) layout the native Avro decoding does not read: the caller decodes it with
    pyiceberg instead, so it never reaches a user."""


class UncomputedFileStatistics(TerminalError):
    """A data file's statistics the footer reading (`snapshot/file_statistics.py`) leaves to
    pyiceberg (a truncation or a physical type it does not handle): the caller computes them with
    pyiceberg instead, so it never reaches a user."""


class CorruptManifest(TerminalError, ValueError):
    """A table's manifest cannot be read as the Avro format says (a bad sync marker), or a write
    was about to make an empty one; `ValueError` as pyiceberg raises for the same conditions."""


class WriteAlreadyFinished(TerminalError, RuntimeError):
    """A pending legacy write was committed or rolled back already (a programming error)."""


# --- terminal: control plane and migration --------------------------------------------------------


class WindowLedgerError(TerminalError):
    """A window is unknown, or a planned window would break the chain (gap or overlap)."""


class MigrationError(TerminalError):
    """The control-plane schema cannot be migrated (changed applied file, bad file name, SQL error)."""


class DrainRefused(TerminalError):
    """`drain` is only allowed for a dataset flipped to iceberg whose last parity check passed."""


class AuditFailed(TerminalError):
    """An audited write did not pass its audit (a blocking check or parity failed, or the audit
    was already decided): main was not moved, the audit branch is kept for inspection."""


class RollbackRefused(TerminalError):
    """A rollback would break the canary or names no snapshot of main's history; nothing moved."""


class TableDropRefused(TerminalError):
    """`tables drop` names a table a dataset or source of the code location owns, no table of
    the namespace, or a table pipeline-output did not write; nothing was dropped."""


class EmbeddedPostgresError(TerminalError):
    """The embedded Postgres server could not be started, inspected or stopped."""


class ShopNotSeeded(TerminalError):
    """The demo shop's tables do not exist in the database (run `pipeline-output demo seed`)."""


class CatalogRefused(TerminalError):
    """The Iceberg REST catalog refused a request's credentials (HTTP 401 or 403)."""


class PostgresRefused(TerminalError):
    """A Postgres server (control plane, legacy arm or SQL catalog) answered but refused the
    connection for a reason running again will not change: the database or role does not exist,
    authentication failed, no pg_hba.conf entry. The URL (its setting) must change first."""


# --- retryable ------------------------------------------------------------------------------------


class EmptyWindowRead(RetryableError):
    """A delta window's source read returned no row although the source holds rows in its range
    (a read that disagrees with the source is an error, never an applied empty window)."""


class WriteConflict(RetryableError):
    """A concurrent commit made this write invalid and retries were exhausted; nothing was written."""


class AuditConflict(WriteConflict):
    """Main moved after an audit branched from it (another writer published first): the audited
    snapshot was not published over it; the branch is kept. Run the write again."""


class LockLost(WriteConflict):
    """The writer's advisory lock ended before its commit (its session was terminated); another
    writer may hold it, so the write was abandoned and nothing was committed."""


class FilesRemoved(WriteConflict):
    """Files a write had written were gone right before its commit (an orphan removal ran while
    the write was outside the table's locks: `lock=None`, or its lock's session ended); the
    write was abandoned and nothing was committed. Run it again."""


class MaintenanceConflict(WriteConflict):
    """A concurrent write removed or changed files a table-maintenance operation (compaction)
    planned to rewrite, and its retries ran out; nothing was committed and no writer's row was
    lost. Running it again re-plans on the table as it is then."""


class LockUnavailable(RetryableError):
    """The table's advisory lock could not be taken on the control-plane Postgres."""


class CommitStateUnknown(RetryableError):
    """The catalog did not say whether a commit landed (connection lost mid-commit). Re-running is
    safe: window markers make a landed commit a no-op; `pipeline-output doctor` lists its files."""


class PostgresUnavailable(RetryableError):
    """A Postgres server (control plane, legacy arm or SQL catalog) could not be reached."""


class CatalogUnavailable(RetryableError):
    """The Iceberg REST catalog could not be reached, or answered with a server error."""


# Connection failures that are the URL's fault (libpq's and the server's wording; a refusal has
# no SQLSTATE on the client side): a server that is down, starting or full is not among them.
_REFUSALS = (
    r'(database|role) "[^"]*" does not exist',
    r"authentication failed",
    r"no pg_hba\.conf entry",
    r"no password supplied",
    r"permission denied for database",
    r"server does not support SSL",
    r"unable to open database file",  # SQLite catalog: its directory does not exist
)


def driver_message(exc: BaseException) -> str:
    """The one-line message of a database error: a SQLAlchemy error's driver error (without the
    statement and SQLAlchemy's "Background on this error" link), else the error itself."""
    orig = getattr(exc, "orig", None)
    source = orig if isinstance(orig, BaseException) else exc
    return " ".join(str(source).split())[:300] or type(source).__name__


def connection_refused(exc: BaseException) -> bool:
    """Whether a failure to connect is the server refusing this URL (a configuration error:
    database or role missing, authentication failed, ...), not a server that is down or a
    connection that dropped (retryable)."""
    import re

    text = driver_message(exc)
    return any(re.search(pattern, text, re.IGNORECASE) for pattern in _REFUSALS)


def from_third_party(exc: BaseException) -> PipelineOutputError | None:
    """The project error for a dependency's error a user meets in normal operation, else None.

    Looks through `__cause__` (Dagster and pyiceberg wrap errors with `raise ... from`), so a wrapped
    commit failure is still reported as the commit failure.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, PipelineOutputError):
            return current
        mapped = _map_one(current)
        if mapped is not None:
            return mapped
        current = current.__cause__
    return None


def _map_one(exc: BaseException) -> PipelineOutputError | None:
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    try:
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
    except ImportError:  # pragma: no cover - pyiceberg is a dependency
        pass
    else:
        if isinstance(exc, CommitStateUnknownException):
            return CommitStateUnknown(f"Iceberg commit state unknown: {detail}")
        if isinstance(exc, CommitFailedException):
            return WriteConflict(f"Iceberg commit failed (a concurrent commit won): {detail}")
        rest = _rest_catalog_error(exc, detail)
        if rest is not None:
            return rest
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return None
    if isinstance(exc, psycopg.OperationalError):
        if connection_refused(exc):
            return PostgresRefused(f"Postgres refused the connection: {detail}")
        return PostgresUnavailable(f"Postgres unreachable or the session ended: {detail}")
    try:
        import sqlalchemy.exc
    except ImportError:  # pragma: no cover - the SQL catalog brings it
        return None
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        cause = driver_message(exc)  # never SQLAlchemy's "Background on this error" link
        if connection_refused(exc):
            return PostgresRefused(f"the SQL catalog's database refused the connection: {cause}")
        return PostgresUnavailable(f"the SQL catalog's database is unreachable: {cause}")
    return None


def _rest_catalog_error(exc: BaseException, detail: str) -> PipelineOutputError | None:
    """A REST catalog's refusal (credentials) or absence (down, unreachable, a server error)."""
    import sys

    from pyiceberg.exceptions import (
        ForbiddenError,
        OAuthError,
        ServerError,
        ServiceUnavailableError,
        UnauthorizedError,
    )

    if isinstance(exc, (ForbiddenError, UnauthorizedError, OAuthError)):
        return CatalogRefused(
            f"the Iceberg REST catalog refused the request: {detail} (check the catalog's "
            "credentials: client.access-key-id and client.secret-access-key, or credential / "
            "token)"
        )
    if isinstance(exc, (ServerError, ServiceUnavailableError)):
        return CatalogUnavailable(f"the Iceberg REST catalog failed: {detail}")
    requests = sys.modules.get("requests")  # (not imported: not one of its errors)
    if requests is not None and isinstance(
        exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
    ):
        return CatalogUnavailable(f"the Iceberg REST catalog {_unreachable(exc)}")
    return None


def _unreachable(exc: BaseException) -> str:
    """`at <scheme://host:port> is unreachable: <the socket's reason>` of a requests error,
    without urllib3's wrapping (`HTTPConnectionPool(...): Max retries exceeded ...`)."""
    import re
    from urllib.parse import urlsplit

    parts = urlsplit(str(getattr(getattr(exc, "request", None), "url", "") or ""))
    at = f" at {parts.scheme}://{parts.netloc}" if parts.netloc else ""
    text = str(exc)
    reason = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if reason is not None:
        why = reason.group(0).strip()
    elif "timed out" in text.lower():
        why = "timed out"
    else:
        why = " ".join(text.split())[:200] or type(exc).__name__
    return f"{at} is unreachable: {why}".lstrip()
