"""Write-audit-publish: an audited run's native writes are staged on the Iceberg branch
`audit-<run id>`, checked there, and only then published — `main` fast-forwarded to the audited
snapshot in one catalog commit. Pure core: no Dagster (the Dagster layer decides *when*: after
the run's blocking checks on the dataset passed, `dagster_layer/audit_hooks.py`).

- `stage_write` (called by `Publisher.publish(audit=True)`): the write commits to the branch
  (planned against the branch head: a run's second window sees its first); the audit ledger
  records it, with the checked frame when the run is `dual` — the legacy arm is written at the
  publish, never before. Main, every reader of it and the legacy arm are unchanged.
- `publish_audit`: under the dataset's window-apply lock (delta datasets) and its table lock,
  `main` moves from the snapshot the branch started from to the branch head, dropping the branch
  in the same commit — only if main still points there (another writer published first: the
  audit fails with `AuditConflict`, nothing is published over it). In `dual` the staged writes are
  first replayed on the legacy arm in one open transaction and compared with the audited
  snapshot (parity); that transaction commits only after main moved. Staged windows become
  applied; the Iceberg deploys are recorded. Publishing twice is a no-op; a publish that crashed
  after moving main is completed by the next one.
- `fail_audit`: main untouched, the branch kept for `pipeline-output audit show`; staged windows
  become failed (re-requested by the sensor).
- `drop_stale_audit_branches`: maintenance — removes branches of undecided or failed audits
  older than a retention period (and of published ones a crash left behind).

The legacy arm's side of a `dual` write-audit-publish (`audit.py`): the staged writes are
replayed on the legacy arm in one open transaction (`replay_legacy`, chained with
`PostgresStore.begin_write(after=...)`), whose rows are compared with the audited snapshot — by
the run's parity check (then rolled back) and by the publish (then committed, only after main
moved: `commit_legacy`). Replayed writes record a marker, so a publish that crashed after the
legacy commit never replays one twice. Pure core: no Dagster.

Maintenance of write-audit-publish: audit branches do not pile up (`audit.py`).

`drop_stale_audit_branches` runs first in table maintenance (`maintenance.maintain`, the
`table_maintenance` job, `pipeline-output maintain`) and alone as `pipeline-output audit
drop-stale`: it removes the branches of
audits still undecided or failed after a retention period (default 7 days; their staged windows
become failed, so the sensor re-requests them), and the branch a crash left behind after a
publish. Pure core: no Dagster.
"""

from __future__ import annotations

import io
from collections.abc import Collection
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline_output.contract.checked_input import CheckedInput
from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER, WriteOptions
from pipeline_output.contract.windows import Window
from pipeline_output.errors import AuditConflict, AuditFailed, InvalidArgument, WriteConflict
from pipeline_output.ledger.control_plane import AuditRecord, AuditState, AuditWrite, Ledger
from pipeline_output.services.parity import ParityReport, compare
from pipeline_output.stores.iceberg.table.tables import (
    ancestor_ids,
    audit_branch,
    drop_branch,
    head,
    move_main,
)

if TYPE_CHECKING:
    from pipeline_output.contract.windows import WindowLog
    from pipeline_output.services.arms import Arms
    from pipeline_output.stores.postgres.pending import PendingWrite


DEFAULT_RETENTION = timedelta(days=7)

__all__ = [
    "DEFAULT_RETENTION",
    "Published",
    "audit_branch",
    "audit_parity",
    "fail_audit",
    "publish_audit",
    "stage_write",
]


