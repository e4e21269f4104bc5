"""`pipeline-output pg stop|status`: the embedded Postgres server under PIPELINE_OUTPUT_HOME."""

from __future__ import annotations

import click

from pipeline_output.infra import embedded_pg
from pipeline_output.infra.settings import get_settings


@click.group()
def pg() -> None:
    """Manage the embedded Postgres server (unused when PIPELINE_OUTPUT_PG_URL is set)."""


@pg.command()
def stop() -> None:
    """Stop the embedded server; nothing of it keeps running."""
    settings = get_settings()
    stopped = embedded_pg.stop(data_dir=settings.pg_data_dir)
    click.echo(f"{'stopped' if stopped else 'not running'}: {settings.pg_data_dir}")


@pg.command()
def status() -> None:
    """Print whether the embedded server runs and can be reached (exit code 1 if not)."""
    settings = get_settings()
    current = embedded_pg.status(data_dir=settings.pg_data_dir)
    if current.reachable:
        click.echo(f"running: pid {current.pid}, {current.url()}")
    elif current.running:
        click.echo(
            f"unreachable: pid {current.pid} runs without its socket file in {current.socket_dir}"
            " (removed since it started); the next pipeline-output command restarts it"
        )
        raise SystemExit(1)
    else:
        click.echo(f"not running: {settings.pg_data_dir}")
        raise SystemExit(1)
