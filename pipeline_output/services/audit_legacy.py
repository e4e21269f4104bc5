"""The legacy arm's side of a `dual` write-audit-publish (`audit.py`): the staged writes are
replayed on the legacy arm in one open transaction (`replay_legacy`, chained with
`PostgresStore.begin_write(after=...)`), whose rows are compared with the audited snapshot — by
the run's parity check (then rolled back) and by the publish (then committed, only after main
moved: `commit_legacy`). Replayed writes record a marker, so a publish that crashed after the
legacy commit never replays one twice. Pure core: no Dagster.
"""

from __future__ import annotations

import io
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.store_protocol import ATTEMPT_MARKER
from pipeline_output.contract.windows import Window
from pipeline_output.errors import AuditFailed, InvalidArgument
from pipeline_output.ledger.audits import AuditRecord, AuditWrite
from pipeline_output.services.parity import ParityReport, compare

if TYPE_CHECKING:
    from pipeline_output.services.arms import Arms
    from pipeline_output.stores.postgres.pending import PendingWrite


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
                replace(spec, strategy=w.strategy),  # type: ignore[arg-type]
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


def audit_ledger(publisher: Arms) -> Any:
    if publisher.ledger is None:
        raise InvalidArgument("write-audit-publish needs the control-plane ledger")
    return publisher.ledger
