"""`pipeline-output plan [DATASET...]`: the dry run — what a materialisation would write, per arm."""

from __future__ import annotations

import click

from pipeline_output.commands.loading import code_location_options, dataset_specs, spec_named


@click.command()
@code_location_options
@click.argument("datasets", nargs=-1)
@click.option("--mode", default=None, help="Plan as if run with this mode (pg, iceberg, dual).")
def plan(datasets: tuple[str, ...], mode: str | None) -> None:
    """Show the write mode, why, the target state and the expected effect; writes nothing."""
    from pipeline_output.commands.loading import location_runtime

    specs = dataset_specs()
    for name in datasets:
        spec_named(name)  # an unknown one fails naming the code location and the known ones
    runtime = location_runtime()
    for name in datasets or sorted(specs):
        spec = specs[name]
        resolved = runtime.publisher.resolve(spec, override=mode)
        window = None
        if spec.delta is not None:
            pending = runtime.windows.pending(spec.name)
            window = pending[0].window if pending else None
        for arm, p in runtime.publisher.plan(spec, mode=resolved, window=window).items():
            state = "first deploy" if p.first_deploy else "re-deploy"
            click.echo(
                f"{name} [{arm}, mode {resolved.mode} from {resolved.source}]: {p.describe()} "
                f"(target: {state})"
            )
