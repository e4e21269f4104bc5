"""`pipeline-output doctor [--fix] [--grace SECONDS]`: orphan data files left by failed writes."""

from __future__ import annotations

import click

from pipeline_output.services.doctor import DEFAULT_GRACE_S, find_orphans, remove_orphans


@click.command()
@click.option("--fix", is_flag=True, help="Delete the orphan files found.")
@click.option(
    "--grace",
    "grace_s",
    type=float,
    default=DEFAULT_GRACE_S,
    show_default=True,
    help="Only files older than this many seconds (a write in progress is never touched, "
    "whatever the grace).",
)
def doctor(fix: bool, grace_s: float) -> None:
    """List data files no snapshot references (and remove them with --fix)."""
    from pipeline_output.commands.loading import location_runtime

    runtime = location_runtime()
    orphans = find_orphans(runtime.catalog, runtime.namespace, grace_s=grace_s)
    for orphan in orphans:
        click.echo(
            f"orphan {orphan.table}: {orphan.path} ({orphan.size} bytes, {orphan.age_s:.0f}s old)"
        )
    if not orphans:
        click.echo("no orphan data files")
        return
    if fix:
        removed = remove_orphans(orphans, store=runtime.iceberg)
        click.echo(f"removed {removed} orphan file(s)")
    else:
        click.echo(f"{len(orphans)} orphan file(s); run with --fix to remove them")
