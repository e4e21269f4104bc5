"""Table maintenance and exactly-once windows: snapshot expiry keeps the snapshot a crashed
window's repair looks for (its attempt marker), so the repair still works after an aggressive
expiry; applied windows whose snapshots expired stay applied (a re-run is a no-op); compaction
in between changes no window's rows. Real Postgres (ledger, advisory locks), real SQL catalog.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.dagster_layer.resource import Runtime, get_runtime, reset_runtime
from pipeline_output.services.window_apply import ApplyRequest, apply_window
from pipeline_output_tests.oracle import assert_same_multiset

SPEC = DatasetSpec(
    name="ev_log", strategy="append_always", delta=Delta(source="ev", watermark="seq")
)
WINDOWS = [Window(low=n * 10, high=(n + 1) * 10) for n in range(6)]


class Crash(Exception):
    """The process 'dies' between the window's commit and its ledger update."""


def rows(window: Window) -> pl.DataFrame:
    seqs = list(range(int(window.low or 0) + 1, int(window.high or 0) + 1))
    return pl.DataFrame({"id": seqs, "v": [f"v{s}" for s in seqs], "seq": seqs})


@pytest.fixture
def runtime(settings_env: Any) -> Iterator[Runtime]:
    reset_runtime()
    yield get_runtime()
    reset_runtime()


def apply(runtime: Runtime, window: Window, *, crash: bool = False) -> str:
    def die() -> None:
        raise Crash

    outcome = apply_window(
        ApplyRequest(
            spec=SPEC,
            window=window,
            compute=lambda: rows(window),
            mode=runtime.publisher.resolve(SPEC, override="iceberg"),
            run_id=f"run-{window.to_key()}",
        ),
        publisher=runtime.publisher,
        ledger=runtime.windows,
        on_written=die if crash else None,
    )
    return outcome.action


def test_expiry_keeps_what_window_repair_needs_and_repair_still_works(runtime: Runtime):
    store, ledger = runtime.iceberg, runtime.windows
    ledger.plan(SPEC.name, WINDOWS)
    for window in WINDOWS[:3]:
        assert apply(runtime, window) == "applied"
    with pytest.raises(Crash):  # committed, but the ledger still says "applying"
        apply(runtime, WINDOWS[3], crash=True)
    assert apply(runtime, WINDOWS[4]) == "applied"
    assert store.compact(SPEC, min_input_files=2).files_rewritten == 5
    crashed = ledger.get(SPEC.name, WINDOWS[3].to_key())
    assert crashed is not None and crashed.state == "applying"
    marked = store.find_marker(SPEC, crashed.marker)
    assert marked is not None

    # expire everything that is not current: the crashed window's snapshot must stay
    result = store.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)

    # kept: the marked snapshot and main's history from the head down to it (repair walks it)
    assert result.kept_for_repair == 2 and result.snapshots_expired == 3
    left = {s.snapshot_id for s in store.load(SPEC).snapshots()}
    assert marked in left and len(left) == 3  # compaction (current), window 4, window 3
    assert apply(runtime, WINDOWS[3]) == "repaired"  # found by its marker: not written twice
    assert apply(runtime, WINDOWS[1]) == "skipped"  # its snapshot expired; still applied once
    assert apply(runtime, WINDOWS[5]) == "applied"
    expected = pl.concat([rows(w) for w in WINDOWS])
    assert_same_multiset(store.read(SPEC), expected, check_dtypes=False)

    # repaired: nothing needs that snapshot any more
    again = store.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    assert again.kept_for_repair == 0 and len(store.load(SPEC).snapshots()) == 1
    assert_same_multiset(store.read(SPEC), expected, check_dtypes=False)


def test_without_a_ledger_every_snapshot_carrying_a_window_marker_is_kept(runtime: Runtime):
    runtime.windows.plan(SPEC.name, WINDOWS[:3])
    for window in WINDOWS[:3]:
        apply(runtime, window)
    result = runtime.iceberg.expire_snapshots(
        SPEC, older_than=timedelta(0), retain_last=1, ledger=None
    )
    assert (result.snapshots_expired, result.kept_for_repair) == (0, 2)
    with_ledger = runtime.iceberg.expire_snapshots(SPEC, older_than=timedelta(0))
    assert (with_ledger.snapshots_expired, with_ledger.kept_for_repair) == (2, 0)
