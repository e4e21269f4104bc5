"""Window planning as pure functions (no database): the per-plan cap never stretches a window past
`max_rows`, a bounded cut read plans only what it read, and pending windows become runs of
consecutive windows."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from pipeline_output import Window
from pipeline_output.contract.windows import WindowRow
from pipeline_output.services.window_planning import (
    MAX_WINDOWS_PER_PLAN,
    CutPoints,
    cut_points_of,
    next_windows,
    run_groups,
    values_to_read,
)


def _cuts_every(max_rows: int):  # type: ignore[no-untyped-def]
    """A cut function over the source `seq = 1..n` (one row per value), as the sensor builds it."""

    def cut(low: int | None, high: int) -> CutPoints:
        values = pl.Series("seq", range((low or 0) + 1, high + 1))
        return cut_points_of(values, low=low, max_rows=max_rows)

    return cut


def _rows_in(window: Window) -> int:
    return int(window.high) - int(window.low or 0)  # seq = 1..n, one row per value


def test_a_backlog_over_the_per_plan_cap_plans_windows_within_max_rows_and_continues_later():
    """1,500 windows' worth of rows under max_rows=2: the first plan stops at 1,000 windows (the
    last one ends at a cut, not at the high-water mark: the old defect made it 1,000 rows); the
    next plan continues from there and reaches the high-water mark."""
    max_rows, hwm = 2, 3000
    first = next_windows(
        last_high=None, first=True, start=None, high_water_mark=hwm, cut_points=_cuts_every(2)
    )
    assert len(first) == MAX_WINDOWS_PER_PLAN
    assert all(_rows_in(w) <= max_rows for w in first)
    assert first[-1].high == 2000
    rest = next_windows(
        last_high=first[-1].high,
        first=False,
        start=None,
        high_water_mark=hwm,
        cut_points=_cuts_every(2),
    )
    assert len(rest) == 500 and rest[0].low == 2000 and rest[-1].high == hwm
    assert all(_rows_in(w) <= max_rows for w in rest)


def test_an_incomplete_cut_read_plans_only_the_windows_it_read():
    # the read stopped after 7 values (a bounded read): the rows past the last cut are unknown
    values = pl.Series("seq", [1, 2, 3, 4, 5, 6, 7])
    cuts = cut_points_of(values, low=None, max_rows=3, complete=False)
    assert cuts == CutPoints((3, 6), complete=False)
    windows = next_windows(
        last_high=None, first=True, start=None, high_water_mark=100, cut_points=lambda lo, hi: cuts
    )
    assert windows == [Window(None, 3), Window(3, 6)]


def test_an_incomplete_read_of_one_shared_value_still_plans_that_value():
    values = pl.Series("seq", [5, 5, 5, 5])
    cuts = cut_points_of(values, low=None, max_rows=2, complete=False)
    windows = next_windows(
        last_high=None, first=True, start=None, high_water_mark=5, cut_points=lambda lo, hi: cuts
    )
    assert windows == [Window(None, 5)], "rows sharing one watermark value stay in one window"


def test_the_cut_read_is_bounded():
    assert values_to_read(2) == 2 * MAX_WINDOWS_PER_PLAN + 1
    assert values_to_read(10**9) <= 2_000_001


def _row(seq: int, state: str = "planned") -> WindowRow:
    window = Window(None if seq == 1 else seq - 1, seq)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return WindowRow(
        id=seq,
        dataset="d",
        seq=seq,
        window=window,
        partition_key=window.to_key(),
        state=state,  # type: ignore[arg-type]
        attempts=0,
        run_id=None,
        iceberg_snapshot_id=None,
        pg_deploy_id=None,
        rows_read=None,
        rows_written=None,
        error=None,
        started_at=at,
        applied_at=None,
    )


def test_run_groups_join_consecutive_windows_up_to_the_limit():
    rows = [_row(s) for s in range(1, 251)]
    groups = run_groups(rows, max_per_run=100)
    assert [len(g) for g in groups] == [100, 100, 50]
    assert [r.seq for g in groups for r in g] == list(range(1, 251))


def test_run_groups_split_at_a_window_that_needs_no_run():
    # windows 1-3 and 5-6 pending, 4 applied (not passed): two runs, in window order
    groups = run_groups([_row(6), _row(1), _row(2), _row(3), _row(5)], max_per_run=100)
    assert [[r.seq for r in g] for g in groups] == [[1, 2, 3], [5, 6]]
    assert run_groups([_row(9)], max_per_run=100) == [[_row(9)]], "a lone window is its own run"
