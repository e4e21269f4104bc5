"""`pipeline-output dev`: the Dagster UI and daemon on the project's workspace, fully wired."""

from __future__ import annotations

import os
import shutil

import click

from pipeline_output.errors import PipelineOutputError
from pipeline_output.infra import dagster_home
from pipeline_output.infra.settings import get_settings


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("dagster_args", nargs=-1, type=click.UNPROCESSED)
def dev(dagster_args: tuple[str, ...]) -> None:
    """Start the embedded Postgres if needed and exec `dagster dev` (extra args are passed on)."""
    settings = get_settings()
    dagster_home.activate(settings)
    executable = shutil.which("dagster")
    if executable is None:
        raise PipelineOutputError("the `dagster` executable is not on PATH (is the venv active?)")
    workspace = settings.dagster_home / "workspace.yaml"
    click.echo(f"DAGSTER_HOME={settings.dagster_home}", err=True)
    os.execv(executable, [executable, "dev", "-w", str(workspace), *dagster_args])
