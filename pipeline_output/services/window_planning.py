"""Planning delta windows: which windows come next, and which rows each one reads and writes.

The next window starts where the ledger's last one ends (or open at the bottom / at `Delta.start`
for the first) and ends at the source's high-water mark; with `max_rows` the range is cut at
watermark values so that no window holds more than `max_rows` source rows (a single watermark value
shared by more rows stays whole). A window reads `(low, high]` of its source, widened back by
`Delta.lookback` earlier windows of the ledger (late rows); strategies whose write is scoped to
the window (`replace`, `sync`) write the window they read (`window_scopes`).
Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import polars as pl

from pipeline_output.contract.spec import DatasetSpec, WatermarkValue
from pipeline_output.contract.windows import Window
from pipeline_output.ledger.window_ledger import WindowRow

MAX_WINDOWS_PER_PLAN = 1000


def next_windows(
    *,
    last_high: WatermarkValue | None,
    first: bool,
    start: WatermarkValue | None,
    high_water_mark: WatermarkValue | None,
    cut_points: Callable[[WatermarkValue | None, WatermarkValue], list[WatermarkValue]]
    | None = None,
) -> list[Window]:
    """The windows to plan now (empty when the source has not moved past the last window)."""
    if high_water_mark is None:
        return []
    low = start if first else last_high
    if isinstance(high_water_mark, datetime) and isinstance(low, datetime):
        # A `timestamptz` source reports an aware high-water mark; a ledger key written before
        # keys carried their zone (or a naive `Delta.start`) is naive: both are UTC.
        low = Window(low=None, high=low).aligned(aware=high_water_mark.tzinfo is not None).high
    if low is not None and not high_water_mark > low:  # type: ignore[operator]
        return []
    cuts = cut_points(low, high_water_mark) if cut_points is not None else []
    bounds = [c for c in cuts if (low is None or c > low) and c < high_water_mark]  # type: ignore[operator]
    bounds = [*sorted(set(bounds))[: MAX_WINDOWS_PER_PLAN - 1], high_water_mark]
    out = []
    for high in bounds:
        out.append(Window(low=low, high=high))
        low = high
    return out


def cut_points_of(values: pl.Series, *, low: WatermarkValue | None, max_rows: int) -> list[Any]:
    """Cut points for `values` (the source watermark column within the range) every `max_rows`."""
    ordered = values.drop_nulls().sort()
    cuts = []
    i = max_rows - 1
    while i < ordered.len() - 1:
        cut = ordered[i]
        cuts.append(cut)
        # skip past every row with this same watermark value
        i = int(ordered.search_sorted(cut, side="right")) - 1 + max_rows
    return cuts


def window_scopes(
    spec: DatasetSpec, windows: Sequence[Window], ledger_rows: Sequence[WindowRow]
) -> list[tuple[Window, Window, Window]]:
    """(window, the window its source read covers, the window its write is scoped to) for each of
    `windows`: the read reaches back `Delta.lookback` earlier windows of `ledger_rows` (the
    dataset's ledger, oldest first); `replace` and `sync` write what they read, the others only
    their own window's rows."""
    lookback = spec.delta.lookback if spec.delta is not None else 0
    keys = [row.partition_key for row in ledger_rows]
    scoped = spec.strategy in ("replace", "sync")
    out = []
    for window in windows:
        read = window
        if lookback and window.to_key() in keys:
            i = keys.index(window.to_key())
            read = Window(low=ledger_rows[max(0, i - lookback)].window.low, high=window.high)
        out.append((window, read, read if scoped else window))
    return out
