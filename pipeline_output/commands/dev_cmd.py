"""`pipeline-output dev`: the Dagster UI and daemon on the project's code location, fully wired.

The code location is chosen exactly as every other command chooses it (`locations.py`: `-m/-f/-w`
with `-a`, `PIPELINE_OUTPUT_DEFINITIONS`, the nearest `pyproject.toml`, the demo only as the
fallback) and loaded once here first, so a misconfigured location fails now, in one `error:`
line, instead of inside the UI. It is then written as a Dagster workspace file
(`$DAGSTER_HOME/dev_workspace.yaml`) and `dagster dev -w` runs on it: `dagster dev` starts one
long-running gRPC code server per location, and the webserver and the daemon (sensors,
schedules, the run queue) both talk to it — the daemon does not import the code location on
every tick. Arguments this command does not know (`-p 3333`, `-h 0.0.0.0`, ...) are passed on.

The location is named as `dg dev` names it (the workspace entry's `location_name`): a dg project
(`[tool.dg.project]`) is shown under `[tool.dg.project] code_location_name`, else the name of the
directory holding its `pyproject.toml` — the name `load_from_defs_folder` expects, so Dagster does
not warn that the project's name "does not match" the location's. `[tool.dagster]
code_location_name` and a workspace's `location_name` are kept as `dagster dev` keeps them; any
other location keeps Dagster's default name (its module, e.g. `my_project.definitions`, or its
file's name): no better name is known for it (`locations.py` resolves the names).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import click

from pipeline_output.commands.loading import (
    check_environment_catalog,
    code_location_options,
    current_locations,
    load_definitions,
)
from pipeline_output.commands.locations import CodeLocation
from pipeline_output.errors import PipelineOutputError
from pipeline_output.infra import dagster_home
from pipeline_output.infra.settings import get_settings

WORKSPACE_FILE = "dev_workspace.yaml"


def workspace_yaml(locations: Sequence[CodeLocation]) -> str:
    """A Dagster `workspace.yaml` loading `locations` (a module or a Python file each)."""
    import yaml  # type: ignore[import-untyped]  # PyYAML, as dagster reads workspace.yaml

    entries = []
    for location in locations:
        spec: dict[str, str] = {}
        if location.python_file is not None:
            kind = "python_file"
            spec["relative_path"] = str(location.python_file)
        else:
            kind = "python_module"
            spec["module_name"] = str(location.module)
        if location.attribute:
            spec["attribute"] = location.attribute
        if location.working_directory is not None:
            spec["working_directory"] = str(location.working_directory)
        if location.location_name:
            spec["location_name"] = location.location_name
        entries.append({kind: spec})
    return str(yaml.safe_dump({"load_from": entries}, sort_keys=False))


@click.command(context_settings={"ignore_unknown_options": True})
@code_location_options
@click.argument("dagster_args", nargs=-1, type=click.UNPROCESSED)
def dev(dagster_args: tuple[str, ...]) -> None:
    """Start the embedded Postgres if needed and exec `dagster dev` on the project's code
    location (extra args are passed on, e.g. `-p 3001`)."""
    settings = get_settings()
    check_environment_catalog(settings)
    dagster_home.activate(settings)
    executable = shutil.which("dagster")
    if executable is None:
        raise PipelineOutputError("the `dagster` executable is not on PATH (is the venv active?)")
    locations = current_locations()
    load_definitions()  # a broken location fails here, in one line, not in the UI
    workspace = Path(settings.dagster_home) / WORKSPACE_FILE
    workspace.write_text(workspace_yaml(locations), encoding="utf-8")
    where = ", ".join(f"{x.describe()} (from {x.source})" for x in locations)
    click.echo(f"DAGSTER_HOME={settings.dagster_home}", err=True)
    click.echo(f"code location: {where}", err=True)
    os.execv(executable, [executable, "dev", "-w", str(workspace), *dagster_args])
