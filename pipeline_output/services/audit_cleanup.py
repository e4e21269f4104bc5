"""Maintenance of write-audit-publish: audit branches do not pile up (`audit.py`).

`drop_stale_audit_branches` runs first in table maintenance (`maintenance.maintain`, the
`table_maintenance` job, `pipeline-output maintain`) and alone as `pipeline-output audit
drop-stale`: it removes the branches of
audits still undecided or failed after a retention period (default 7 days; their staged windows
become failed, so the sensor re-requests them), and the branch a crash left behind after a
publish. Pure core: no Dagster.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.ledger.audits import AuditRecord
from pipeline_output.services.audit import DEFAULT_RETENTION, apply_windows, attempt_of, fail
from pipeline_output.services.audit_legacy import audit_ledger
from pipeline_output.stores.iceberg.table.tables import ancestor_ids, drop_branch, head

if TYPE_CHECKING:
    from pipeline_output.ledger.window_ledger import WindowLedger
    from pipeline_output.services.arms import Arms


def drop_stale_audit_branches(
    publisher: Arms,
    *,
    windows: WindowLedger | None = None,
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
