"""A chained delta dataset over an upstream dataset with a `key_prefix` (issue 43): its Delta's
`source` names the compute's parameter, and the upstream is the asset that parameter reads (its
`ins=` key, prefix included), not an asset named like the parameter. Read through `ins=`, the
chained dataset gets its window sensor, cut on the prefixed upstream and applied after it; read by
name alone, the location refuses to load in one line saying how to read it.
"""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from pipeline_output import Delta, Window, build_definitions, dataset, postgres_source
from pipeline_output.dagster_layer.resource import get_runtime
from pipeline_output.errors import InvalidSpec
from pipeline_output_tests.dagster_layer.test_window_cadence import make_source, source_frame, tick
from pipeline_output_tests.dagster_runs import requested_keys, run_request
from pipeline_output_tests.oracle import assert_same_multiset

UPSTREAM = dg.AssetKey(["marts", "ev_copy"])


def prefixed_upstream() -> dg.AssetsDefinition:
    """`marts/ev_copy`: a delta copy of the source `ev`, 2 rows a window."""

    @dataset(
        "ev_copy",
        strategy="append_always",
        mode="iceberg",
        key_prefix="marts",
        delta=Delta(source="ev", watermark="seq", max_rows=2),
    )
    def ev_copy(ev: pl.LazyFrame) -> pl.LazyFrame:
        return ev.select("id", "v", "seq")

    return ev_copy


def chain_defs(**read: object) -> dg.Definitions:
    """`ev_upper`, a chained delta dataset over `marts/ev_copy` (`read`: how it names it)."""

    @dataset(
        "ev_upper",
        strategy="append_always",
        mode="iceberg",
        delta=Delta(source="ev_copy", watermark="seq"),
        **read,  # type: ignore[arg-type]
    )
    def ev_upper(ev_copy: pl.LazyFrame) -> pl.LazyFrame:
        return ev_copy.with_columns(pl.col("v").str.to_uppercase())

    raw = postgres_source("ev", table="ev", watermark="seq")
    return build_definitions(datasets=[prefixed_upstream(), ev_upper], sources=[raw])


def test_a_delta_dataset_reading_a_prefixed_upstream_through_ins_gets_its_window_sensor(
    env: str, instance: dg.DagsterInstance
) -> None:
    make_source(env, 1, 4)
    defs = chain_defs(ins={"ev_copy": UPSTREAM})
    sensors = {s.name for s in defs.sensors}
    assert "ev_upper__window_sensor" in sensors, sensors
    assert tick(defs, instance, "ev_upper").run_requests == [], "its upstream is not written yet"

    upstream = tick(defs, instance, "ev_copy")
    assert [Window.from_key(k) for k in requested_keys(upstream, instance)] == [
        Window(None, 2),
        Window(2, 4),
    ]
    for request in upstream.run_requests:
        assert run_request(defs, instance, request).success
    # cut on what the prefixed upstream holds, and its materialisation seen under its own key
    chained = tick(defs, instance, "ev_upper")
    assert [Window.from_key(k) for k in requested_keys(chained, instance)] == [Window(None, 4)]
    [request] = chained.run_requests
    assert request.asset_selection == [dg.AssetKey("ev_upper")]
    assert run_request(defs, instance, request).success
    upper = source_frame(env).with_columns(pl.col("v").str.to_uppercase())
    assert_same_multiset(get_runtime().iceberg.read("ev_upper").select(upper.columns), upper)
    idle = tick(defs, instance, "ev_upper", cursor=chained.cursor)
    assert idle.run_requests == []


def test_a_delta_dataset_naming_a_prefixed_upstream_by_name_alone_says_to_use_ins() -> None:
    with pytest.raises(InvalidSpec) as info:
        chain_defs()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("dataset 'ev_upper': Delta(source='ev_copy') ")
    assert "ins={'ev_copy': dg.AssetKey(['marts', 'ev_copy'])}" in message, message
