"""`pipeline-output plan [DATASET...]`: the dry run — what a materialisation would write, per arm.

For each dataset: per arm it writes, the write mode of the next write and why, its expected
effect and the target's state now (first deploy or re-deploy, its rows). A delta dataset first
lists its pending windows — the ledger's planned and failed ones and those its sensor would plan
now from new source rows (shown, not recorded) — with the source rows each holds; its arms'
lines describe the first of them (and the write mode of the ones after, when it differs). A
Dagster-partitioned dataset is planned as its runs write it: each partition's slice (by its
partition columns), not the whole table. An incremental downstream (a `Changes` input) first
lists the upstream changes its next run would consume (the range and the counts by type, or why
it would be a full refresh).
Nothing is written, nothing is planned in the ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import click

from pipeline_output.commands.loading import (
    code_location_options,
    dataset_specs,
    source_specs,
    spec_named,
)

if TYPE_CHECKING:
    from pipeline_output.contract.spec import Arm

SHOW_WINDOWS = 10


@click.command()
@code_location_options
@click.argument("datasets", nargs=-1)
@click.option("--mode", default=None, help="Plan as if run with this mode (pg, iceberg, dual).")
def plan(datasets: tuple[str, ...], mode: str | None) -> None:
    """Show pending windows, the write mode, why, the target state and the expected effect per
    arm; writes nothing."""
    import dagster as dg

    from pipeline_output.commands.loading import load_definitions, location_runtime
    from pipeline_output.contract.plan import TargetState, plan_write
    from pipeline_output.dagster_layer.changes_assets import CHANGES_OF_KEY
    from pipeline_output.dagster_layer.dataset import spec_of
    from pipeline_output.dagster_layer.partitioned import partition_columns_of_asset
    from pipeline_output.dagster_layer.window_upstreams import source_upstream
    from pipeline_output.services.window_planning import pending_windows

    specs = dataset_specs()
    partitioned = {}  # dataset -> its partition columns (Dagster-partitioned datasets only)
    changes_of = {}  # incremental downstream -> the upstream whose changes it consumes
    for asset in load_definitions().assets or []:
        found, columns = spec_of(asset), partition_columns_of_asset(asset)
        if found is not None and columns:
            partitioned[found.name] = columns
        if found is not None and isinstance(asset, dg.AssetsDefinition):
            raw = asset.metadata_by_key.get(asset.key, {}).get(CHANGES_OF_KEY)
            if raw is not None:
                changes_of[found.name] = str(getattr(raw, "value", raw))
    for name in datasets:
        spec_named(name)  # an unknown one fails naming the code location and the known ones
    sources = source_specs()
    runtime = location_runtime()
    for name in datasets or sorted(specs):
        spec = specs[name]
        resolved = runtime.publisher.resolve(spec, override=mode)
        window = None
        later = 0
        upstream_name = changes_of.get(name)
        incremental: str | None = None  # an incremental downstream: what its next run writes
        if upstream_name is not None and upstream_name in specs:
            line, incremental = _pending_changes(runtime, spec, specs[upstream_name])
            click.echo(line)
        if spec.delta is not None:
            # the windows a sensor tick would plan now from the source (a delta over another
            # dataset: the ledger's alone), counted in it
            source = sources.get(spec.delta.source)
            upstream = None
            if source is not None:
                upstream = source_upstream(spec, source, runtime=lambda: runtime)
            pending = pending_windows(spec, upstream, ledger=runtime.windows)
            click.echo(f"{name}: {pending.describe()}")
            for w in pending.windows[:SHOW_WINDOWS]:
                seq = f"window {w.seq}" if w.seq is not None else "new window"
                rows = "" if w.rows is None else f": {w.rows} source row(s)"
                click.echo(f"  {seq} {w.window}{rows} ({w.state})")
            if len(pending.windows) > SHOW_WINDOWS:
                click.echo(f"  ... and {len(pending.windows) - SHOW_WINDOWS} more")
            if not pending.windows:
                continue
            window, later = pending.windows[0].window, len(pending.windows) - 1
        columns = partitioned.get(name, ())
        for arm, p in runtime.publisher.plan(spec, mode=resolved, window=window).items():
            state = runtime.publisher.store(cast("Arm", arm)).target_state(spec)
            if columns:  # a run writes its partitions' slices, whichever partitions they are
                p = plan_write(spec, state, partitioned_by=columns)
            target = "first deploy" if p.first_deploy else "re-deploy"
            if state.total_rows is not None and state.exists:
                target += f", {state.total_rows} row(s) now"
            effect = incremental if incremental is not None else p.describe()
            text = (
                f"{name} [{arm}, mode {resolved.mode} from {resolved.source}]: {effect} "
                f"(target: {target})"
            )
            if later and window is not None:
                written = TargetState(exists=True, has_snapshot=True)
                after = plan_write(spec, written, window).write_mode
                text += f"; then {later} more window(s): {after}"
            elif columns and p.first_deploy:
                written = TargetState(exists=True, has_snapshot=True)
                after = plan_write(spec, written, partitioned_by=columns).write_mode
                text += f"; then each partition: {after}"
            click.echo(text)


def _pending_changes(runtime: Any, spec: Any, upstream: Any) -> tuple[str, str]:
    """One line: the upstream changes the incremental downstream's next run would consume; and
    what that run writes (`incremental.planned_effect`)."""
    from pipeline_output.services.incremental import CHANGE_TYPES, pending_changes, planned_effect

    changes = pending_changes(
        spec,
        upstream,
        publisher=runtime.publisher,
        ledger=runtime.ledger,
        upstream_mode=runtime.publisher.resolve(upstream),
    )
    where = f"{spec.name}: changes of {upstream.name}"
    effect = planned_effect(spec, changes)
    if changes is None:
        return f"{where}: none yet (the upstream has no table)", effect
    if changes.from_snapshot == changes.to_snapshot and not changes.full_refresh:
        line = f"{where}: no pending change (consumed up to snapshot {changes.to_snapshot})"
        return line, effect
    counts = ", ".join(f"{kind} {changes.counts.get(kind, 0)}" for kind in CHANGE_TYPES)
    text = f"{where} ({changes.from_snapshot}, {changes.to_snapshot}] pending: {counts}"
    return text + (f"; full refresh: {changes.reason}" if changes.full_refresh else ""), effect
