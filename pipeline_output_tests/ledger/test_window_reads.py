"""The window ledger's reads on a real Postgres: each returns exactly the rows it names — the last
window, the windows that need a run, the windows planned after one, the newest N, the windows a
lookback reads, the unbroken stretch of applied windows — never the whole history."""

from __future__ import annotations

import psycopg
import pytest

from pipeline_output import Window
from pipeline_output.ledger.migrations import migrate
from pipeline_output.ledger.window_ledger import WindowLedger

DATASET = "ev"


@pytest.fixture
def ledger(pg_db_url: str) -> WindowLedger:
    """Ten windows (-inf, 1], (1, 2], ... (9, 10] of `ev`, planned; one window of another dataset."""
    with psycopg.connect(pg_db_url) as conn:
        migrate(conn)
    windows = WindowLedger(pg_db_url)
    windows.plan(DATASET, [Window(None if i == 0 else i, i + 1) for i in range(10)])
    windows.plan("other", [Window(None, 100)])
    return windows


def set_state(url: str, seqs: list[int], state: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE pipeline_output.windows SET state = %s WHERE dataset = %s AND seq = ANY(%s)",
            (state, DATASET, seqs),
        )


def test_last_is_the_newest_window_of_that_dataset(ledger):
    last = ledger.last(DATASET)
    assert last is not None and last.seq == 10 and last.window == Window(9, 10)
    assert ledger.last("nothing") is None


def test_pending_after_and_recent_read_only_what_they_name(ledger, pg_db_url):
    set_state(pg_db_url, [1, 2, 3, 4, 5, 6, 7], "applied")
    set_state(pg_db_url, [9], "failed")
    assert [w.seq for w in ledger.pending(DATASET)] == [8, 9, 10]
    assert [w.seq for w in ledger.after(DATASET, 8)] == [9, 10]
    assert ledger.after(DATASET, 10) == []
    assert [w.seq for w in ledger.recent(DATASET, limit=3)] == [8, 9, 10]  # newest last
    assert ledger.state_counts(DATASET) == {"applied": 7, "planned": 2, "failed": 1}
    assert [w.seq for w in ledger.applied_windows(DATASET)] == [1, 2, 3, 4, 5, 6, 7]


def test_around_reads_the_lookback_windows_before_a_run(ledger):
    keys = [Window(5, 6).to_key(), Window(6, 7).to_key()]
    assert [w.seq for w in ledger.around(DATASET, keys, before=2)] == [4, 5, 6, 7]
    assert [w.seq for w in ledger.around(DATASET, keys[:1], before=0)] == [6]
    first = [Window(None, 1).to_key()]
    assert [w.seq for w in ledger.around(DATASET, first, before=3)] == [1]


def test_applied_through_is_the_end_of_the_unbroken_applied_stretch(ledger, pg_db_url):
    assert ledger.applied_through(DATASET) == (None, False)  # the first window is not applied
    set_state(pg_db_url, [1, 2, 4], "applied")  # 3 is not: 4 does not count
    assert ledger.applied_through(DATASET) == (Window(1, 2), False)
    set_state(pg_db_url, list(range(1, 11)), "applied")
    assert ledger.applied_through(DATASET) == (Window(9, 10), True)
    assert ledger.applied_through("nothing") == (None, True)
