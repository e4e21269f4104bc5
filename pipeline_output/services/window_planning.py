"""Planning delta windows: which windows come next, and which rows each one reads and writes.

The next window starts where the ledger's last one ends (or open at the bottom / at `Delta.start`
for the first) and ends at the source's high-water mark; with `max_rows` the range is cut at
watermark values so that no window holds more than `max_rows` source rows (a single watermark value
shared by more rows stays whole), at most `MAX_WINDOWS_PER_PLAN` windows per plan (the rest of a
backlog is planned on the next tick); `run_groups` turns the windows that need a run into runs of
consecutive windows (`Delta.max_windows_per_run`). A window reads `(low, high]` of its source,
widened back by `Delta.lookback` earlier windows of the ledger (late rows); strategies whose write
is scoped to the window (`replace`, `sync`) write the window they read (`window_scopes`).
Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from pipeline_output.contract.spec import DatasetSpec, WatermarkValue
from pipeline_output.contract.windows import Window
from pipeline_output.ledger.window_ledger import WindowRow

# One plan (one sensor tick) records at most this many windows; a larger backlog continues on the
# next tick, each window still within `max_rows`.
MAX_WINDOWS_PER_PLAN = 1000
# A plan reads at most this many watermark values to cut windows (bounded memory in the sensor).
MAX_VALUES_PER_PLAN = 2_000_000


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
