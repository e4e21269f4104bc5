"""`DatasetIOManager`: output context -> (spec, windows, run id, mode) -> publish; inputs from the
authoritative arm (datasets) or the source database (sources), as polars LazyFrames."""

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple, cast

import dagster as dg
import polars as pl

from pipeline_output.contract.checked_input import to_polars
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.audit_hooks import audited_snapshot, gating_checks, step_of
from pipeline_output.dagster_layer.changes_assets import (
    CHANGES_INPUT_KEY,
    COLUMNS_KEY,
    ChangesOutput,
    ChangesSource,
    changes_metadata,
)
from pipeline_output.dagster_layer.checks import PARITY, note_written, parity_skip_note
from pipeline_output.dagster_layer.dataset import spec_in_run
from pipeline_output.dagster_layer.delta_assets import (
    WindowedOutput,
    WindowReader,
    windowed_frame,
)
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.frames_io import as_annotated
from pipeline_output.dagster_layer.keys import (
    AUDIT_OVERRIDE_KEY,
    DELTA_INPUT_KEY,
    MODE_OVERRIDE_KEY,
    SOURCE_METADATA_KEY,
)
from pipeline_output.dagster_layer.metadata import (
    publish_metadata,
    record_window_metadata,
    run_metadata,
    run_table_metadata,
)
from pipeline_output.dagster_layer.partitioned import (
    PartitionedOutput,
    first_computed_while,
    narrowed_to_input_partitions,
    partitioned_output_of,
    write_partitions,
)
from pipeline_output.dagster_layer.resource import PipelineOutputResource, unchanged_copy
from pipeline_output.dagster_layer.windows_context import windows_of
from pipeline_output.errors import UnsupportedWrite
from pipeline_output.services.incremental import ConsumeRequest, consume_changes
from pipeline_output.services.publish import PublishResult, ResolvedMode
from pipeline_output.services.reads import within
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import SourceSpec
from pipeline_output.services.time_travel import parse_as_of
from pipeline_output.services.window_apply import ApplyRequest, apply_window
from pipeline_output.stores.iceberg.write.range_write import LoadedAhead


class _Setup(NamedTuple):
    """What a dataset's write needs before its rows: the runtime, the run's mode, whether it is
    audited, and the table a range run writes against when loaded ahead."""

    runtime: Runtime
    mode: ResolvedMode
    audit: bool
    ahead: LoadedAhead | None


def _meta_value(raw: Any) -> Any:
    return getattr(raw, "value", raw)


def source_from_metadata(raw: Any) -> SourceSpec:
    """Decode a `SourceSpec` from asset metadata."""
    value = _meta_value(raw)
    if isinstance(value, str):
        value = json.loads(value)
    return SourceSpec(**value)


def _fault_hook() -> Any:
    """Test-only fault injection: PIPELINE_OUTPUT_FAULT=after_commit kills the process between the
    write's commit and the ledger update (read through settings, not at import time); with
    `after_commit:pause:<path>` it pauses there (`infra/faults.py`)."""
    from pipeline_output.infra.faults import fault_injection
    from pipeline_output.infra.settings import fault_point

    if fault_point() != "after_commit":
        return None
    return lambda: fault_injection("after_commit")


def _add_metadata(
    context: dg.OutputContext,
    meta: dict[str, Any],
    *,
    told: bool = False,
    arms: str | None = None,
) -> None:
    """The step's materialisation metadata; the arms written (`arms`, else the metadata's) noted
    for the step's own checks (`told`: the write said why `parity` is skipped —
    `parity_skip_note` —, in its materialisation's `parity` or a range run's line).

    An asset's metadata is added to its materialisation only (`add_asset_metadata`): as output
    metadata Dagster also copied all of it into the step's `HANDLED_OUTPUT` event, serialised
    and stored a second time in every run (issue 44). An op's output keeps it there."""
    if meta:
        _materialisation_metadata(context, meta)
    arms = arms if arms is not None else meta.get("arms")
    try:
        run_id = context.run_id
    except dg.DagsterInvariantViolationError:  # a context built outside a run: no checks follow
        return
    if arms is not None and context.has_asset_key:
        note_written(run_id, context.asset_key, str(arms), told=told)


