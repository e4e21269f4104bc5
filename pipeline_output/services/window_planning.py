"""Planning delta windows: what they are cut from, which windows come next, which rows each one
reads and writes — the one planner the window sensor, `pipeline-output materialize` (through the
sensor's tick) and `pipeline-output plan` call.

A window is cut from an upstream (`WindowUpstream`): a source table (Postgres or Iceberg) or
another dataset (a chained delta dataset); the Dagster layer binds both
(`dagster_layer/window_upstreams.py`). `windows_now` says which windows come next: the next starts
where the ledger's last one ends (or open at the bottom / at `Delta.start` for the first) and ends
at the upstream's high-water mark; with `max_rows` the range is cut at watermark values so that no
window holds more than `max_rows` source rows (a single watermark value shared by more rows stays
whole), at most `MAX_WINDOWS_PER_PLAN` windows per plan (the rest of a backlog is planned on the
next tick). `plan_next` records them in the ledger (the sensor's tick); `pending_windows` shows
them without recording (`pipeline-output plan`). `run_groups` turns the windows that need a run
into runs of consecutive windows (`Delta.max_windows_per_run`). A window reads `(low, high]` of
its source, widened back by `Delta.lookback` earlier windows of the ledger (late rows); strategies
whose write is scoped to the window (`replace`, `sync`) write the window they read
(`window_scopes`). Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

import polars as pl

from pipeline_output.contract.spec import DatasetSpec, WatermarkValue
from pipeline_output.contract.windows import Window, WindowLog, WindowRow

# One plan (one sensor tick) records at most this many windows; a larger backlog continues on the
# next tick, each window still within `max_rows`.
MAX_WINDOWS_PER_PLAN = 1000
# A plan reads at most this many watermark values to cut windows (bounded memory in the sensor).
MAX_VALUES_PER_PLAN = 2_000_000
NOT_PLANNED = "not yet planned"  # the state `pending_windows` gives a window not in the ledger


@dataclass(frozen=True)
class UpstreamRead:
    """One read of an upstream: the highest watermark value whose rows may be planned now (None:
    nothing yet) and, for a source, its row count (the sensor records both as an observation of
    the source; None for a dataset, whose materializations say it)."""

    high_water_mark: WatermarkValue | None
    rows: int | None = None


class WindowUpstream(Protocol):
    """What a delta dataset's windows are cut from (a source table, or another dataset).

    `read()`: its high-water mark now (`UpstreamRead`). `values(window, n)`: the first `n`
    watermark values inside `window`, ascending (where `max_rows` cuts). `count(window)`: how many
    of its rows lie in `window` (None: not counted)."""

    @property
    def name(self) -> str: ...

    def read(self) -> UpstreamRead: ...

    def values(self, window: Window, n: int) -> pl.Series: ...

    def count(self, window: Window) -> int | None: ...


@dataclass(frozen=True)
class CutPoints:
    """Where a range is cut into windows: window highs inside it, ascending.

    `complete` is False when only the start of the range was read (a bounded read): the range past
    the last point is not planned yet (its rows are unknown), it continues on the next tick."""

    points: tuple[Any, ...]
    complete: bool = True


def values_to_read(max_rows: int) -> int:
    """How many watermark values one plan reads to cut windows of `max_rows` rows (one more than
    it needs, so that a read that returns them all says the range was longer)."""
    return min(MAX_WINDOWS_PER_PLAN * max_rows, MAX_VALUES_PER_PLAN) + 1


def next_windows(
    *,
    last_high: WatermarkValue | None,
    first: bool,
    start: WatermarkValue | None,
    high_water_mark: WatermarkValue | None,
    cut_points: Callable[[WatermarkValue | None, WatermarkValue], CutPoints] | None = None,
    limit: int = MAX_WINDOWS_PER_PLAN,
) -> list[Window]:
    """The windows to plan now (empty when the source has not moved past the last window).

    At most `limit` windows; every window but one that ends at the high-water mark ends at a cut
    point, so none holds more than `max_rows` rows (unless they share one watermark value). When
    the backlog needs more windows than `limit` (or the cut read stopped early), the plan stops at
    the last cut point and the rest is planned on the next tick."""
    if high_water_mark is None:
        return []
    low = start if first else last_high
    if isinstance(high_water_mark, datetime) and isinstance(low, datetime):
        # A `timestamptz` source reports an aware high-water mark; a ledger key written before
        # keys carried their zone (or a naive `Delta.start`) is naive: both are UTC.
        low = Window(low=None, high=low).aligned(aware=high_water_mark.tzinfo is not None).high
    if low is not None and not high_water_mark > low:  # type: ignore[operator]
        return []
    cuts = cut_points(low, high_water_mark) if cut_points is not None else CutPoints(())
    highs = sorted({c for c in cuts.points if (low is None or c > low) and c <= high_water_mark})
    if cuts.complete and (not highs or highs[-1] != high_water_mark):
        highs.append(high_water_mark)
    out = []
    for high in highs[:limit]:
        out.append(Window(low=low, high=high))
        low = high
    return out


def cut_points_of(
    values: pl.Series, *, low: WatermarkValue | None, max_rows: int, complete: bool = True
) -> CutPoints:
    """Cut points for `values` (the source watermark column within the range) every `max_rows`
    rows; rows sharing a watermark value stay in one window. `complete` False: `values` are only
    the range's first values (a bounded read), so the rows after the last cut are left out."""
    ordered = values.drop_nulls().sort()
    cuts = []
    i = max_rows - 1
    while i < ordered.len() - 1:
        cut = ordered[i]
        cuts.append(cut)
        # skip past every row with this same watermark value
        i = int(ordered.search_sorted(cut, side="right")) - 1 + max_rows
    if not complete and not cuts and ordered.len():
        cuts.append(ordered[ordered.len() - 1])  # one watermark value held every row read
    return CutPoints(tuple(cuts), complete=complete)


