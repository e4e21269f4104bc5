"""Delta windows: the half-open `(low, high]` value object and its partition-key encoding.

A row belongs to a window when `low < watermark <= high`. `low=None` is a window open at the bottom
(the first window of a backfill: every row up to `high`). Partition keys are sortable and readable:
`<low>..<high>` with integers zero-padded to 20 digits and timestamps in UTC ISO-8601 with
microseconds; an open bottom is an empty `<low>`, which sorts first.

Time zones are kept end to end: a bound that is zone-aware (a `timestamptz` / `Datetime(tz)`
watermark) is encoded in UTC with a trailing `Z` and decodes back to an aware UTC datetime; a naive
bound (a `timestamp` watermark) has no suffix and decodes naive. Keys written before the suffix
existed decode naive; `aligned` turns any window into the awareness a column needs (a naive bound
against an aware column is read as UTC, the project's one convention), which every reader and
writer applies against the column it compares with — so the comparison never depends on a server
or session time zone.

The watermark ledger's side of a window lives here too, so that the services that plan and apply
windows depend on the contract, not on the ledger's tables: `WindowRow` (one window in the ledger),
`Ticket` (what the apply protocol decided for one) and `WindowLog` (the ledger as the services use
it; `ledger.window_ledger.WindowLedger` is the one in the control-plane Postgres).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal, Protocol, TypedDict, Unpack

import polars as pl

from pipeline_output.errors import InvalidSpec

Bound = int | datetime | date

_INT_WIDTH = 20
_SEP = ".."


def _check_bound(value: object, what: str) -> Bound:
    if isinstance(value, bool) or not isinstance(value, (int, datetime, date)):
        raise InvalidSpec(f"window {what} must be an int, date or datetime, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise InvalidSpec(
            f"window {what} must be a non-negative integer watermark (sequence), got {value}"
        )
    return value


@dataclass(frozen=True)
class Window:
    """A half-open window `(low, high]` over a watermark column."""

    low: Bound | None
    high: Bound

    def __post_init__(self) -> None:
        _check_bound(self.high, "high")
        if self.low is not None:
            _check_bound(self.low, "low")
            if type(self.low) is not type(self.high):
                raise InvalidSpec(
                    f"window bounds must have one type, got {self.low!r} and {self.high!r}"
                )
            if isinstance(self.low, datetime) and (self.low.tzinfo is None) != (
                self.high.tzinfo is None  # type: ignore[union-attr]
            ):
                raise InvalidSpec(
                    f"window bounds must both be naive or both be zone-aware, got {self.low!r} "
                    f"and {self.high!r} (use Window.aligned)"
                )
            if not self.low < self.high:  # type: ignore[operator]
                raise InvalidSpec(
                    f"window low must be below high, got ({self.low!r}, {self.high!r}]"
                )

    def __str__(self) -> str:
        low = "-inf" if self.low is None else _text(self.low)
        return f"({low}, {_text(self.high)}]"

    @property
    def zoned(self) -> bool | None:
        """True for aware datetime bounds, False for naive ones, None for ints and dates."""
        if isinstance(self.high, datetime):
            return self.high.tzinfo is not None
        return None

    def aligned(self, *, aware: bool) -> Window:
        """This window with datetime bounds made aware (UTC) or naive (UTC wall clock).

        A naive bound made aware is read as UTC; an aware bound made naive is converted to UTC
        first. Int and date windows are returned unchanged.
        """
        if self.zoned is None or self.zoned == aware:
            return self
        low = None if self.low is None else _zone(self.low, aware=aware)
        return Window(low=low, high=_zone(self.high, aware=aware))

    def aligned_to(self, dtype: object) -> Window:
        """`aligned` for a polars dtype (a `Datetime` with or without a time zone)."""
        if isinstance(dtype, pl.Datetime):
            return self.aligned(aware=dtype.time_zone is not None)
        return self

    def contains(self, column: str, dtype: object = None) -> pl.Expr:
        """A polars predicate: `low < column <= high`.

        Pass the column's `dtype` whenever the watermark may be a datetime: the bounds are then
        compared in the column's own time zone (polars refuses naive/aware comparisons).
        """
        col = pl.col(column)
        expr = col <= _lit(self.high, dtype)
        if self.low is not None:
            expr = (col > _lit(self.low, dtype)) & expr
        return expr

    def contains_value(self, value: Bound) -> bool:
        """Whether one watermark value lies in the window."""
        if self.low is not None and not value > self.low:  # type: ignore[operator]
            return False
        return bool(value <= self.high)  # type: ignore[operator]

    def to_key(self) -> str:
        """The partition key `low..high` (sortable, readable, decodable by `from_key`)."""
        low = "" if self.low is None else _encode(self.low)
        return f"{low}{_SEP}{_encode(self.high)}"

    @classmethod
    def from_key(cls, key: str) -> Window:
        """Decode a partition key produced by `to_key`."""
        low_text, sep, high_text = key.partition(_SEP)
        if not sep or not high_text:
            raise InvalidSpec(f"not a window partition key: {key!r} (expected 'low..high')")
        high = _decode(high_text)
        low = _decode(low_text) if low_text else None
        return cls(low=low, high=high)


def _zone(value: Bound, *, aware: bool) -> Bound:
    if not isinstance(value, datetime):
        return value
    if aware:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)


def _lit(value: Bound, dtype: object) -> pl.Expr:
    if isinstance(value, datetime) and isinstance(dtype, pl.Datetime):
        zone = dtype.time_zone
        if zone is None:
            return pl.lit(_zone(value, aware=False))
        return pl.lit(_zone(value, aware=True)).dt.convert_time_zone(zone)
    return pl.lit(value)


def _text(value: Bound) -> str:
    return value.isoformat() if isinstance(value, (datetime, date)) else str(value)


def _encode(value: Bound) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    if value < 0:
        raise InvalidSpec(f"integer watermarks must be non-negative to encode as keys, got {value}")
    return str(value).zfill(_INT_WIDTH)


def _decode(text: str) -> Bound:
    if text.isdigit():
        return int(text)
    try:
        if "T" in text and text.endswith("Z"):
            return datetime.strptime(text[:-1], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)
        if "T" in text:
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f")
        return date.fromisoformat(text)
    except ValueError as exc:
        raise InvalidSpec(f"not a window bound: {text!r}") from exc


State = Literal["planned", "applying", "staged", "applied", "failed"]
NEEDS_RUN: tuple[State, ...] = ("planned", "failed")  # what the sensor requests runs for
Action = Literal["apply", "skip", "repair"]


@dataclass(frozen=True)
class WindowRow:
    """One window in the watermark ledger: its place in the dataset's chain (`seq`), its state
    and attempts, and where its write landed."""

    id: int
    dataset: str
    seq: int
    window: Window
    partition_key: str
    state: State
    attempts: int
    run_id: str | None
    iceberg_snapshot_id: int | None
    pg_deploy_id: int | None
    rows_read: int | None
    rows_written: int | None
    error: str | None
    started_at: datetime | None
    applied_at: datetime | None

    @property
    def marker(self) -> str:
        """The attempt marker of the current attempt (written into the snapshot summary)."""
        return f"{self.id}:{self.attempts}"


@dataclass(frozen=True)
class Ticket:
    """What `WindowLog.begin` decided for one window: `apply` (the attempt is recorded), `skip`
    (already applied) or `repair` (a previous attempt may have committed)."""

    action: Action
    row: WindowRow


class Landed(TypedDict, total=False):
    """Where an applied window's write landed (a snapshot, a legacy deploy) and its rows."""

    iceberg_snapshot_id: int | None
    pg_deploy_id: int | None
    rows_read: int | None
    rows_written: int | None