def stage_write(
    publisher: Arms,
    spec: DatasetSpec,
    checked: CheckedInput,
    *,
    mode: str,
    prepared: Any,
    options: WriteOptions,
) -> tuple[WriteResult, AuditRecord]:
    """Write the checked input to the run's audit branch and record it (see the module
    docstring); `prepared` is the Iceberg arm's prepared write of it."""
    run_id = options.get("run_id")
    if not run_id:
        raise InvalidArgument(
            f"dataset {spec.name!r}: an audited write needs a run id (its branch is named for "
            "the run); nothing was written"
        )
    branch = audit_branch(run_id)
    result = publisher.iceberg.write(spec, checked, prepared=prepared, branch=branch, **options)
    base: int | None = None
    if result.snapshot_id is not None:
        table = publisher.iceberg.load(spec)
        snapshot = table.snapshot_by_id(result.snapshot_id) if table is not None else None
        base = snapshot.parent_snapshot_id if snapshot is not None else None
    window = options.get("window")
    staged = AuditWrite(
        seq=0,
        snapshot_id=result.snapshot_id,
        strategy=spec.strategy,
        window_key=window.to_key() if window is not None else None,
        marker=(options.get("summary") or {}).get(ATTEMPT_MARKER),
        result={k: v for k, v in result.as_dict().items() if _json_scalar(v)},
        frame=_ipc(checked.frame) if mode == "dual" else None,
    )
    record = audit_ledger(publisher).audit_log.stage_write(
        spec.name, run_id=run_id, branch=branch, mode=mode, base_snapshot_id=base, write=staged
    )
    return result, record


@dataclass(frozen=True)
class Published:
    """What `publish_audit` did."""

    dataset: str
    run_id: str
    snapshot_id: int | None  # main's snapshot now (None: nothing was staged)
    moved: bool  # False: already published (or nothing to move)
    legacy: list[WriteResult]
    windows: int
    parity: ParityReport | None = None

    @property
    def message(self) -> str:
        if not self.moved:
            return f"{self.dataset}: audit of run {self.run_id} already published (nothing moved)"
        return (
            f"{self.dataset}: audit of run {self.run_id} published — main -> snapshot "
            f"{self.snapshot_id}"
            + (f", {self.windows} window(s) applied" if self.windows else "")
            + (f", legacy arm committed ({len(self.legacy)} write(s))" if self.legacy else "")
        )


def publish_audit(
    publisher: Arms,
    spec: DatasetSpec,
    *,
    run_id: str,
    windows: WindowLog | None = None,
) -> Published | None:
    """Publish `run_id`'s audit of `spec` (None when the run staged nothing for it)."""
    ledger = audit_ledger(publisher)
    audit = ledger.audit_log.audit(spec.name, run_id)
    if audit is None:
        return None
    if audit.state == "published":
        return Published(spec.name, run_id, audit.snapshot_id, False, [], 0)
    if audit.state != "staged":
        raise AuditFailed(
            f"dataset {spec.name!r}: the audit of run {run_id} is {audit.state}"
            f"{': ' + audit.reason if audit.reason else ''}; main was not moved"
        )
    writes = ledger.audit_log.audit_writes(audit.id, frames=audit.mode == "dual")
    staged = [w for w in writes if w.snapshot_id is not None]
    target = staged[-1].snapshot_id if staged else None
    attempts = [(w, attempt_of(w.marker)) for w in writes]
    with ExitStack() as stack:
        if windows is not None and any(a is not None for _, a in attempts):
            stack.enter_context(windows.apply_lock(spec.name))
            for w, attempt in attempts:
                if attempt is not None and not windows.is_staged(*attempt):
                    _refuse(
                        publisher,
                        windows,
                        audit,
                        writes,
                        "a window of this audit was "
                        f"re-attempted by another run ({w.window_key}); nothing was published",
                    )
        pending: PendingWrite | None = None
        legacy: dict[str, WriteResult] = {}
        report: ParityReport | None = None
        if audit.mode == "dual":
            pending, legacy, report = replay_legacy(publisher, spec, audit, writes, target)
            stack.callback(rollback_quietly, pending)
            if not report.passed:
                fail(publisher, windows, audit, writes, f"parity failed: {report.summary()}")
                raise AuditFailed(
                    f"dataset {spec.name!r}: the audit of run {run_id} failed parity — "
                    f"{report.summary()}; main and the legacy arm were not changed, branch "
                    f"{audit.branch} is kept"
                )
        moved = _move(publisher, windows, spec, audit, writes, target)
        if pending is not None:
            legacy = commit_legacy(publisher, spec, audit, pending, legacy, target)
        applied = apply_windows(windows, audit, attempts, legacy)
        for w in staged:
            _record_deploy(publisher, spec, audit, w)
        ledger.audit_log.decide_audit(audit.id, "published")
    return Published(
        spec.name,
        run_id,
        target or audit.base_snapshot_id,
        moved,
        list(legacy.values()),
        applied,
        report,
    )


