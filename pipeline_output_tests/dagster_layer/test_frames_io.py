"""Frames in and out of a compute, on both arms: a compute may return pandas or Arrow (converted
once), and an input parameter annotated `pd.DataFrame`, `pa.Table`, `pl.DataFrame` or
`pl.LazyFrame` receives that type (unannotated: a LazyFrame) — a Dagster-partitioned dataset's
its partition's slice, a plain asset's frame from its own IO manager too. The stored rows are compared with a
plain-polars oracle; a wrong annotation fails when the location loads, a wrong return type before
anything is written."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import dagster as dg
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from pipeline_output import build_definitions, dataset
from pipeline_output.dagster_layer.resource import PipelineOutputResource, get_runtime
from pipeline_output.errors import InvalidSpec
from pipeline_output_tests.dagster_runs import mat_meta, run_assets
from pipeline_output_tests.oracle import assert_same_multiset

ORACLE = pl.DataFrame(
    {
        "id": [1, 2, 3],
        "name": ["ant", "bee", None],
        "score": [1.5, None, 3.0],
        "at": [datetime(2026, 12, 1, 9, 30, tzinfo=UTC)] * 3,
    }
).with_columns(pl.col("at").dt.cast_time_unit("us"))

seen: dict[str, type] = {}


def _pandas() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [1, 2, 3],
            "name": ["ant", "bee", None],
            "score": [1.5, None, 3.0],
            "at": pd.to_datetime(["2026-12-01T09:30:00Z"] * 3),  # datetime64[ns, UTC]
        }
    )


def _datasets(arm: str) -> list[dg.AssetsDefinition]:
    @dataset(primary_key="id", mode=arm)  # type: ignore[arg-type]
    def from_pandas() -> pd.DataFrame:
        return _pandas()

    @dataset(primary_key="id", mode=arm)  # type: ignore[arg-type]
    def from_arrow() -> pa.Table:
        return ORACLE.to_arrow()

    @dataset(primary_key="id", mode=arm)  # type: ignore[arg-type]
    def pandas_in(from_arrow: pd.DataFrame) -> pd.DataFrame:
        seen["pandas_in"] = type(from_arrow)
        return from_arrow.assign(score=from_arrow["score"] * 2)

    @dataset(primary_key="id", mode=arm)  # type: ignore[arg-type]
    def arrow_in(from_pandas: pa.Table) -> pa.Table:
        seen["arrow_in"] = type(from_pandas)
        return from_pandas.select(["id", "name"])

    @dataset(primary_key="id", mode=arm)  # type: ignore[arg-type]
    def eager_in(from_pandas: pl.DataFrame) -> pl.DataFrame:
        seen["eager_in"] = type(from_pandas)
        return from_pandas.filter(pl.col("id") > 1)

    @dataset(primary_key="id", mode=arm)  # type: ignore[arg-type]
    def lazy_in(from_arrow: pl.LazyFrame, from_pandas) -> pl.LazyFrame:  # type: ignore[no-untyped-def]
        seen["lazy_in"] = type(from_arrow)
        seen["unannotated"] = type(from_pandas)
        return from_arrow.select("id", "at").join(from_pandas.select("id", "name"), on="id")

    return [from_pandas, from_arrow, pandas_in, arrow_in, eager_in, lazy_in]


EXPECTED = {
    "from_pandas": ORACLE,
    "from_arrow": ORACLE,
    "pandas_in": ORACLE.with_columns(pl.col("score") * 2),
    "arrow_in": ORACLE.select("id", "name"),
    "eager_in": ORACLE.filter(pl.col("id") > 1),
    "lazy_in": ORACLE.select("id", "at", "name"),
}


@pytest.mark.parametrize("arm", ["iceberg", "pg"])
def test_pandas_and_arrow_out_and_annotated_inputs_on_each_arm(env: str, arm: str) -> None:
    seen.clear()
    datasets = _datasets(arm)
    defs = build_definitions(datasets=datasets, with_maintenance=False, with_parity_checks=False)
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, list(EXPECTED))
    assert result.success
    assert seen == {
        "pandas_in": pd.DataFrame,
        "arrow_in": pa.Table,
        "eager_in": pl.DataFrame,
        "lazy_in": pl.LazyFrame,
        "unannotated": pl.LazyFrame,
    }
    publisher = get_runtime().publisher
    for asset in datasets:
        name = asset.key.path[-1]
        stored = publisher.read(_spec(asset), mode=publisher.resolve(_spec(asset)))
        assert_same_multiset(stored, EXPECTED[name])
        assert mat_meta(result, name)["rows_in"] == EXPECTED[name].height


def _spec(asset: dg.AssetsDefinition) -> Any:
    from pipeline_output.dagster_layer.dataset import spec_of

    spec = spec_of(asset)
    assert spec is not None
    return spec


def test_annotated_inputs_of_a_partitioned_dataset_and_from_a_plain_asset(env: str) -> None:
    """A Dagster-partitioned dataset's annotated input gets its partition's slice in that type
    (`partition_key` is no input); a plain asset's pandas frame reaches a `pd.DataFrame`
    parameter as it is and a `pa.Table` parameter converted."""
    days = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-03")
    rows = pl.DataFrame(
        {"id": [1, 2, 3], "day": [date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 2)]}
    )
    got: dict[str, Any] = {}

    @dg.asset  # the default IO manager: a pickled pandas frame
    def raw() -> pd.DataFrame:
        return pd.DataFrame({"id": [7, 8], "v": ["x", "y"]})

    @dg.asset(key=["landing", "extra"])
    def extra() -> pd.DataFrame:
        return pd.DataFrame({"id": [9]})

    @dataset(primary_key="id", mode="iceberg", partitions_def=days, partition_column="day")
    def orders(partition_key: str) -> pa.Table:
        return rows.filter(pl.col("day") == date.fromisoformat(partition_key)).to_arrow()

    @dataset(primary_key="id", mode="iceberg", partitions_def=days, partition_column="day")
    def tagged(orders: pd.DataFrame, partition_key: str) -> pd.DataFrame:
        got[partition_key] = (type(orders), len(orders))
        return orders.assign(tag=partition_key)

    @dataset(primary_key="id", mode="iceberg", ins={"again": ["landing", "extra"]})
    def both(raw: pd.DataFrame, again: pa.Table) -> pl.DataFrame:
        got["raw"], got["again"] = type(raw), type(again)
        return pl.from_pandas(raw)

    defs = build_definitions(
        datasets=[orders, tagged, both],
        assets=[raw, extra],
        with_maintenance=False,
        with_parity_checks=False,
    )
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        for day in ("2024-01-01", "2024-01-02"):
            job.execute_in_process(
                instance=instance, asset_selection=[orders.key, tagged.key], partition_key=day
            )
        assert job.execute_in_process(
            instance=instance, asset_selection=[raw.key, extra.key, both.key]
        ).success
    assert got == {
        "2024-01-01": (pd.DataFrame, 1),
        "2024-01-02": (pd.DataFrame, 2),
        "raw": pd.DataFrame,
        "again": pa.Table,
    }
    # pandas holds a date column as datetime64: the table gets a timestamp (Iceberg's is in µs)
    expected = rows.with_columns(
        pl.col("day").cast(pl.Datetime("us")), tag=pl.col("day").cast(pl.String)
    )
    assert_same_multiset(get_runtime().iceberg.read("tagged"), expected)
    assert_same_multiset(
        get_runtime().iceberg.read("both"), pl.DataFrame({"id": [7, 8], "v": ["x", "y"]})
    )


def test_plain_assets_and_an_asset_check_get_a_dataset_as_their_annotation_asks(env: str) -> None:
    """Outside a `@dataset` — a plain `@asset`, an `@asset_check` — an input read from a dataset
    is what its annotation says (as Dagster's polars IO managers give it): Dagster's type check
    passes, the rows are the dataset's; unannotated, a LazyFrame."""
    got: dict[str, Any] = {}
    rows = pl.DataFrame({"id": [1, 2, 3], "amount": [1.5, -2.0, 3.0]})

    @dataset(name="ledger", primary_key="id", mode="iceberg")
    def ledger() -> pl.DataFrame:
        return rows

    def keep(name: str, value: Any) -> dg.MaterializeResult:
        got[name] = value
        return dg.MaterializeResult()

    @dg.asset(ins={"ledger": dg.AssetIn()})
    def as_polars(ledger: pl.DataFrame) -> dg.MaterializeResult:
        return keep("as_polars", ledger)

    @dg.asset(ins={"ledger": dg.AssetIn()})
    def as_pandas(ledger: pd.DataFrame) -> dg.MaterializeResult:
        return keep("as_pandas", ledger)

    @dg.asset(ins={"ledger": dg.AssetIn()})
    def as_arrow(ledger: pa.Table) -> dg.MaterializeResult:
        return keep("as_arrow", ledger)

    @dg.asset(ins={"ledger": dg.AssetIn()})
    def as_given(ledger) -> dg.MaterializeResult:  # type: ignore[no-untyped-def]
        return keep("as_given", ledger)

    @dg.asset_check(asset=ledger)
    def no_negative_amount(ledger: pl.DataFrame) -> dg.AssetCheckResult:
        got["check"] = ledger
        return dg.AssetCheckResult(passed=ledger.filter(pl.col("amount") < 0).is_empty())

    defs = build_definitions(
        datasets=[ledger],
        assets=[as_polars, as_pandas, as_arrow, as_given],
        asset_checks=[no_negative_amount],
        with_maintenance=False,
        with_parity_checks=False,
    )
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(
            defs, instance, ["ledger", "as_polars", "as_pandas", "as_arrow", "as_given"]
        )
        assert result.success
        [check] = result.get_asset_check_evaluations()
        assert check.check_name == "no_negative_amount" and not check.passed  # it read the rows
    assert {k: type(v) for k, v in got.items()} == {
        "as_polars": pl.DataFrame,
        "as_pandas": pd.DataFrame,
        "as_arrow": pa.Table,
        "as_given": pl.LazyFrame,
        "check": pl.DataFrame,
    }
    for name in ("as_polars", "check"):
        assert_same_multiset(got[name], rows)
    assert_same_multiset(pl.from_pandas(got["as_pandas"]), rows)
    assert_same_multiset(pl.from_arrow(got["as_arrow"]), rows)  # type: ignore[arg-type]
    assert_same_multiset(got["as_given"].collect(), rows)


def test_a_named_pandas_index_becomes_a_column_and_a_default_one_is_dropped(env: str) -> None:
    @dataset(primary_key="id", mode="iceberg")
    def indexed() -> pd.DataFrame:
        return pd.DataFrame({"id": [1, 2], "v": ["a", "b"]}).set_index("id")

    @dataset(primary_key="id", mode="iceberg")
    def plain() -> pd.DataFrame:
        return pd.DataFrame({"id": [1, 2], "v": ["a", "b"]}).iloc[::-1]

    defs = build_definitions(datasets=[indexed, plain], with_maintenance=False)
    with dg.DagsterInstance.ephemeral() as instance:
        assert run_assets(defs, instance, ["indexed", "plain"]).success
    expected = pl.DataFrame({"id": [1, 2], "v": ["a", "b"]})
    for asset in (indexed, plain):
        assert_same_multiset(get_runtime().iceberg.read(_spec(asset)), expected)


def test_an_input_annotated_with_another_type_fails_when_the_location_loads() -> None:
    with pytest.raises(InvalidSpec) as caught:

        @dataset(primary_key="id")
        def wrong(upstream: dict) -> pl.DataFrame:  # type: ignore[type-arg]
            return pl.DataFrame()

    message = str(caught.value)
    assert "'wrong'" in message and "'upstream'" in message and "pd.DataFrame" in message


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (lambda: {"id": [1]}, "returned dict"),
        (
            lambda: dg.Output(pl.DataFrame({"id": [1]}), metadata={"x": 1}),
            "returned dg.Output; return the frame itself, and add metadata with the compute's "
            "`context.add_output_metadata(...)`",
        ),
    ],
    ids=["dict", "dagster_output"],
)
def test_a_compute_returning_no_frame_fails_before_anything_is_written(
    env: str, returned: Any, said: str
) -> None:
    @dataset(primary_key="id", mode="iceberg")
    def not_a_frame() -> Any:
        return returned()

    defs = build_definitions(
        datasets=[not_a_frame], resource=PipelineOutputResource(), with_maintenance=False
    )
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["not_a_frame"], raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data
    assert said in str(failure)
    assert get_runtime().iceberg.load("not_a_frame") is None


def test_pandas_stays_optional_a_polars_location_works_without_it() -> None:
    """With pandas not importable at all (`sys.modules["pandas"] = None`), a location loads, its
    inputs convert and outputs check — pandas is only imported by a compute that uses it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['pandas'] = None\n"
        "import polars as pl, pyarrow as pa\n"
        "from pipeline_output import DatasetSpec, build_definitions, dataset\n"
        "from pipeline_output.contract.checked_input import to_polars\n"
        "from pipeline_output.dagster_layer.frames_io import as_kind, check_output\n"
        "@dataset(primary_key='id')\n"
        "def a(up: pl.DataFrame, other: pa.Table) -> pl.LazyFrame:\n"
        "    return up.lazy()\n"
        "build_definitions(datasets=[a])\n"
        "frame = pl.DataFrame({'id': [1]})\n"
        "assert isinstance(as_kind(frame.lazy(), 'arrow'), pa.Table)\n"
        "check_output('a', frame)\n"
        "print(to_polars(DatasetSpec('a', primary_key='id'), frame.to_arrow()).height)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1"
