"""Time travel and rollback of a dataset's native table.

`parse_as_of` reads the `as_of` of an asset config or a command line: a snapshot id, or an
ISO-8601 time with a zone (`Z` or an offset; a naive time names no instant and is refused).
Pure core: no Dagster.
"""

from __future__ import annotations

from datetime import datetime

from pipeline_output.errors import InvalidArgument


def parse_as_of(text: str | int) -> int | datetime:
    """A snapshot id (digits) or a timezone-aware time (ISO-8601 with `Z` or an offset)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    raw = str(text).strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise InvalidArgument(
            f"as_of {raw!r} is neither a snapshot id nor an ISO-8601 time "
            "(e.g. 2026-12-01T09:30:00Z)"
        ) from exc
    if moment.tzinfo is None:
        raise InvalidArgument(
            f"as_of {raw!r} has no time zone; add Z (UTC) or an offset such as +01:00"
        )
    return moment