def fail_audit(
    publisher: Arms,
    dataset: str,
    *,
    run_id: str,
    reason: str,
    windows: WindowLog | None = None,
) -> bool:
    """Decide `run_id`'s staged audit of `dataset` as failed: main untouched, branch kept,
    staged windows failed. False when there is no staged audit to fail."""
    ledger = audit_ledger(publisher)
    audit = ledger.audit_log.audit(dataset, run_id)
    if audit is None or audit.state != "staged":
        return False
    fail(publisher, windows, audit, ledger.audit_log.audit_writes(audit.id), reason)
    return True


def audit_parity(publisher: Arms, spec: DatasetSpec, *, run_id: str) -> ParityReport | None:
    """Dual audits: the staged writes replayed on the legacy arm in a transaction that is rolled
    back, compared with the audited snapshot — what the publish will check again, before it
    commits. None when the run staged no dual audit of `spec`."""
    ledger = audit_ledger(publisher)
    audit = ledger.audit_log.audit(spec.name, run_id)
    if audit is None or audit.mode != "dual":
        return None
    writes = ledger.audit_log.audit_writes(audit.id, frames=True)
    staged = [w.snapshot_id for w in writes if w.snapshot_id is not None]
    pending, _, report = replay_legacy(
        publisher, spec, audit, writes, staged[-1] if staged else None
    )
    rollback_quietly(pending)
    return report


# -- the steps of a publish -------------------------------------------------------------------


def _move(
    publisher: Arms,
    windows: WindowLog | None,
    spec: DatasetSpec,
    audit: AuditRecord,
    writes: list[AuditWrite],
    target: int | None,
) -> bool:
    """Fast-forward main to `target` under the table lock; False when it already was there."""
    with publisher.iceberg.tables.hold(spec) as stats:
        table = publisher.iceberg.load(spec)
        if table is None:
            _refuse(publisher, windows, audit, writes, "the table was dropped")
        assert table is not None
        main = head(table)
        if target is None:
            drop_branch(table, audit.branch)
            return False
        if target in ancestor_ids(table, main):
            drop_branch(table, audit.branch)  # a publish that crashed after moving main
            return False
        if head(table, audit.branch) != target:
            _refuse(
                publisher,
                windows,
                audit,
                writes,
                f"branch {audit.branch} moved off the audited snapshot {target}",
            )
        if main != audit.base_snapshot_id:
            by = _run_of(table, main)
            _refuse(
                publisher,
                windows,
                audit,
                writes,
                f"main moved from snapshot {audit.base_snapshot_id} to {main}"
                f"{f' (run {by})' if by else ''} after the audit branched; the audited snapshot "
                f"{target} was not published over it (branch {audit.branch} kept) — run it again",
            )
        try:
            move_main(table, target, expected=main, drop_branch=audit.branch, fence=stats.verify)
        except WriteConflict as exc:
            _refuse(publisher, windows, audit, writes, str(exc))
    return True


def apply_windows(
    windows: WindowLog | None,
    audit: AuditRecord,
    attempts: list[tuple[AuditWrite, tuple[int, int] | None]],
    legacy: dict[str, WriteResult],
) -> int:
    """Staged windows become applied (with their legacy deploy when one was written now)."""
    if windows is None:
        return 0
    applied = 0
    for w, attempt in attempts:
        if attempt is None:
            continue
        deploy = legacy.get(legacy_marker(audit, w))
        applied += windows.publish_staged(
            *attempt,
            iceberg_snapshot_id=w.snapshot_id,
            pg_deploy_id=deploy.snapshot_id if deploy is not None else None,
            rows_read=w.result.get("rows_in"),
            rows_written=(w.result.get("rows_inserted") or 0) + (w.result.get("rows_updated") or 0),
        )
    return applied


