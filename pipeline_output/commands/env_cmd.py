"""`pipeline-output env`: the resolved settings as shell comments plus `export` lines.

`eval "$(pipeline-output env)"` makes psql, pyiceberg and `dagster` run by hand use the same
Postgres, catalog and Dagster instance. Passwords are never printed: a URL that carries one is
exported by reference to the variable it came from, so eval it in the shell that has it set.
"""

from __future__ import annotations

import shlex

import click

from pipeline_output.infra import dagster_home
from pipeline_output.infra.settings import (
    DAGSTER_PG_URL,
    PG_URL,
    catalog_env_prefix,
    get_settings,
    has_password,
    mask_url,
    to_sqlalchemy_url,
)

_SECRET_WORDS = ("secret", "password", "token", "credential", "session")


@click.command()
def env() -> None:
    """Print the resolved settings (passwords masked) and `export` lines for other tools."""
    settings = get_settings()
    settings.check_catalog()  # the catalog printed below is the environment's
    exported = dagster_home.activate(settings)
    url = exported[PG_URL]
    source = "embedded server" if settings.pg_url is None else PG_URL
    lines = [
        "# pipeline-output settings",
        f"# home:          {settings.home}",
        f"# control plane: {mask_url(url)} ({source})",
        f"# catalog:       {settings.catalog_name}"
        + (
            " (pyiceberg config)"
            if settings.catalog_config
            else f" (SQL catalog, {settings.warehouse})"
        ),
        f"# namespace:     {settings.namespace}",
    ]
    if settings.catalog_config:
        for key, value in sorted(settings.catalog_config.items()):
            shown = "***" if any(word in key for word in _SECRET_WORDS) else mask_url(value)
            lines.append(f"#   {key} = {shown}")
    secret = has_password(url)
    for name, value in exported.items():
        if secret and name == PG_URL:
            lines.append(f"export {PG_URL}")  # keeps the value the shell already has
        elif secret and name == DAGSTER_PG_URL:
            lines.append(f'export {DAGSTER_PG_URL}="postgresql+psycopg2://${{{PG_URL}#*://}}"')
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    if settings.catalog_config is None:
        prefix = catalog_env_prefix(settings.catalog_name)
        if secret:
            lines.append(f'export {prefix}URI="postgresql+psycopg://${{{PG_URL}#*://}}"')
        else:
            lines.append(
                f"export {prefix}URI={shlex.quote(to_sqlalchemy_url(url, driver='psycopg'))}"
            )
        lines.append(f"export {prefix}TYPE=sql")
        lines.append(f"export {prefix}WAREHOUSE={shlex.quote(settings.warehouse)}")
    click.echo("\n".join(lines))
