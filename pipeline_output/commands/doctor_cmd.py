"""`pipeline-output doctor [--fix] [--grace SECONDS]`: orphan data files left by failed writes,
and a warning per table no dataset of the code location owns (`tables drop` drops one; `--fix`
never does)."""

from __future__ import annotations

import click

from pipeline_output.commands.loading import code_location_options
from pipeline_output.services.doctor import DEFAULT_GRACE_S, find_orphans, remove_orphans


@click.command()
@code_location_options
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
    """List data files no snapshot references (and remove them with --fix); warn about tables no
    dataset of the code location owns."""
    from pipeline_output.commands.loading import location_runtime
    from pipeline_output.commands.tables_cmd import orphan_lines

    runtime = location_runtime()
    for line in orphan_lines(runtime, prefix="warning: "):
        click.echo(line)
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