def _materialisation_metadata(context: dg.OutputContext, meta: dict[str, Any]) -> None:
    """`meta` on the materialisation of the asset `context` writes, else (an op's output, a
    context built outside a run) as output metadata."""
    try:
        step = context.step_context if context.has_asset_key else None
    except (dg.DagsterInvariantViolationError, AttributeError):
        step = None
    if step is not None:
        try:
            step.add_asset_metadata(meta, asset_key=context.asset_key)
            return
        except dg.DagsterInvariantViolationError:  # not an asset step
            pass
    context.add_output_metadata(meta)


def _parity_note(context: dg.OutputContext, mode: ResolvedMode) -> str | None:
    """`parity_skip_note` for this step's write in `mode` (None outside a run)."""
    try:
        step = context.step_context
    except (dg.DagsterInvariantViolationError, AttributeError):
        return None
    if not context.has_asset_key:
        return None
    return parity_skip_note(step, context.asset_key, mode.arms)


def _data_version(context: dg.OutputContext, snapshot_id: int | None) -> None:
    """The materialisation's data version: the Iceberg snapshot the write left main at (a
    downstream's eager automation condition and staleness follow the table, not the run). Set
    on the step context: Dagster 1.13 takes a data version only from the `Output` /
    `MaterializeResult` the compute returns, before the IO manager writes (dagster#15584); the
    step's cached version is what the materialisation event then carries."""
    if snapshot_id is None:
        return
    try:
        step = context.step_context
    except (dg.DagsterInvariantViolationError, AttributeError):
        return  # a direct call outside a run: no materialisation to version
    step.set_data_version(context.asset_key, dg.DataVersion(str(snapshot_id)))


def _published_version(context: dg.OutputContext, result: PublishResult) -> None:
    """`_data_version` of a publish that reached main on the Iceberg arm (an audited write's
    staged branch is not the table's version yet)."""
    ice = result.results.get("iceberg")
    if ice is not None and not result.staged:
        _data_version(context, ice.snapshot_id)


def _dataset_of(context: dg.OutputContext | dg.InputContext) -> str | None:
    """The dataset a step's error names: the one its output writes, or the one its input is read
    for (the step's asset; else the asset the input reads)."""
    step = step_of(context) if isinstance(context, dg.InputContext) else None
    assets = step.assets_def if step is not None else None
    if assets is not None and len(assets.keys) == 1:
        return str(next(iter(assets.keys)).path[-1])
    return context.asset_key.path[-1] if context.has_asset_key else None


