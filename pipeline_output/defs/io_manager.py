"""`DatasetIOManager`: output context -> (spec, windows, run id, mode) -> publish; inputs from the
authoritative arm (datasets) or the source database (sources), as polars LazyFrames."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.defs.dataset import spec_from_metadata
from pipeline_output.defs.keys import MODE_OVERRIDE_KEY, SOURCE_METADATA_KEY, SPEC_METADATA_KEY
from pipeline_output.defs.metadata import publish_metadata
from pipeline_output.defs.runtime import get_runtime
from pipeline_output.defs.windows_context import windows_of
from pipeline_output.frames import to_polars
from pipeline_output.publish import PublishResult
from pipeline_output.sources import SourceSpec


def _meta_value(raw: Any) -> Any:
    return getattr(raw, "value", raw)


def source_from_metadata(raw: Any) -> SourceSpec:
    """Decode a `SourceSpec` from asset metadata."""
    value = _meta_value(raw)
    if isinstance(value, str):
        value = json.loads(value)
    return SourceSpec(**value)


class DatasetIOManager(dg.ConfigurableIOManager):
    """Writes dataset outputs through the core's publish step; reads inputs as LazyFrames."""

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        raw_spec = (context.definition_metadata or {}).get(SPEC_METADATA_KEY)
        if raw_spec is None:
            raise dg.Failure(
                f"asset {context.asset_key.to_user_string()} is not a pipeline-output dataset"
            )
        spec = spec_from_metadata(raw_spec)
        override = _meta_value((context.output_metadata or {}).get(MODE_OVERRIDE_KEY))
        runtime = get_runtime()
        publisher = runtime.publisher
        mode = publisher.resolve(spec, override=override)
        windows = windows_of(context, spec) or [None]
        frame = to_polars(spec, obj)
        result: PublishResult | None = None
        for window in windows:
            part = frame
            if (
                window is not None
                and spec.watermark
                and spec.watermark in frame.columns
                and len(windows) > 1
            ):
                part = frame.filter(window.contains(spec.watermark))
            plans = publisher.plan(spec, mode=mode, window=window)
            result = publisher.publish(spec, part, mode=mode, window=window, run_id=context.run_id)
            result.plans.update(plans)
            primary = result.primary
            context.log.info(
                f"{spec.name}: {primary.write_mode} ({next(iter(plans.values())).reason}) -> "
                f"{'no-op' if primary.noop else f'snapshot {primary.snapshot_id}'}; "
                f"+{primary.rows_inserted} ~{primary.rows_updated} -{primary.rows_deleted}"
            )
        assert result is not None
        context.add_output_metadata(publish_metadata(result, schema=frame.schema))

    def load_input(self, context: dg.InputContext) -> pl.LazyFrame:
        upstream = context.upstream_output
        meta = (upstream.definition_metadata if upstream is not None else None) or {}
        runtime = get_runtime()
        if SPEC_METADATA_KEY in meta:
            spec = spec_from_metadata(meta[SPEC_METADATA_KEY])
            mode = runtime.publisher.resolve(spec)
            return runtime.publisher.read(spec, mode=mode).lazy()
        if SOURCE_METADATA_KEY in meta:
            source = source_from_metadata(meta[SOURCE_METADATA_KEY])
            from pipeline_output.defs.sources import scan_source

            return scan_source(source, window=None)
        key = context.asset_key.to_user_string() if context.has_asset_key else "?"
        raise dg.Failure(f"input {key} is neither a pipeline-output dataset nor a source")
