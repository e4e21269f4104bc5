"""Table maintenance of a code location's datasets: stale audit branches, compaction, snapshot
expiry and orphan removal, one dataset after another, with the table's health measured before and
after.

Owns the order (drop the branches of stale audits first: a staged audit holds compaction off and
pins its snapshots against expiry; then compact, then expire, then remove orphans: compaction's
replaced files become unreferenced once the snapshots before it expire, and what a crash of
either leaves behind is an orphan for the last step) and the per-dataset report the Dagster job and `pipeline-output
maintain` print. Each operation is the Iceberg store's (`IcebergStore.compact`,
`.expire_snapshots`, `.remove_orphans`; `docs/concepts.md`, "Maintenance"). Datasets with no
Iceberg table (the legacy arm has nothing to maintain) are skipped, saying so. A dataset whose
maintenance fails does not stop the others: its error is in its report. Pure core (no Dagster).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import WindowLog
from pipeline_output.errors import PipelineOutputError, from_third_party
from pipeline_output.ledger.control_plane import AuditRecord
from pipeline_output.services.audit import DEFAULT_RETENTION, drop_stale_audit_branches
from pipeline_output.stores.iceberg import IcebergStore
from pipeline_output.stores.iceberg.maintenance.compaction import CompactionResult
from pipeline_output.stores.iceberg.maintenance.compaction_plan import DEFAULT_MIN_INPUT_FILES
from pipeline_output.stores.iceberg.maintenance.expiry import (
    DEFAULT_OLDER_THAN,
    DEFAULT_RETAIN_LAST,
    ExpiryResult,
)
from pipeline_output.stores.iceberg.maintenance.health import TableHealth, table_health
from pipeline_output.stores.iceberg.maintenance.orphans import DEFAULT_GRACE_S, OrphanResult
from pipeline_output.stores.iceberg.table.tables import DEFAULT_LOCK

if TYPE_CHECKING:
    from pipeline_output.services.publish import Publisher

Step = Callable[[str, str], None]  # (dataset, what is starting): progress reporting
BinProgress = Callable[[int, int], None]  # (compaction bins done, planned)


@dataclass(frozen=True)
class MaintenanceOptions:
    """Which operations run and their settings (the defaults are the documented ones)."""

    audits: bool = True  # drop the branches of audits undecided or failed past audit_retention
    compact: bool = True
    expire: bool = True
    orphans: bool = True
    target_file_size: int | None = None  # None: the table's write.target-file-size-bytes
    min_input_files: int = DEFAULT_MIN_INPUT_FILES
    older_than: timedelta = DEFAULT_OLDER_THAN
    retain_last: int = DEFAULT_RETAIN_LAST
    grace_s: float = DEFAULT_GRACE_S
    audit_retention: timedelta = DEFAULT_RETENTION
    dry_run: bool = False
    # expire even the snapshots an incremental downstream has not consumed past (its next run
    # is then a full refresh that says why)
    force: bool = False


@dataclass
class TableMaintenance:
    """What maintenance did to one dataset's table."""

    dataset: str
    table: str
    before: TableHealth | None = None
    after: TableHealth | None = None
    compaction: CompactionResult | None = None
    expiry: ExpiryResult | None = None
    orphans: OrphanResult | None = None
    stale_audits: list[AuditRecord] | None = None  # handled by the audits step (None: not run)
    dry_run: bool = False
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per operation (and per error)."""
        if self.skipped:
            return [f"{self.dataset}: skipped ({self.skipped})"]
        out = []
        if self.stale_audits is not None:
            verb = "would drop" if self.dry_run else "dropped"
            branches = ", ".join(a.branch for a in self.stale_audits)
            out.append(
                f"{self.dataset}: audits: {verb} {len(self.stale_audits)} stale audit "
                f"branch(es){': ' + branches if branches else ''}"
            )
        out += [
            f"{self.dataset}: {op.describe()}"
            for op in (self.compaction, self.expiry, self.orphans)
            if op is not None
        ]
        return out + [f"{self.dataset}: error: {e}" for e in self.errors]


def maintain(
    store: IcebergStore,
    specs: Iterable[DatasetSpec],
    *,
    options: MaintenanceOptions = MaintenanceOptions(),  # frozen: safe as a default
    ledger: WindowLog | None = DEFAULT_LOCK,
    run_id: str | None = None,
    on_step: Step | None = None,
    on_bins: BinProgress | None = None,
    publisher: Publisher | None = None,
) -> list[TableMaintenance]:
    """Maintain every dataset in `specs` (module docstring); one report per dataset.

    `ledger`: the window ledger expiry asks (default: the one on the store's control plane), and
    the one whose windows a dropped audit had staged become failed in. `publisher`: the audits
    step's ledger (None: the audits step is skipped).
    `on_step(dataset, step)` is called before each operation, `on_bins(done, planned)` as a
    compaction writes its bins (progress bars)."""
    reports = []
    for spec in specs:
        report = TableMaintenance(dataset=spec.name, table=store.table_name(spec))
        reports.append(report)
        table = store.load(spec)
        if table is None or table.current_snapshot() is None:
            report.skipped = "no Iceberg table"
            continue
        report.before = table_health(table)
        report.dry_run = options.dry_run
        steps = [
            name
            for name, wanted in (
                ("audits", options.audits and publisher is not None),
                ("compact", options.compact),
                ("expire", options.expire),
                ("orphans", options.orphans),
            )
            if wanted
        ]
        for name in steps:
            if on_step is not None:
                on_step(spec.name, name)
            try:
                if name == "audits":
                    assert publisher is not None
                    report.stale_audits = drop_stale_audit_branches(
                        publisher,
                        windows=None if ledger is DEFAULT_LOCK else ledger,
                        older_than=options.audit_retention,
                        datasets=[spec.name],
                        dry_run=options.dry_run,
                    )
                else:
                    _run(name, store, spec, report, options, ledger, run_id, on_bins)
            except Exception as exc:
                error = exc if isinstance(exc, PipelineOutputError) else from_third_party(exc)
                if error is None:
                    raise
                report.errors.append(f"{name}: {' '.join(str(error).split())}")
        current = store.load(spec)
        report.after = table_health(current) if current is not None else None
    return reports


def _run(
    step: str,
    store: IcebergStore,
    spec: DatasetSpec,
    report: TableMaintenance,
    options: MaintenanceOptions,
    ledger: WindowLog | None,
    run_id: str | None,
    on_bins: BinProgress | None,
) -> None:
    if step == "compact":
        report.compaction = store.compact(
            spec,
            target_file_size=options.target_file_size,
            min_input_files=options.min_input_files,
            dry_run=options.dry_run,
            run_id=run_id,
            progress=on_bins,
        )
    elif step == "expire":
        report.expiry = store.expire_snapshots(
            spec,
            older_than=options.older_than,
            retain_last=options.retain_last,
            ledger=ledger,
            dry_run=options.dry_run,
            force=options.force,
        )
    else:
        report.orphans = store.remove_orphans(
            spec, grace_s=options.grace_s, dry_run=options.dry_run
        )