def _record_deploy(publisher: Arms, spec: DatasetSpec, audit: AuditRecord, w: AuditWrite) -> None:
    """The Iceberg deploy record of a published write (a deploy is what readers can see)."""
    result = w.result
    audit_ledger(publisher).deploy_log.record_deploy(
        spec.name,
        "iceberg",
        status="succeeded",
        run_id=audit.run_id,
        strategy=w.strategy,
        write_mode=result.get("write_mode"),
        first_deploy=result.get("first_deploy"),
        window=Window.from_key(w.window_key) if w.window_key else None,
        counters={k: v for k, v in result.items() if k.startswith("rows_") and v is not None},
        snapshot_id=w.snapshot_id,
        attempt_marker=w.marker,
    )


# -- helpers ----------------------------------------------------------------------------------


def _refuse(
    publisher: Arms,
    windows: WindowLog | None,
    audit: AuditRecord,
    writes: list[AuditWrite],
    why: str,
) -> None:
    fail(publisher, windows, audit, writes, why)
    raise AuditConflict(f"dataset {audit.dataset!r}: audit of run {audit.run_id}: {why}")


def fail(
    publisher: Arms,
    windows: WindowLog | None,
    audit: AuditRecord,
    writes: list[AuditWrite],
    reason: str,
    state: AuditState = "failed",
) -> None:
    audit_ledger(publisher).audit_log.decide_audit(
        audit.id,
        state,
        reason=reason,
        from_states=("staged", "failed"),
    )
    if windows is not None:
        for w in writes:
            attempt = attempt_of(w.marker)
            if attempt is not None:
                windows.fail_staged(*attempt, error=f"audit not published: {reason}")


def attempt_of(marker: str | None) -> tuple[int, int] | None:
    """(window id, attempt) of a window attempt marker `<id>:<attempt>`."""
    if not marker:
        return None
    parts = marker.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _run_of(table: Any, snapshot_id: int | None) -> str | None:
    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    summary = snapshot.summary if snapshot is not None else None
    return summary.get("pipeline-output.run-id") if summary is not None else None


