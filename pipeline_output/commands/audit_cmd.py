"""`pipeline-output audit show DATASET` and `audit drop-stale`: write-audit-publish audits.

`show` lists a dataset's audits, newest first: the run, its state (staged: waiting for its
checks; published; failed: the reason, branch kept for inspection; dropped), the branch and
whether it still exists, the snapshot the branch started from and its head, the blocking checks
that gate the publish. `drop-stale` is the maintenance step (`drop_stale_audit_branches`).
"""

from __future__ import annotations

import click

from pipeline_output.commands.loading import code_location_options, spec_named
from pipeline_output.commands.table_output import echo_table


@click.group()
def audit() -> None:
    """Write-audit-publish: audited runs of a dataset and their branches."""


@audit.command()
@click.argument("dataset")
@code_location_options
def show(dataset: str) -> None:
    """DATASET's audits, newest first (a failed one's branch is kept for inspection)."""
    from pipeline_output.commands.loading import location_runtime

    spec_named(dataset)
    runtime = location_runtime()
    audits = runtime.ledger.audit_log.audits(dataset)
    if not audits:
        click.echo(f"{dataset}: no audited run yet (audit=True on @dataset, or run config audit)")
        return
    table = runtime.iceberg.load(dataset)
    refs = table.metadata.refs if table is not None else {}
    rows = [
        (
            a.run_id,
            a.state,
            a.branch + ("" if a.branch in refs else " (gone)"),
            str(a.base_snapshot_id or "-"),
            str(a.snapshot_id or "-"),
            ", ".join(a.gating_checks) or "-",
            f"{a.staged_at:%Y-%m-%d %H:%M:%S}",
            (a.reason or "")[:100],
        )
        for a in audits
    ]
    header = ("run", "state", "branch", "from", "staged", "checks", "staged at", "reason")
    echo_table(header, rows)


@audit.command("drop-stale")
@click.option(
    "--older-than-hours",
    type=float,
    default=24 * 7,
    show_default=True,
    help="Retention: undecided or failed audits staged longer ago lose their branch.",
)
@code_location_options
def drop_stale(older_than_hours: float) -> None:
    """Drop the branches of audits undecided or failed for longer than the retention."""
    from datetime import timedelta

    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.services.audit import drop_stale_audit_branches

    runtime = location_runtime()
    dropped = drop_stale_audit_branches(
        runtime.publisher, windows=runtime.windows, older_than=timedelta(hours=older_than_hours)
    )
    for a in dropped:
        click.echo(f"{a.dataset}: dropped {a.branch} ({a.state} since {a.staged_at:%Y-%m-%d})")
    click.echo(f"{len(dropped)} audit branch(es) dropped")
