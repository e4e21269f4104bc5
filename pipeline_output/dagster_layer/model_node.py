"""`model_node`: a downstream asset that scores a dataset window by window and writes one replace.

The heavy lifting is `pipeline_output.services.model.score`; this module only maps Dagster's context (run
id, run config `mode`) onto it and reports metadata: windows/batches read, rows scored, snapshot
id, duration and throughput. Like a `@dataset`, it checks itself in its own step after the write
(`checks.py`).
"""

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Unpack

import dagster as dg

from pipeline_output.contract.spec import Mode
from pipeline_output.dagster_layer.asset_params import (
    AssetOptions,
    AssetOptionsKwargs,
    asset_options,
    asset_params,
    remember_build,
)
from pipeline_output.dagster_layer.checks import evaluate_checks
from pipeline_output.dagster_layer.dataset import define_dataset_asset, spec_of
from pipeline_output.dagster_layer.failures import failing_as_dagster
from pipeline_output.dagster_layer.metadata import (
    CODE_REFERENCES_KEY,
    arm_kinds,
    code_reference,
    definition_metadata,
    iceberg_table_metadata,
    legacy_table_metadata,
)
from pipeline_output.dagster_layer.resource import runtime_of
from pipeline_output.errors import InvalidSpec
from pipeline_output.services.model import DEFAULT_BATCH_ROWS, ModelSpec, Predict, score


class ModelRunConfig(dg.Config):
    """Run config of a model node."""

    mode: str | None = None


def model_node(
    name: str,
    *,
    source: dg.AssetsDefinition,
    predict: Predict,
    features: Sequence[str] | None = None,
    mode: Mode | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    **options: Unpack[AssetOptionsKwargs],
) -> dg.AssetsDefinition:
    """Score `source` (a `@dataset` asset) with `predict`; output rows carry `__source_row_index__`.

    `predict` receives the `features` columns (name `__source_row_index__` among them to receive
    each row's index), else every source column. Its rows are matched to the input rows: joined on
    the source's key columns or `__source_row_index__` when it returns them (one to one), else by
    position (one row per input row, in input order); anything else fails the run, nothing written.
    """
    if not isinstance(source, dg.AssetsDefinition):
        raise InvalidSpec(
            f"model node {name!r}: source must be the @dataset asset itself (the decorated "
            f"function), got {type(source).__name__} {source!r}; the node needs the dataset's "
            "spec (watermark, windows) when the code location loads"
        )
    source_spec = spec_of(source)
    if source_spec is None:
        raise InvalidSpec(f"model node {name!r}: source must be a @dataset asset")
    model = ModelSpec(
        name=name,
        source=source_spec,
        predict=predict,
        features=tuple(features) if features is not None else None,
        batch_rows=batch_rows,
        mode=mode,
    )
    out_spec = model.output

    def _model(context: dg.AssetExecutionContext, config: ModelRunConfig) -> Iterator[Any]:
        with failing_as_dagster(name):
            if context.selected_asset_keys:  # else a run of its checks alone: nothing is scored
                yield _score(context, config)
            yield from evaluate_checks(context, out_spec)

    def _score(
        context: dg.AssetExecutionContext, config: ModelRunConfig
    ) -> dg.MaterializeResult[Any]:
        runtime = runtime_of(context)
        resolved = runtime.publisher.resolve(out_spec, override=config.mode)
        run = score(
            model,
            publisher=runtime.publisher,
            ledger=runtime.windows,
            mode=resolved,
            run_id=context.run.run_id,
        )
        primary = run.results.get("iceberg") or next(iter(run.results.values()))
        context.log.info(
            f"{name}: scored {run.rows_scored} rows in {len(run.batches)} batches -> "
            f"snapshot {primary.snapshot_id}"
        )
        metadata: dict[str, Any] = {
            "dagster/row_count": run.rows_scored,
            "mode": f"{resolved.mode} (from {resolved.source})",
            "arms": ", ".join(run.results),
            "write_mode": "replace",
            "batches_read": len(run.batches),
            "batches": ", ".join(run.batches)[:2000],
            "rows_scored": run.rows_scored,
            "rows_in": run.rows_scored,
            "rows_inserted": primary.rows_inserted,
            "rows_deleted": primary.rows_deleted,
            "duration_s": round(run.duration_s, 3),
            "throughput_rows_s": round(run.throughput_rows_s, 1),
        }
        table = runtime.iceberg.load(out_spec) if "iceberg" in run.results else None
        if table is not None:
            metadata.update(iceberg_table_metadata(runtime, out_spec, table))
            metadata["iceberg/snapshot_id"] = str(primary.snapshot_id)
            metadata["iceberg/source_snapshot_id"] = str(run.source_snapshot_id)
        else:
            metadata.update(legacy_table_metadata(runtime, out_spec))
        return dg.MaterializeResult(metadata=metadata)

    shown = {
        **definition_metadata(out_spec),
        "model_source": source_spec.name,
        "features": ", ".join(features) if features else "(all columns)",
    }

    def build(chosen: AssetOptions) -> dg.AssetsDefinition:
        label = f"model node {name!r}"
        passed = asset_params(chosen, label=label, kinds=arm_kinds(out_spec.mode))
        passed.setdefault("description", f"Predictions over {source_spec.name}")
        metadata = {**passed.pop("metadata", {}), **shown}
        if CODE_REFERENCES_KEY not in metadata and (where := code_reference(predict)) is not None:
            metadata[CODE_REFERENCES_KEY] = where  # what a user edits: `predict`
        key = chosen.key(name)
        return define_dataset_asset(
            _model, out_spec, key=key, label=label, metadata=metadata, deps=[source.key], **passed
        )

    given = asset_options("model_node", **options)
    # `predict`'s docstring is the node's own description
    own = replace(given, description=given.description or getattr(predict, "__doc__", None))
    asset = build(own)
    remember_build(asset, own, build)
    return asset
