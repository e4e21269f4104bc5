"""DAGSTER_HOME for the project: the packaged instance files and the environment Dagster needs.

`pipeline-output dev|materialize|env` all go through `activate()`, so the UI, headless runs and
a `dagster` command run by hand after `eval "$(pipeline-output env)"` share one instance: run
storage in the control-plane Postgres, DAGSTER_HOME at `$PIPELINE_OUTPUT_HOME/dagster`.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from pipeline_output.infra.settings import (
    CATALOG,
    DAGSTER_PG_URL,
    HOME,
    NAMESPACE,
    PG_URL,
    Settings,
    to_sqlalchemy_url,
)

INSTANCE_FILES = ("dagster.yaml", "workspace.yaml")


def prepare(settings: Settings) -> Path:
    """Create DAGSTER_HOME and (re)write the packaged dagster.yaml and workspace.yaml into it."""
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    package = resources.files("pipeline_output.infra.instance")
    for name in INSTANCE_FILES:
        text = package.joinpath(name).read_text(encoding="utf-8")
        target = home / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    return home


def environment(settings: Settings, *, control_plane_url: str) -> dict[str, str]:
    """The variables a Dagster process needs to open this project's instance."""
    return {
        HOME: str(settings.home),
        PG_URL: control_plane_url,
        DAGSTER_PG_URL: to_sqlalchemy_url(control_plane_url, driver="psycopg2"),
        "DAGSTER_HOME": str(settings.dagster_home),
        CATALOG: settings.catalog_name,
        NAMESPACE: settings.namespace,
    }


def activate(settings: Settings) -> dict[str, str]:
    """Start/check the control plane, prepare DAGSTER_HOME and export the environment here.

    Returns the exported variables (for child processes and `pipeline-output env`).
    """
    url = settings.control_plane_url()
    prepare(settings)
    env = environment(settings, control_plane_url=url)
    os.environ.update(env)
    return env