class DatasetIOManager(dg.ConfigurableIOManager):
    """Writes dataset outputs through the core's publish step; reads inputs as LazyFrames.

    `pipeline_output` is the code location's `PipelineOutputResource` (default: the environment's
    settings); `build_definitions` passes the one it binds, as bound (`bound_resource`): Dagster
    then hands this manager the run's initialised top-level resource instead of initialising a
    copy of its own for every run."""

    # (an evaluated annotation — no `from __future__ import annotations` in this module —:
    # Dagster's metaclass then also accepts the bound-at-launch resource here)
    pipeline_output: PipelineOutputResource

    def __init__(self, **data: Any) -> None:
        if "pipeline_output" not in data:  # Dagster re-builds the manager for every run
            data["pipeline_output"] = PipelineOutputResource()
        super().__init__(**data)

    def _with_updated_values(self, values: Mapping[str, Any] | None) -> "DatasetIOManager":
        """Dagster's copy of the manager with `values` put in: without a new validation when they
        change nothing (`resource.unchanged_copy`: two of the three copies Dagster makes a run)."""
        copy = unchanged_copy(self, values)
        if copy is None:
            copy = cast(DatasetIOManager, super()._with_updated_values(values))
        return copy

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        with failing_as_dagster(_dataset_of(context)):
            self._handle_output(context, obj)

    def _handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        spec = spec_in_run(context, context.asset_key, context.definition_metadata)
        if spec is None:
            raise dg.Failure(
                f"asset {context.asset_key.to_user_string()} is not a pipeline-output dataset"
            )
        output_meta = context.output_metadata or {}
        override = _meta_value(output_meta.get(MODE_OVERRIDE_KEY))
        wanted = _meta_value(output_meta.get(AUDIT_OVERRIDE_KEY))

        def setup(*, ahead: bool = False) -> _Setup:
            runtime = self.pipeline_output.runtime()
            mode = runtime.publisher.resolve(spec, override=override)
            audit = (spec.audit if wanted is None else bool(wanted)) and "iceberg" in mode.arms
            loaded = (
                runtime.publisher.load_range_ahead(spec, mode=mode, audit=audit) if ahead else None
            )
            return _Setup(runtime, mode, audit, loaded)

        if isinstance(obj, PartitionedOutput) and obj.items and spec.delta is None:
            # the write made ready while the first partition computes (`first_computed_while`)
            obj, ready = first_computed_while(obj, lambda: setup(ahead=True))
        else:
            ready = setup()
        runtime, mode, audit = ready.runtime, ready.mode, ready.audit
        publisher = runtime.publisher
        if spec.delta is not None and not isinstance(obj, WindowedOutput):
            # a delta dataset's output computed by other code than `@dataset` (an asset or op of
            # the user's own): the same exactly-once apply per window, or refused before any I/O
            obj = windowed_frame(spec, to_polars(spec, obj), windows_of(context, spec))
        if isinstance(obj, WindowedOutput):
            self._apply_windows(context, spec, obj, mode, audit=audit)
            return
        if isinstance(obj, ChangesOutput):
            if audit:
                raise UnsupportedWrite(
                    f"dataset {spec.name!r}: write-audit-publish of an incremental downstream is "
                    "not supported (its consumed range commits with its rows on main); nothing "
                    "was written"
                )
            self._consume_changes(context, spec, obj, mode)
            return
        partitioned = partitioned_output_of(context, spec, obj)
        note = _parity_note(context, mode)
        if partitioned is not None:  # Dagster's own partitions: one slice write each
            meta, last = write_partitions(
                context,
                spec,
                partitioned,
                mode,
                runtime=runtime,
                audit=audit,
                note=note,
                ahead=ready.ahead,
            )
            # a range run's arms are on its last partition's materialisation, not the step's
            arms = ", ".join(mode.arms) if not meta else None
            _add_metadata(context, meta, told=note is not None, arms=arms)
            _published_version(context, last)
            if audit:
                self._gate(context, spec)
            return
        frame = to_polars(spec, obj)
        result = publisher.publish(spec, frame, mode=mode, run_id=context.run_id, audit=audit)
        # no log line: the materialisation says what the write did (`write_mode`, `why`, the
        # row counts, `iceberg/snapshot_id`), and each line is an event in the run's log
        meta = publish_metadata(result, runtime=runtime, spec=spec, schema=frame.schema)
        if note is not None:
            meta[PARITY] = note
        _add_metadata(context, meta, told=note is not None)
        _published_version(context, result)
        if audit:
            self._gate(context, spec)

    def _gate(self, context: dg.OutputContext, spec: DatasetSpec) -> None:
        """Record which blocking checks of this run gate the audit's publish (`audit_hooks`)."""
        audits = self.pipeline_output.runtime().ledger.audit_log
        audit = audits.audit(spec.name, context.run_id)
        if audit is None:
            return
        gating = gating_checks(context.step_context, context.asset_key)
        if audit.mode != "dual":  # parity compares nothing then (skipped): it gates nothing
            gating = [name for name in gating if name != PARITY]
        audits.set_gating_checks(audit.id, gating)
        context.log.info(
            f"{spec.name}: staged on branch {audit.branch}; main moves when "
            + (f"the blocking checks pass ({', '.join(gating)})" if gating else "this step ends")
        )

    def _apply_windows(
        self,
        context: dg.OutputContext,
        spec: DatasetSpec,
        out: WindowedOutput,
        mode: ResolvedMode,
        *,
        audit: bool = False,
    ) -> None:
        """Apply each window in order, exactly once (the ledger protocol in `window_apply.apply_window`)."""
        runtime = self.pipeline_output.runtime()
        outcomes = []
        last: PublishResult | None = None
        for window, compute, write_window in out.items:
            request = ApplyRequest(
                spec=spec,
                window=window,
                compute=compute,
                mode=mode,
                run_id=context.run_id,
                restate=out.restate,
                write_window=write_window,
                audit=audit,
            )
            outcome = apply_window(
                request,
                publisher=runtime.publisher,
                ledger=runtime.windows,
                on_written=_fault_hook(),
            )
            context.log.info(f"{spec.name}: {outcome.message}")
            outcomes.append(outcome)
            if outcome.result is not None:
                last = outcome.result
        # run-wide facts on the step; each window's own figures on its partition
        meta = run_metadata(outcomes, mode)
        if last is not None:
            meta.update(run_table_metadata(last, runtime=runtime, spec=spec))
        else:
            meta["note"] = "no-op: every window was already applied; nothing written"
        record_window_metadata(context, outcomes)
        _add_metadata(context, meta)
        if last is not None:
            _published_version(context, last)
        elif "iceberg" in mode.arms and not audit:  # nothing written: the table's head still
            table = runtime.iceberg.load(spec)
            head = table.current_snapshot() if table is not None else None
            _data_version(context, head.snapshot_id if head is not None else None)
        if audit:
            self._gate(context, spec)

    def _consume_changes(
        self, context: dg.OutputContext, spec: DatasetSpec, out: ChangesOutput, mode: ResolvedMode
    ) -> None:
        """One run of an incremental downstream, exactly once (`incremental.consume_changes`)."""
        runtime = self.pipeline_output.runtime()
        request = ConsumeRequest(
            spec=spec,
            upstream=out.upstream,
            compute=out.compute,
            mode=mode,
            upstream_mode=runtime.publisher.resolve(out.upstream),
            run_id=context.run_id,
            columns=out.columns,
        )
        outcome = consume_changes(
            request, publisher=runtime.publisher, ledger=runtime.ledger, on_written=_fault_hook()
        )
        context.log.info(f"{spec.name}: {outcome.message}")
        ice = outcome.result.results.get("iceberg") if outcome.result is not None else None
        if ice is not None:
            _data_version(context, ice.snapshot_id)
        meta = changes_metadata(outcome)
        if outcome.result is not None:
            meta.update(publish_metadata(outcome.result, runtime=runtime, spec=spec))
        else:
            meta["note"] = (
                "no-op: no upstream change since the last run; nothing written"
                if outcome.action == "noop"
                else "the recomputed keys changed nothing; the range is recorded"
            )
        _add_metadata(context, meta)

    def load_input(self, context: dg.InputContext) -> Any:
        with failing_as_dagster(_dataset_of(context)):
            loaded = self._load_input(context)
            # a @dataset's own parameters are unannotated to Dagster (its compute converts them)
            return as_annotated(loaded, context.dagster_type.typing_type)

    def _load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        meta = (upstream.definition_metadata if upstream is not None else None) or {}
        runtime = self.pipeline_output.runtime()
        if (context.definition_metadata or {}).get(DELTA_INPUT_KEY):
            return self._window_reader(context, meta)
        spec = spec_in_run(context, context.asset_key, meta) if context.has_asset_key else None
        if (context.definition_metadata or {}).get(CHANGES_INPUT_KEY):
            if spec is None:
                key = context.asset_key.to_user_string() if context.has_asset_key else "?"
                raise dg.Failure(
                    f"input {key}: a Changes input reads a pipeline-output dataset's table, "
                    "and this is not one"
                )
            # the changes are read when the output is handled (`ChangesOutput`)
            # (its `columns` metadata was checked when the location loaded: `mark_changes_input`)
            asked = (context.definition_metadata or {}).get(COLUMNS_KEY)
            return ChangesSource(spec, tuple(asked) if asked else None)
        if spec is not None:
            mode = runtime.publisher.resolve(spec)
            # lazy: the compute's projection and filters are pushed to the arm at collect time;
            # an Iceberg read is pinned to the snapshot current now (or `as_of`'s)
            scan = runtime.publisher.scan(spec, mode=mode, as_of=self._as_of(context, spec))
            return narrowed_to_input_partitions(context, scan, meta)
        if SOURCE_METADATA_KEY in meta:
            source = source_from_metadata(meta[SOURCE_METADATA_KEY])
            from pipeline_output.dagster_layer.source_assets import scan_source

            return scan_source(source, window=None, runtime=runtime)
        key = context.asset_key.to_user_string() if context.has_asset_key else "?"
        raise dg.Failure(f"input {key} is neither a pipeline-output dataset nor a source")

    def _as_of(self, context: dg.InputContext, spec: DatasetSpec) -> int | datetime | None:
        """Which version of the upstream dataset `spec` this input reads: in the run that staged
        an audit of it, the audited snapshot (published first when every blocking check passed:
        `audit_hooks`); else the reading asset's `as_of` config; else None (the current one)."""
        audited = audited_snapshot(context, spec, runtime=self.pipeline_output.runtime())
        if audited is not None:
            return audited
        step = step_of(context)
        config = step.op_config if step is not None else None
        raw = config.get("as_of") if isinstance(config, dict) else None
        return parse_as_of(raw, dataset=spec.name) if raw else None

    def _window_reader(self, context: dg.InputContext, meta: Any) -> WindowReader:
        """The delta source of a delta dataset: a reader the compute scans window by window."""
        from pipeline_output.dagster_layer.source_assets import scan_source

        runtime = self.pipeline_output.runtime()
        if SOURCE_METADATA_KEY in meta:
            # the Delta's watermark reads the windows, whatever the source declares
            watermark = str(_meta_value(context.definition_metadata[DELTA_INPUT_KEY]))
            source = replace(source_from_metadata(meta[SOURCE_METADATA_KEY]), watermark=watermark)
            if source.kind == "postgres":
                from pipeline_output.services.sources import (
                    postgres_shape,
                    postgres_window_count,
                    scan_postgres,
                )

                url = source.url or runtime.pg_url
                shape = postgres_shape(source, url)  # once per run, not once per window
                return WindowReader(
                    source.name,
                    lambda w: scan_postgres(source, url, window=w, shape=shape),
                    count=lambda w: postgres_window_count(source, url, w, known=shape.columns),
                )
            from pipeline_output.dagster_layer.source_assets import iceberg_window_count

            return WindowReader(
                source.name,
                lambda w: scan_source(source, window=w, runtime=runtime),
                count=lambda w: iceberg_window_count(source, w, runtime=runtime),
            )
        up = spec_in_run(context, context.asset_key, meta) if context.has_asset_key else None
        if up is not None:
            mode = runtime.publisher.resolve(up)
            watermark = str(_meta_value(context.definition_metadata[DELTA_INPUT_KEY]))

            # one lazy scan per run (Iceberg: pinned to the upstream snapshot current at load);
            # each window is a predicate on it, pushed down to the arm (pyiceberg prunes files
            # by the watermark's column stats; the legacy arm gets it as SQL parameters)
            base = runtime.publisher.scan(up, mode=mode, as_of=self._as_of(context, up))

            def scan(window: Window | None) -> pl.LazyFrame:
                return base if window is None else within(base, window, watermark)

            def count(window: Window) -> int:
                return int(scan(window).select(pl.len()).collect().item())

            return WindowReader(up.name, scan, count=count)
        key = context.asset_key.to_user_string() if context.has_asset_key else "?"
        raise dg.Failure(f"input {key} is neither a pipeline-output dataset nor a source")


