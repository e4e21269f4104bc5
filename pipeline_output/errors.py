"""Domain errors: every error pipeline-output raises on purpose lives here.

Each carries a one-line message that names the dataset (or the setting) and the cause, so the CLI and
Dagster can show it without a traceback wall.
"""

from __future__ import annotations


class PipelineOutputError(Exception):
    """Base class of every deliberate pipeline-output error."""


class SettingsError(PipelineOutputError):
    """A setting (environment variable or config file) is malformed or points nowhere usable."""

    def __init__(self, setting: str, cause: str) -> None:
        self.setting = setting
        self.cause = cause
        super().__init__(f"{setting}: {cause}")


class InvalidSpec(PipelineOutputError):
    """A dataset spec is invalid (raised at construction, before any I/O)."""


class UnsupportedWrite(PipelineOutputError):
    """The (strategy, target state, window) combination is not implemented; nothing was written."""


class BadInput(PipelineOutputError):
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


class EmptyWindowRead(PipelineOutputError):
    """A delta window's source read returned no row although the source holds rows in its range
    (a read that disagrees with the source is an error, never an applied empty window)."""


class WriteConflict(PipelineOutputError):
    """A concurrent commit made this write invalid and retries were exhausted; nothing was written."""


class LockLost(WriteConflict):
    """The writer's advisory lock ended before its commit (its session was terminated); another
    writer may hold it, so the write was abandoned and nothing was committed."""


class LockUnavailable(PipelineOutputError):
    """The table's advisory lock could not be taken on the control-plane Postgres."""
