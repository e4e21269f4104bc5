"""Materialisation metadata as Dagster defines it: `dagster/uri`, `dagster/table_name` with the
catalog, `dagster/column_schema` with Iceberg type names, the key as constraints and column
descriptions, `dagster/row_count`, `dagster/partition_row_count` on a window run and a
Dagster-partitioned one; the arm figures
grouped under `iceberg/` and `pg/`, numbers kept numbers; the spec out of sight; kinds by arm; the
definition carrying the column schema of a table that exists when Dagster loads the location."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest
from dagster._core.definitions.definitions_load_context import (
    DefinitionsLoadContext,
    DefinitionsLoadType,
)

from pipeline_output import (
    Delta,
    PipelineOutputResource,
    build_definitions,
    dataset,
    postgres_source,
)
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.metadata import docstring_columns
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.dagster_layer.runner import materialize
from pipeline_output_tests.dagster_runs import mat_meta, run_assets

ICEBERG_TYPES = {
    "sale_id": "long",
    "region": "string",
    "total": "double",
    "at": "timestamptz",
    "tags": "list<string>",
    "price": "decimal(10, 2)",
    "day": "date",
}
FRAME = pl.DataFrame(
    {
        "sale_id": [1, 2],
        "region": ["north", "south"],
        "total": [1.5, 2.0],
        "at": [datetime(2026, 12, 1, 9, tzinfo=UTC), datetime(2026, 12, 2, 9, tzinfo=UTC)],
        "tags": [["a"], ["b", "c"]],
        "price": [Decimal("1.50"), Decimal("2.00")],
        "day": [datetime(2026, 12, 1).date(), datetime(2026, 12, 2).date()],
    },
    schema_overrides={"price": pl.Decimal(10, 2)},
)
PLOTTED = ("dagster/row_count", "rows_in", "rows_inserted", "rows_updated", "rows_deleted")


def _sales(mode: str) -> dg.AssetsDefinition:
    @dataset(
        "sales",
        primary_key="sale_id",
        mode=mode,  # type: ignore[arg-type]
        columns={"total": "quantity times unit price", "region": "sales region (upper case)"},
    )
    def compute() -> pl.DataFrame:
        """Every sale.

        Columns:
            sale_id: the sale's id
            region: where it was sold
        """
        return FRAME if mode == "iceberg" else FRAME.drop("tags")  # the legacy arm: no lists

    return compute


def _run(asset: dg.AssetsDefinition, **options: Any) -> dict[str, Any]:
    defs = build_definitions(datasets=[asset], with_maintenance=False, **options)
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["sales"])
    assert result.success
    return mat_meta(result, "sales")


def _columns(schema: dg.TableSchema) -> dict[str, dg.TableColumn]:
    return {c.name: c for c in schema.columns}


def _check_schema(schema: dg.TableSchema, *, lists: bool = True) -> None:
    columns = _columns(schema)
    expected = ICEBERG_TYPES if lists else {k: v for k, v in ICEBERG_TYPES.items() if k != "tags"}
    assert {n: c.type for n, c in columns.items()} == expected
    key = columns["sale_id"].constraints
    assert (key.nullable, key.unique) == (False, True)
    assert columns["region"].constraints.nullable and not columns["region"].constraints.unique
    assert schema.constraints is not None and schema.constraints.other == ["primary key (sale_id)"]
    assert columns["sale_id"].description == "the sale's id"  # the docstring's Columns section
    assert columns["region"].description == "sales region (upper case)"  # columns= wins
    assert columns["total"].description == "quantity times unit price"
    assert columns["at"].description is None


def _check_grouping(meta: dict[str, Any]) -> None:
    for key in PLOTTED:
        assert isinstance(meta[key], int) and not isinstance(meta[key], bool), key
    assert isinstance(meta["duration_s"], float)
    for key in meta:  # run-level keys, Dagster's, or an arm's
        assert "/" not in key or key.split("/")[0] in ("dagster", "iceberg", "pg"), key
    texts = [v for v in meta.values() if isinstance(v, str)]
    assert not any('"primary_key"' in t for t in texts), "the spec is shown"


def test_an_iceberg_write_reports_dagsters_table_metadata(env: str) -> None:
    asset = _sales("iceberg")
    meta = _run(asset)
    table = get_runtime().iceberg.load("sales")
    assert table is not None and table.current_snapshot() is not None
    assert meta["dagster/uri"] == table.location()
    assert meta["dagster/table_name"] == "default.datasets.sales"
    assert meta["dagster/row_count"] == 2
    _check_schema(meta["dagster/column_schema"])
    assert meta["iceberg/snapshot_id"] == str(table.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    assert (meta["iceberg/data_files"], meta["iceberg/snapshots"]) == (1, 1)
    assert not any(k.startswith("pg/") for k in meta)
    _check_grouping(meta)
    spec = next(iter(asset.specs))
    assert "pipeline_output/contract/spec" not in spec.metadata
    assert spec.metadata["pipeline_output/primary_key"] == "sale_id"
    assert spec.kinds == {"iceberg"}
    assert "iceberg/merge_path" not in meta  # a first deploy replaces: no row is compared
    again = _run(asset)  # a re-deploy upserts: which merge compared the rows, and why
    assert again["iceberg/merge_path"].startswith("key_scan (1 candidate file(s)"), again


def test_a_legacy_write_reports_the_rows_table_without_credentials(env: str) -> None:
    asset = _sales("pg")
    meta = _run(asset)
    uri = meta["dagster/uri"]
    assert uri.startswith("postgresql://") and "password" not in uri
    rows_table = get_runtime().postgres.table_name("sales")
    assert f"table={rows_table}" in uri and "dataset=sales" in uri
    database = env.split("?")[0].rsplit("/", 1)[-1]
    assert uri.split("?")[0].endswith(f"/{database}")
    assert meta["dagster/table_name"] == f"{database}.{rows_table}"
    # the schema the native arm would create from the same frame
    _check_schema(meta["dagster/column_schema"], lists=False)
    assert meta["pg/rows_total_after"] == 2 and "pg/deploy_id" in meta
    assert not any(k.startswith("iceberg/") for k in meta)
    _check_grouping(meta)
    assert next(iter(asset.specs)).kinds == {"postgres"}


def test_a_dual_write_reports_both_arms_under_their_prefixes(env: str) -> None:
    asset = _sales("dual")
    meta = _run(asset)
    assert meta["arms"] == "iceberg, pg"
    assert meta["dagster/uri"] == get_runtime().iceberg.load("sales").location()  # type: ignore[union-attr]
    assert meta["pg/uri"].startswith("postgresql://")
    assert meta["iceberg/write_mode"] == meta["pg/write_mode"] == "replace"
    assert meta["iceberg/rows_total_after"] == meta["pg/rows_total_after"] == 2
    _check_grouping(meta)
    assert next(iter(asset.specs)).kinds == {"iceberg", "postgres"}


def test_kinds_of_a_dataset_without_mode_follow_the_locations_default(env: str) -> None:
    @dataset("undeclared", primary_key="id")
    def undeclared() -> pl.DataFrame:
        return pl.DataFrame({"id": [1]})

    def kinds(**options: Any) -> set[str]:
        defs = build_definitions(datasets=[undeclared], with_maintenance=False, **options)
        return set(defs.get_assets_def("undeclared").specs_by_key[undeclared.key].kinds)

    assert kinds() == {"postgres"}  # the project default: the legacy arm until flipped
    assert kinds(resource=PipelineOutputResource(default_mode="iceberg")) == {"iceberg"}
    os.environ["PIPELINE_OUTPUT_DEFAULT_MODE"] = "dual"
    try:
        assert kinds() == {"iceberg", "postgres"}
    finally:
        del os.environ["PIPELINE_OUTPUT_DEFAULT_MODE"]


def test_kinds_given_to_a_dataset_stay_beside_its_arms(env: str) -> None:
    @dataset("tagged_kinds", primary_key="id", kinds=["dbt"])
    def tagged() -> pl.DataFrame:
        return pl.DataFrame({"id": [1]})

    assert next(iter(tagged.specs)).kinds == {"iceberg", "postgres", "dbt"}  # mode undecided
    resource = PipelineOutputResource(default_mode="iceberg")
    defs = build_definitions(datasets=[tagged], with_maintenance=False, resource=resource)
    assert defs.get_assets_def("tagged_kinds").specs_by_key[tagged.key].kinds == {"iceberg", "dbt"}


def test_the_definition_carries_the_column_schema_when_the_table_exists_at_load(
    env: str,
) -> None:
    asset = _sales("iceberg")

    @dataset("never_written", primary_key="id", mode="iceberg")
    def never_written() -> pl.DataFrame:
        return pl.DataFrame({"id": [1]})

    def definition_metadata(name: str) -> dict[str, Any]:
        defs = build_definitions(datasets=[asset, never_written], with_maintenance=False)
        spec = defs.get_assets_def(name).specs_by_key[dg.AssetKey(name)]
        return {k: getattr(v, "value", v) for k, v in spec.metadata.items()}

    def definition_schema(name: str) -> Any:
        return definition_metadata(name).get("dagster/column_schema")

    serving = DefinitionsLoadContext(load_type=DefinitionsLoadType.INITIALIZATION)
    with DefinitionsLoadContext.scoped(serving):
        assert definition_schema("sales") is None  # no table yet
    _run(asset)
    assert definition_schema("sales") is None  # a plain import reads no catalog
    with DefinitionsLoadContext.scoped(serving):
        _check_schema(definition_schema("sales"))
        shown = definition_metadata("sales")  # the asset page's Storage: table name and link
        assert shown["dagster/uri"] == get_runtime().iceberg.load("sales").location()  # type: ignore[union-attr]
        assert shown["dagster/table_name"] == "default.datasets.sales"
        assert definition_schema("never_written") is None
        assert "dagster/uri" not in definition_metadata("never_written")
    rebuilding = DefinitionsLoadContext(load_type=DefinitionsLoadType.RECONSTRUCTION)
    with DefinitionsLoadContext.scoped(rebuilding):  # a run worker: no catalog read
        assert definition_schema("sales") is None


def test_a_window_run_reports_its_partition_row_count(env: str) -> None:
    with psycopg.connect(env, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.events (id bigint PRIMARY KEY, seq bigint NOT NULL)")
        conn.execute("INSERT INTO public.events SELECT g, g FROM generate_series(1, 7) g")
    events_raw = postgres_source("events_raw", table="events", watermark="seq")

    @dataset(primary_key="id", mode="iceberg", delta=Delta(source="events_raw", watermark="seq"))
    def events(events_raw: pl.LazyFrame) -> pl.LazyFrame:
        return events_raw

    defs = build_definitions(datasets=[events], sources=[events_raw], with_maintenance=False)
    with dg.DagsterInstance.ephemeral() as instance:
        materialize(defs, instance)
        records = instance.fetch_materializations(dg.AssetKey("events"), limit=10).records
    assert len(records) == 1
    mat = records[0].asset_materialization
    assert mat is not None and mat.partition is not None
    meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    assert meta["dagster/partition_row_count"] == 7
    assert meta["dagster/row_count"] == 7
    assert meta["windows_applied"] == 1
    # its data version is the snapshot the window committed (an eager downstream follows it)
    head = get_runtime().iceberg.load("events").current_snapshot()  # type: ignore[union-attr]
    assert mat.tags["dagster/data_version"] == str(head.snapshot_id)  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["iceberg", "pg"])
def test_a_dagster_partitioned_run_reports_each_partitions_row_count(env: str, mode: str) -> None:
    days = ["2024-01-01", "2024-01-02"]
    rows = {days[0]: [1, 2, 3], days[1]: [4]}

    @dataset(
        "daily",
        primary_key="id",
        mode=mode,  # type: ignore[arg-type]
        partitions_def=dg.DailyPartitionsDefinition(start_date=days[0], end_date="2024-01-03"),
        partition_column="day",
    )
    def daily(partition_key: str) -> pl.DataFrame:
        ids = rows[partition_key]
        return pl.DataFrame({"id": ids, "day": [date.fromisoformat(partition_key)] * len(ids)})

    defs = build_definitions(datasets=[daily], with_maintenance=False, with_parity_checks=False)
    job = defs.resolve_implicit_global_asset_job_def()
    commit = "iceberg/snapshot_id" if mode == "iceberg" else "pg/deploy_id"
    with dg.DagsterInstance.ephemeral() as instance:
        both = job.execute_in_process(  # a range run: each partition its own figures
            instance=instance,
            asset_selection=[daily.key],
            tags={
                "dagster/asset_partition_range_start": days[0],
                "dagster/asset_partition_range_end": days[1],
            },
        )
        rows[days[1]] = [4, 5]
        one = job.execute_in_process(instance=instance, partition_key=days[1])
    per_day = {
        e.partition: {k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()}
        for e in both.get_asset_materialization_events()
    }
    assert {d: m["dagster/partition_row_count"] for d, m in per_day.items()} == {
        days[0]: 3,
        days[1]: 1,
    }
    assert all(isinstance(m[commit], str) for m in per_day.values())
    meta = mat_meta(one, "daily")
    assert (meta["dagster/partition_row_count"], meta["dagster/row_count"]) == (2, 5)
    _check_grouping(meta)
    if mode == "iceberg":  # the data version: the snapshot the run left main at
        versions = [
            e.materialization.tags["dagster/data_version"]
            for run in (both, one)
            for e in run.get_asset_materialization_events()
        ]
        assert versions[:2] == [per_day[days[1]]["iceberg/snapshot_id"]] * 2
        head = get_runtime().iceberg.load("daily").current_snapshot()  # type: ignore[union-attr]
        assert versions[2] == str(head.snapshot_id)  # type: ignore[union-attr]


@pytest.mark.parametrize("partitioned", [True, False])
def test_a_writes_metadata_is_on_its_materialisation_and_not_repeated_on_its_handled_output(
    env: str, partitioned: bool
) -> None:
    """Each event's metadata is serialised and stored in every run (issue 44): the write's
    figures go on the materialisation only; the step's HANDLED_OUTPUT event says which IO
    manager handled the output, without a copy of them."""
    day = "2024-01-01"
    days = dg.DailyPartitionsDefinition(start_date=day, end_date="2024-01-02")

    @dataset(
        "daily",
        primary_key="id",
        mode="iceberg",
        partitions_def=days if partitioned else None,
        partition_column="day" if partitioned else None,
    )
    def daily() -> pl.DataFrame:
        return pl.DataFrame({"id": [1, 2], "day": [date.fromisoformat(day)] * 2})

    defs = build_definitions(datasets=[daily], with_maintenance=False)
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(
            instance=instance,
            asset_selection=[daily.key],
            partition_key=day if partitioned else None,
        )
    meta = mat_meta(result, "daily")
    assert meta["iceberg/snapshot_id"] and meta["dagster/row_count"] == 2
    assert ("dagster/partition_row_count" in meta) == partitioned
    assert "parity" in meta  # the write's note on why `parity` compared nothing (iceberg only)
    handled = [e for e in result.all_events if e.event_type == dg.DagsterEventType.HANDLED_OUTPUT]
    assert len(handled) == 1
    assert handled[0].event_specific_data.metadata == {}  # type: ignore[union-attr]


def test_a_docstrings_columns_section_describes_columns() -> None:
    doc = """Sales.

    Columns:
        sale_id: the sale's id
        total (float): quantity times unit price,
            in the sale's currency

    Returns:
        nothing: not a column
    """
    assert docstring_columns(doc) == {
        "sale_id": "the sale's id",
        "total": "quantity times unit price, in the sale's currency",
    }
    assert docstring_columns("No section.") == {}
    assert docstring_columns(None) == {}


def test_the_spec_still_reaches_the_io_manager_from_the_compute(env: str) -> None:
    asset = _sales("iceberg")
    spec = spec_of(asset)
    assert spec is not None and spec.primary_key == ("sale_id",)
    assert dict(spec.columns)["total"] == "quantity times unit price"
    shown = json.dumps({k: str(v) for k, v in next(iter(asset.specs)).metadata.items()})
    assert "write_strategy_hint" not in shown


def test_a_job_leaving_the_upstream_dataset_out_still_reads_it_as_one(env: str) -> None:
    """The spec is out of the metadata, yet an in-process run of a job whose selection leaves the
    upstream out finds it — even with another dataset of that name declared in the process."""

    @dataset("upstream_ds", primary_key="id", mode="pg")
    def decoy() -> pl.DataFrame:  # same name, another spec: never part of this location
        return pl.DataFrame({"id": [9]})

    @dataset("upstream_ds", primary_key="id", mode="iceberg")
    def upstream() -> pl.DataFrame:
        return pl.DataFrame({"id": [1, 2]})

    @dataset(primary_key="id", mode="iceberg")
    def downstream(upstream_ds: pl.LazyFrame) -> pl.LazyFrame:
        return upstream_ds.with_columns(pl.col("id") * 10)

    only_down = dg.define_asset_job("only_downstream", selection=["downstream"])
    defs = build_definitions(datasets=[upstream, downstream], jobs=[only_down])
    with dg.DagsterInstance.ephemeral() as instance:
        assert run_assets(defs, instance, ["upstream_ds"]).success
        assert defs.resolve_job_def("only_downstream").execute_in_process(instance=instance).success
    stored = get_runtime().iceberg.read(spec_of(downstream))  # type: ignore[arg-type]
    assert sorted(stored["id"].to_list()) == [10, 20]