def run_groups(rows: Sequence[WindowRow], *, max_per_run: int) -> list[list[WindowRow]]:
    """`rows` (windows that need a run) as runs: consecutive windows (by ledger seq) together, at
    most `max_per_run` per run, in window order. A window alone in its stretch is its own run."""
    groups: list[list[WindowRow]] = []
    for row in sorted(rows, key=lambda r: r.seq):
        last = groups[-1] if groups else None
        if last is not None and last[-1].seq == row.seq - 1 and len(last) < max_per_run:
            last.append(row)
        else:
            groups.append([row])
    return groups


def window_scopes(
    spec: DatasetSpec, windows: Sequence[Window], ledger_rows: Sequence[WindowRow]
) -> list[tuple[Window, Window, Window]]:
    """(window, the window its source read covers, the window its write is scoped to) for each of
    `windows`: the read reaches back `Delta.lookback` earlier windows of `ledger_rows` (the
    dataset's ledger, oldest first); `replace` and `sync` write what they read, the others only
    their own window's rows."""
    lookback = spec.delta.lookback if spec.delta is not None else 0
    keys = [row.partition_key for row in ledger_rows]
    scoped = spec.strategy_def.window_scoped
    out = []
    for window in windows:
        read = window
        if lookback and window.to_key() in keys:
            i = keys.index(window.to_key())
            read = Window(low=ledger_rows[max(0, i - lookback)].window.low, high=window.high)
        out.append((window, read, read if scoped else window))
    return out


def windows_now(
    spec: DatasetSpec, upstream: WindowUpstream, *, last: WindowRow | None, seen: UpstreamRead
) -> list[Window]:
    """The windows a plan makes after the ledger's `last` window, given what it `seen` of the
    upstream (each within `Delta.max_rows`; at most one plan's worth). Nothing is recorded:
    `plan_next` records them, `pending_windows` shows them."""
    assert spec.delta is not None
    delta = spec.delta
    cut: Callable[[Any, Any], CutPoints] | None = None
    if delta.max_rows:
        max_rows = delta.max_rows

        def cut(low: Any, high: Any) -> CutPoints:
            n = values_to_read(max_rows)
            values = upstream.values(Window(low=low, high=high), n)
            complete = values.len() < n
            return cut_points_of(values, low=low, max_rows=max_rows, complete=complete)

    return next_windows(
        last_high=last.window.high if last else None,
        first=last is None,
        start=delta.start,
        high_water_mark=seen.high_water_mark,
        cut_points=cut,
    )


@dataclass(frozen=True)
class Planned:
    """What `plan_next` did: the newest window of the ledger afterwards (None: none yet),
    whether the plan reached the high-water mark (a backlog larger than one plan has not: the
    rest is planned next time) and what was read of the upstream."""

    last: WindowRow | None
    caught_up: bool
    seen: UpstreamRead


def plan_next(spec: DatasetSpec, upstream: WindowUpstream, *, ledger: WindowLog) -> Planned:
    """Read `upstream` and record `spec`'s next windows in `ledger` (none when the upstream has
    not moved past the last window)."""
    seen = upstream.read()
    last = ledger.last(spec.name)
    planned = windows_now(spec, upstream, last=last, seen=seen)
    rows = ledger.plan(spec.name, planned)
    if not rows:
        return Planned(last, True, seen)
    return Planned(rows[-1], planned[-1].high == seen.high_water_mark, seen)


@dataclass(frozen=True)
class PendingWindow:
    """One window still to apply."""

    window: Window
    state: str  # planned | failed | not yet planned
    seq: int | None  # its ledger number (None: not planned yet)
    rows: int | None = None  # upstream rows in it (None: not counted)


@dataclass(frozen=True)
class Pending:
    """A delta dataset's pending windows; `rows`: the upstream rows in all of them."""

    windows: list[PendingWindow]
    rows: int | None

    def describe(self) -> str:
        if not self.windows:
            return "no pending window: nothing to write"
        states: dict[str, int] = {}
        for w in self.windows:
            states[w.state] = states.get(w.state, 0) + 1
        what = ", ".join(f"{n} {state}" for state, n in states.items())
        rows = "" if self.rows is None else f", {self.rows} source row(s)"
        noun = "window" if len(self.windows) == 1 else "windows"
        return f"{len(self.windows)} pending {noun}{rows} ({what})"


def pending_windows(
    spec: DatasetSpec, upstream: WindowUpstream | None, *, ledger: WindowLog, count: int = 200
) -> Pending:
    """`spec`'s windows still to apply: the ledger's planned and failed ones, then those a plan
    would make now from `upstream` (shown, not recorded; None: the ledger's alone), each counted
    in the upstream (up to `count` windows: a longer backlog is listed uncounted)."""
    out = [PendingWindow(w.window, w.state, w.seq) for w in ledger.pending(spec.name)]
    if upstream is None:
        return Pending(out, None)
    new = windows_now(spec, upstream, last=ledger.last(spec.name), seen=upstream.read())
    out += [PendingWindow(w, NOT_PLANNED, None) for w in new]
    if len(out) > count:
        return Pending(out, None)
    counted = [replace(p, rows=upstream.count(p.window)) for p in out]
    if any(p.rows is None for p in counted):
        return Pending(counted, None)
    return Pending(counted, sum(p.rows or 0 for p in counted))
