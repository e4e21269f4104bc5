"""Window planning: the per-plan cap never stretches a window past `max_rows`, a bounded cut read
plans only what it read, and pending windows become runs of consecutive windows (pure functions);
the one planner in services plans from any upstream, with no Dagster, what the CLI's `plan` shows
(a real ledger); the services take the ledger by its contract protocol."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import psycopg
import pytest

import pipeline_output
from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.contract.windows import WindowRow
from pipeline_output.ledger.migrations import migrate
from pipeline_output.ledger.window_ledger import WindowLedger
from pipeline_output.services.window_apply import ApplyRequest
from pipeline_output.services.window_planning import (
    MAX_WINDOWS_PER_PLAN,
    NOT_PLANNED,
    CutPoints,
    UpstreamRead,
    cut_points_of,
    next_windows,
    pending_windows,
    plan_next,
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


@dataclass
class _Rows:
    """An upstream of rows `seq = 1..n` in memory: what a window is cut from, as the planner's
    protocol says (`WindowUpstream`), with no source table and no Dagster."""

    n: int
    name: str = "rows"

    def read(self) -> UpstreamRead:
        return UpstreamRead(self.n or None, rows=self.n)

    def values(self, window: Window, n: int) -> pl.Series:
        low = int(window.low or 0)
        return pl.Series("seq", range(low + 1, int(window.high) + 1)).head(n)

    def count(self, window: Window) -> int | None:
        return int(window.high) - int(window.low or 0)


def test_the_planner_in_services_plans_from_any_upstream_what_plan_shows(pg_db_url):
    """`pending_windows` (the CLI's `plan`) shows, unrecorded and counted, exactly the windows
    `plan_next` (the sensor's tick) then records; a plan past the high-water mark adds none."""
    with psycopg.connect(pg_db_url) as conn:
        migrate(conn)
    ledger = WindowLedger(pg_db_url)
    spec = DatasetSpec(
        name="ev", primary_key=("id",), delta=Delta(source="rows", watermark="seq", max_rows=4)
    )
    upstream = _Rows(10)
    shown = pending_windows(spec, upstream, ledger=ledger)
    assert [(w.window, w.state, w.rows) for w in shown.windows] == [
        (Window(None, 4), NOT_PLANNED, 4),
        (Window(4, 8), NOT_PLANNED, 4),
        (Window(8, 10), NOT_PLANNED, 2),
    ]
    assert shown.rows == 10 and ledger.last("ev") is None, "shown, not recorded"
    planned = plan_next(spec, upstream, ledger=ledger)
    assert planned.caught_up and planned.seen == UpstreamRead(10, rows=10)
    assert [w.window for w in ledger.pending("ev")] == [w.window for w in shown.windows]
    assert planned.last is not None and planned.last.window == Window(8, 10)
    again = plan_next(spec, upstream, ledger=ledger)
    assert again.last == planned.last and len(ledger.pending("ev")) == 3
    upstream.n = 12
    assert [w.state for w in pending_windows(spec, upstream, ledger=ledger).windows] == [
        "planned",
        "planned",
        "planned",
        NOT_PLANNED,
    ]


def test_applying_a_window_takes_one_keyword_only_frozen_request():
    request = ApplyRequest(
        spec=DatasetSpec(
            name="ev", primary_key=("id",), strategy="replace", delta=Delta("rows", "seq")
        ),
        window=Window(1, 2),
        compute=lambda: pl.DataFrame({"id": [2]}),
        mode=None,  # type: ignore[arg-type]
        run_id="r",
        write_window=Window(0, 2),
        restate=True,
    )
    assert (request.key, request.target) == (Window(1, 2).to_key(), Window(0, 2))
    assert request.write_spec.strategy == "replace" and request.computed().height == 1
    with pytest.raises(TypeError):
        ApplyRequest(request.spec, request.window)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        request.run_id = "other"  # type: ignore[misc]


PACKAGE = Path(pipeline_output.__file__).parent


def test_window_planning_lives_in_services_and_the_services_type_the_ledger_by_its_protocol():
    """The planner imports no Dagster; the sensor and `plan` call it, no Dagster module plans;
    services and stores type the window ledger by `contract.windows.WindowLog` (only the
    composition root builds the Postgres one), never `Any`."""
    code = "import sys, pipeline_output.services.window_planning; print('dagster' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert imported.stdout.strip() == "False", imported.stderr
    for name in ("window_sensor.py", "window_upstreams.py"):
        text = (PACKAGE / "dagster_layer" / name).read_text()
        assert "def windows_now" not in text and "next_windows(" not in text, name
    assert "plan_next(" in (PACKAGE / "dagster_layer" / "window_sensor.py").read_text()
    assert "pending_windows(" in (PACKAGE / "commands" / "plan_cmd.py").read_text()
    loose = re.compile(r"\bledger: (Any|WindowLedger \| Any)\b")
    for path in [*(PACKAGE / "services").glob("*.py"), *(PACKAGE / "stores").rglob("*.py")]:
        text = path.read_text()
        assert not loose.search(text), f"{path.name}: a ledger typed Any"
        if path.name not in ("runtime.py", "expiry.py"):  # they build the Postgres one
            assert "pipeline_output.ledger.window_" not in text, path.name