class _OnFirstUse(dg.IOManager):
    """An IO manager built the first time an output or input needs it."""

    def __init__(self, build: Any) -> None:
        self._build = build
        self._inner: dg.IOManager | None = None

    def _manager(self) -> dg.IOManager:
        if self._inner is None:
            self._inner = self._build()
        return self._inner

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        self._manager().handle_output(context, obj)

    def load_input(self, context: dg.InputContext) -> Any:
        return self._manager().load_input(context)


def default_io_manager() -> dg.IOManagerDefinition:
    """Dagster's default `io_manager` (its filesystem IO manager, same `base_dir` config, or the
    one `DAGSTER_DEFAULT_IO_MANAGER_*` names), built on its first use rather than when a run
    starts: a dataset asset's check outputs require an `io_manager` but never store anything
    through it, and building the filesystem one imports `upath` (~0.2 s of a one-partition run
    in a fresh process, issue 44). `build_definitions` binds it when no `io_manager` is given."""
    from dagster._core.definitions.job_definition import (
        default_job_io_manager_with_fs_io_manager_schema as dagster_default,
    )

    def build(init_context: dg.InitResourceContext) -> dg.IOManager:
        make: Any = dagster_default.resource_fn
        return _OnFirstUse(lambda: make(init_context))

    return dg.IOManagerDefinition(
        resource_fn=build,
        config_schema=dagster_default.config_schema,
        description="Dagster's default IO manager, built on first use",
    )