def _ipc(frame: pl.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.write_ipc(buffer)
    return buffer.getvalue()


def _json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def replay_legacy(
    publisher: Arms,
    spec: DatasetSpec,
    audit: AuditRecord,
    writes: list[AuditWrite],
    target: int | None,
) -> tuple[PendingWrite | None, dict[str, WriteResult], ParityReport]:
    """Every staged write replayed on the legacy arm, chained in one open transaction (writes an
    earlier publish already committed, found by their marker, are skipped), and the parity of
    what that transaction would make visible with the audited snapshot."""
    postgres = publisher.postgres
    if postgres is None:
        raise AuditFailed(f"dataset {spec.name!r}: a dual audit needs the legacy arm")
    pending: PendingWrite | None = None
    results: dict[str, WriteResult] = {}
    try:
        for w in writes:
            marker = legacy_marker(audit, w)
            if w.frame is None or postgres.find_marker(spec, marker) is not None:
                continue
            pending = postgres.begin_write(
                replace(spec, strategy=w.strategy),
                pl.read_ipc(io.BytesIO(w.frame)),
                after=pending,
                window=Window.from_key(w.window_key) if w.window_key else None,
                run_id=audit.run_id,
                summary={ATTEMPT_MARKER: marker},
            )
            results[marker] = pending.result
        legacy = (
            postgres.read_pending(pending, spec)
            if pending is not None
            else read_or_empty(postgres, spec)
        )
    except BaseException:
        rollback_quietly(pending)
        raise
    native = (
        publisher.iceberg.read(spec, as_of=target)
        if target is not None
        else read_or_empty(publisher.iceberg, spec)
    )
    return pending, results, compare(spec, legacy, native)


def commit_legacy(
    publisher: Arms,
    spec: DatasetSpec,
    audit: AuditRecord,
    pending: PendingWrite,
    results: dict[str, WriteResult],
    target: int | None,
) -> dict[str, WriteResult]:
    """Commit the replayed legacy writes, after main moved (a failure is a recorded
    divergence, as for a plain dual write)."""
    from pipeline_output.errors import PipelineOutputError

    try:
        pending.commit()
    except Exception as exc:
        ledger = audit_ledger(publisher)
        ledger.record_divergence(
            spec.name,
            run_id=audit.run_id,
            error=f"the audit published snapshot {target} but the Postgres commit failed: "
            f"{type(exc).__name__}: {exc}",
            window=None,
            snapshot_id=target,
            strategy=spec.strategy,
        )
        ledger.audit_log.decide_audit(
            audit.id, "published", reason="diverged: legacy commit failed"
        )
        raise PipelineOutputError(
            f"dataset {spec.name!r}: audit published but the legacy commit failed "
            f"({type(exc).__name__}); recorded in the ledger"
        ) from exc
    return results


def legacy_marker(audit: AuditRecord, w: AuditWrite) -> str:
    """The marker a replayed legacy write records: its window attempt's, else the audit item's
    own (so a publish that crashed after the legacy commit never replays it twice)."""
    return w.marker or f"audit:{audit.id}:{w.seq}"


def read_or_empty(store: Any, spec: DatasetSpec) -> pl.DataFrame:
    try:
        frame: pl.DataFrame = store.read(spec)
    except LookupError:
        return pl.DataFrame()
    return frame


def rollback_quietly(pending: PendingWrite | None) -> None:
    if pending is not None and pending.open:
        pending.rollback()


def audit_ledger(publisher: Arms) -> Ledger:
    if publisher.ledger is None:
        raise InvalidArgument("write-audit-publish needs the control-plane ledger")
    return publisher.ledger


def drop_stale_audit_branches(
    publisher: Arms,
    *,
    windows: WindowLog | None = None,
    older_than: timedelta = DEFAULT_RETENTION,
    now: datetime | None = None,
    datasets: Collection[str] | None = None,
    dry_run: bool = False,
) -> list[AuditRecord]:
    """Maintenance: drop the branches of audits still undecided or failed `older_than` after
    they were staged (state `dropped`; their staged windows become failed). An undecided audit
    whose snapshot is already in main's history (a publish that crashed after moving main) is
    completed instead. Returns the audits handled (with `dry_run`: the ones it would handle,
    nothing changed). `datasets`: only audits of these (default: every dataset)."""
    ledger = audit_ledger(publisher)
    cutoff = (now or datetime.now(UTC)) - older_than
    done = []
    for audit in ledger.audit_log.audits(states=("staged", "failed")):
        if audit.staged_at >= cutoff or (datasets is not None and audit.dataset not in datasets):
            continue
        if dry_run:
            done.append(audit)
            continue
        published = False
        if publisher.iceberg.load(audit.dataset) is not None:
            with publisher.iceberg.tables.hold(DatasetSpec(name=audit.dataset, strategy="replace")):
                table = publisher.iceberg.load(audit.dataset)
                if table is not None:
                    published = audit.state == "staged" and (
                        audit.snapshot_id is not None
                        and audit.snapshot_id in ancestor_ids(table, head(table))
                    )
                    drop_branch(table, audit.branch)
        writes = ledger.audit_log.audit_writes(audit.id)
        if published:
            apply_windows(windows, audit, [(w, attempt_of(w.marker)) for w in writes], {})
            ledger.audit_log.decide_audit(audit.id, "published", reason="completed by maintenance")
        else:
            fail(publisher, windows, audit, writes, f"dropped after {older_than}", "dropped")
        done.append(audit)
    return done
