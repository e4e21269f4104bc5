"""The `pipeline-output` console script: the click group and error policy; commands live in
`pipeline_output.commands.*` (one module per command or command group).

Every deliberate error (`PipelineOutputError`), and every dependency error `errors.from_third_party`
maps (pyiceberg commit failures, Postgres connection errors, a REST catalog's refusal or absence),
is printed as one line on stderr — no traceback: `error: <message>` with exit code 2 for a
terminal error (change something first), or `error (retryable): <message>` with exit code 75
(EX_TEMPFAIL) when running again may succeed.
A Postgres that refuses a URL (no such database or role, authentication failed) is terminal, one
that is down retryable (`errors.connection_refused`); neither prints SQLAlchemy's link.
"""

from __future__ import annotations

import warnings
from typing import Any

import click

from pipeline_output.errors import from_third_party

ERROR_EXIT_CODE = 2
RETRYABLE_EXIT_CODE = 75  # sysexits EX_TEMPFAIL: schedulers and shells know it means "try again"


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        # Dagster's beta/preview notices about APIs we use are for us, not for CLI users.
        warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview)")
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            error = from_third_party(exc)
            if error is None:
                raise
            message = " ".join(str(error).split())
            if error.retryable:
                click.echo(f"error (retryable): {message}", err=True)
                ctx.exit(RETRYABLE_EXIT_CODE)
            click.echo(f"error: {message}", err=True)
            ctx.exit(ERROR_EXIT_CODE)


@click.group(cls=_Group)
@click.version_option(package_name="pipeline-output")
def main() -> None:
    """pipeline-output: produced datasets as Dagster assets on Iceberg, with a Postgres control plane."""


def _register() -> None:
    from pipeline_output.commands import (
        audit_cmd,
        canary_cmd,
        demo_cmd,
        dev_cmd,
        doctor_cmd,
        env_cmd,
        maintain_cmd,
        materialize_cmd,
        pg_cmd,
        plan_cmd,
        tables_cmd,
        time_travel_cmd,
        windows_cmd,
    )

    for command in (
        dev_cmd.dev,
        materialize_cmd.materialize,
        env_cmd.env,
        pg_cmd.pg,
        demo_cmd.demo,
        plan_cmd.plan,
        windows_cmd.windows,
        canary_cmd.flip,
        canary_cmd.status,
        canary_cmd.parity,
        canary_cmd.drain,
        doctor_cmd.doctor,
        audit_cmd.audit,
        time_travel_cmd.history,
        time_travel_cmd.rollback,
        maintain_cmd.maintain,
        tables_cmd.tables,
    ):
        main.add_command(command)


_register()
