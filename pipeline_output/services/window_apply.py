"""Applying one delta window exactly once (planning them is `window_planning.py`).

`apply_window(ApplyRequest(...), publisher=..., ledger=...)`: the compute, the input checks and (where the strategy allows) the Iceberg
data files come first; then, under the dataset's apply lock, the ledger decides `apply`, `skip`
(already applied — a retry or re-materialisation is a no-op that says so) or `repair` (a crash after
the write committed but before the ledger update: the attempt marker is found in the Iceberg
snapshot summaries / the legacy arm's deploy records, by equality, and the ledger is completed without a second write).
Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER
from pipeline_output.contract.windows import Window, WindowLog, WindowRow
from pipeline_output.services.publish import Prepared, Publisher, PublishResult, ResolvedMode


@dataclass(frozen=True)
class WindowOutcome:
    """What happened to one window."""

    window: Window
    action: str  # applied | staged (on the run's audit branch) | skipped | repaired
    row: WindowRow
    result: PublishResult | None = None

    @property
    def message(self) -> str:
        if self.action == "skipped":
            where = self.row.iceberg_snapshot_id or self.row.pg_deploy_id
            return (
                f"window {self.window} already applied (snapshot/deploy {where}); nothing written"
            )
        if self.action == "repaired":
            return f"window {self.window}: previous attempt had committed; ledger repaired, nothing written"
        if self.action == "staged":
            return f"window {self.window} staged on the audit branch (applied when published)"
        return f"window {self.window} applied"


def _committed(
    publisher: Publisher, spec: DatasetSpec, mode: ResolvedMode, row: WindowRow
) -> tuple[int | None, int | None] | None:
    """Where a crashed attempt's write landed, per arm (None when it did not commit anywhere):
    each arm's `find_marker` looks for the attempt's exact marker (an Iceberg snapshot summary
    property; the legacy arm's deploy record, written in the transaction of its rows)."""
    found = {arm: publisher.store(arm).find_marker(spec, row.marker) for arm in mode.arms}
    ice, pg = found.get("iceberg"), found.get("pg")
    if ice is None and pg is None:
        return None
    return ice, pg


@dataclass(frozen=True, kw_only=True)
class ApplyRequest:
    """One window to apply (`apply_window`): `spec`'s `window`, its rows from `compute` (a
    zero-argument callable returning a frame), written in `mode` by run `run_id`.

    `restate`: replace exactly the window's rows even when it was applied (`pipeline-output
    windows restate`). `write_window`: the window the write is scoped to when it is wider than
    `window` (a `replace`/`sync` over a lookback, `window_planning.window_scopes`). `audit`: the
    write is staged on the run's audit branch: the window is `staged`, applied when the audit
    publishes."""

    spec: DatasetSpec
    window: Window
    compute: Callable[[], Any]
    mode: ResolvedMode
    run_id: str | None
    restate: bool = False
    write_window: Window | None = None
    audit: bool = False

    @property
    def key(self) -> str:
        """The window's partition key (its ledger row)."""
        return self.window.to_key()

    @property
    def target(self) -> Window:
        """The window the write is scoped to."""
        return self.write_window or self.window

    @property
    def write_spec(self) -> DatasetSpec:
        """The spec the write runs with: a restatement replaces the window's rows."""
        return replace(self.spec, strategy="replace") if self.restate else self.spec

    def computed(self) -> Any:
        """The window's rows (a LazyFrame collected)."""
        frame = self.compute()
        return frame.collect() if isinstance(frame, pl.LazyFrame) else frame


def apply_window(
    request: ApplyRequest,
    *,
    publisher: Publisher,
    ledger: WindowLog,
    on_written: Callable[[], None] | None = None,
) -> WindowOutcome:
    """Apply one window exactly once (see the module docstring); `on_written` (tests' fault
    injection) runs between the commit and the ledger update.

    The compute runs before the apply lock is taken, and so do the input checks and, where the
    strategy writes the frame as it is, the Iceberg data files (`Publisher.prepare`); under the
    lock remain the ledger decision, the probe, key reads and merges, the commit and the ledger
    update. Skipped windows delete their pre-written files. A compute (or input check) that fails
    is recorded as a failed attempt so the sensor re-requests the window.
    """
    spec, key = request.spec, request.key
    peek = ledger.get(spec.name, key)
    frame: Any = None
    prepared: Prepared | None = None
    if peek is None or peek.state != "applied" or request.restate:
        try:
            frame = request.computed()
            prepared = publisher.prepare(
                request.write_spec, frame, mode=request.mode, window=request.target
            )
        except BaseException as exc:
            with ledger.apply_lock(spec.name):
                ticket = ledger.begin(
                    spec.name, key, run_id=request.run_id, restate=request.restate
                )
                if ticket.action == "apply":
                    ledger.mark_failed(ticket.row, error=f"{type(exc).__name__}: {exc}")
            raise
    try:
        return _apply_locked(request, publisher, ledger, frame, prepared, on_written)
    finally:
        if prepared is not None:
            prepared.discard()  # no-op when its files went into a commit


def _apply_locked(
    request: ApplyRequest,
    publisher: Publisher,
    ledger: WindowLog,
    frame: Any,
    prepared: Prepared | None,
    on_written: Callable[[], None] | None,
) -> WindowOutcome:
    spec, window, mode, run_id = request.spec, request.window, request.mode, request.run_id
    with ledger.apply_lock(spec.name):
        ticket = ledger.begin(spec.name, request.key, run_id=run_id, restate=request.restate)
        row = ticket.row
        if ticket.action == "skip":
            return WindowOutcome(window, "skipped", row)
        if ticket.action == "repair":
            committed = _committed(publisher, spec, mode, row)
            if committed is not None:
                ledger.mark_applied(
                    row, iceberg_snapshot_id=committed[0], pg_deploy_id=committed[1]
                )
                return WindowOutcome(window, "repaired", row)
            row = ledger.retry_after_lost_attempt(row, run_id=run_id)
        try:
            if frame is None:  # the ledger changed under us (e.g. a restatement elsewhere)
                frame = request.computed()
            result = publisher.publish(
                request.write_spec,
                frame,
                mode=mode,
                window=request.target,
                run_id=run_id,
                summary={ATTEMPT_MARKER: row.marker},
                prepared=prepared,
                audit=request.audit,
            )
        except BaseException as exc:
            committed = _committed(publisher, spec, mode, row)
            if committed is not None:
                ledger.mark_applied(
                    row, iceberg_snapshot_id=committed[0], pg_deploy_id=committed[1]
                )
            else:
                ledger.mark_failed(row, error=f"{type(exc).__name__}: {exc}")
            raise
        if on_written is not None:
            on_written()  # fault-injection hook (tests): between the commit and the ledger update
        ice = result.results.get("iceberg")
        if result.staged:
            ledger.mark_staged(row, iceberg_snapshot_id=ice.snapshot_id if ice else None)
            return WindowOutcome(window, "staged", row, result)
        pg = result.results.get("pg")
        primary = result.primary
        ledger.mark_applied(
            row,
            iceberg_snapshot_id=ice.snapshot_id if ice else None,
            pg_deploy_id=pg.snapshot_id if pg else None,
            rows_read=primary.rows_in,
            rows_written=primary.rows_inserted + primary.rows_updated,
        )
        return WindowOutcome(window, "applied", row, result)