class WindowLog(Protocol):
    """The watermark ledger as the services use it: the chain of a dataset's windows (planned,
    read) and the exactly-once apply protocol (`ledger.window_ledger` describes it)."""

    def get(self, dataset: str, partition_key: str) -> WindowRow | None: ...

    def last(self, dataset: str) -> WindowRow | None: ...

    def pending(self, dataset: str) -> list[WindowRow]: ...

    def applied_windows(self, dataset: str) -> list[WindowRow]: ...

    def unapplied_ids(self, dataset: str) -> set[int]: ...

    def plan(self, dataset: str, windows: Sequence[Window]) -> list[WindowRow]: ...

    def apply_lock(self, dataset: str) -> AbstractContextManager[None]: ...

    def begin(
        self, dataset: str, partition_key: str, *, run_id: str | None, restate: bool = False
    ) -> Ticket: ...

    def retry_after_lost_attempt(self, row: WindowRow, *, run_id: str | None) -> WindowRow: ...

    def mark_applied(self, row: WindowRow, **landed: Unpack[Landed]) -> None: ...

    def mark_staged(self, row: WindowRow, *, iceberg_snapshot_id: int | None) -> None: ...

    def mark_failed(self, row: WindowRow, *, error: str) -> None: ...

    def publish_staged(self, window_id: int, attempts: int, **landed: Unpack[Landed]) -> bool: ...

    def is_staged(self, window_id: int, attempts: int) -> bool: ...

    def fail_staged(self, window_id: int, attempts: int, *, error: str) -> None: ...

    def reset_to_planned(
        self,
        dataset: str,
        *,
        snapshot_ids: set[int],
        applied_after: datetime | None,
        reason: str,
        conn: Any = None,
    ) -> int: ...
