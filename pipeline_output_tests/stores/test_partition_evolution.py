"""Partition-spec evolution under every write (issue 30, item 4).

A table whose files were written under one `partition_by` (some carrying delete files), then
written under another: fields added (`truncate(3, id)` -> `day, bucket(4, id)`), and a transform's
parameter changed (`bucket(4, id)` -> `bucket(8, id)`, `truncate(3, id)` -> `truncate(5, id)`,
`bucket(16, id)` -> `bucket(1, id)`). Every strategy, re-deploy and delta window, copy-on-write and
merge-on-read, each write run twice against the polars oracle (`Harness.write_and_check`); the
first deploy onto an empty table made under the old spec; field names and ids as Iceberg evolves
them; a format-version 1 table (removed fields stay as `void`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import polars as pl
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, VoidTransform
from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType

from pipeline_output import DatasetSpec, Delta
from pipeline_output_tests.iceberg_harness import (
    NS,
    WINDOW,
    Harness,
    base,
    customers,
    redeploy_rows,
    window_rows,
)
from pipeline_output_tests.oracle import IDEMPOTENT, KEYED_NOOP, STRATEGIES, assert_same_multiset

TRANSITIONS = {
    "truncate3-to-day+bucket4": (("truncate(3, id)",), ("day", "bucket(4, id)")),
    "day-to-day+bucket4": (("day",), ("day", "bucket(4, id)")),
    "bucket4-to-bucket8": (("bucket(4, id)",), ("bucket(8, id)",)),
    "truncate3-to-truncate5": (("truncate(3, id)",), ("truncate(5, id)",)),
    "bucket16-to-bucket1": (("bucket(16, id)",), ("bucket(1, id)",)),
}
HINTS = ("merge-on-read", "copy-on-write")
# the default run: every transition with merge-on-read (the raw IndexError) and one strategy per
# test (sync re-deploys, snapshot_replace windows); the rest of the cross product is `slow`
FAST_HINT = "merge-on-read"


def _spec(strategy: str, terms: tuple[str, ...], hint: str, *, delta: bool) -> DatasetSpec:
    return DatasetSpec(
        name="customers",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        delta=Delta(source="raw", watermark="seq") if delta else None,
        partition_by=terms,
        write_strategy_hint=hint,  # type: ignore[arg-type]
    )


def _cases(fast: str) -> list[Any]:
    return [
        pytest.param(
            transition,
            hint,
            strategy,
            id=f"{transition}-{hint}-{strategy}",
            marks=() if (strategy, hint) == (fast, FAST_HINT) else pytest.mark.slow,
        )
        for transition in TRANSITIONS
        for hint in HINTS
        for strategy in STRATEGIES
    ]


def _old_files_with_deletes(h: Harness, terms: tuple[str, ...], hint: str, *, delta: bool) -> None:
    """base() deployed under `terms`, then rows changed and deleted with `hint`: old-spec files
    (under merge-on-read: with delete files) for the evolved write to change."""
    upsert = _spec("snapshot_replace", terms, hint, delta=delta)
    h.write_and_check(upsert, base(), run_id="b0")
    h.write_and_check(upsert, customers(range(1, 4), version=9), run_id="b1")
    sync = _spec("sync", terms, hint, delta=delta)
    kept = pl.concat([customers(range(1, 4), version=9), base().filter(pl.col("id") > 5)])
    h.write_and_check(sync, kept, run_id="b2")


def _assert_spec_is(h: Harness, spec: DatasetSpec, terms: tuple[str, ...]) -> None:
    table = h.table(spec)
    live = [f for f in table.spec().fields if not isinstance(f.transform, VoidTransform)]
    declared = dataclasses.replace(spec, partition_by=terms).partition_terms
    assert [(table.schema().find_field(f.source_id).name, str(f.transform)) for f in live] == [
        (t.column, _iceberg(t.transform, t.size)) for t in declared
    ]


def _iceberg(transform: str, size: int | None) -> str:
    return f"{transform}[{size}]" if size is not None else transform


@pytest.mark.parametrize(("transition", "hint", "strategy"), _cases("sync"))
def test_every_strategy_redeploys_after_the_partition_spec_changes_and_reruns_safely(
    h: Harness, transition: str, hint: str, strategy: str
) -> None:
    old, new = TRANSITIONS[transition]
    _old_files_with_deletes(h, old, hint, delta=False)
    spec = _spec(strategy, new, hint, delta=False)
    data = redeploy_rows()
    _, exp1 = h.write_and_check(spec, data, run_id="r1")
    res2, _ = h.write_and_check(spec, data, run_id="r2")
    _assert_spec_is(h, spec, new)
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.raw(spec), exp1.table)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


@pytest.mark.parametrize(("transition", "hint", "strategy"), _cases("snapshot_replace"))
def test_every_strategy_writes_a_window_after_the_partition_spec_changes_and_reruns_safely(
    h: Harness, transition: str, hint: str, strategy: str
) -> None:
    old, new = TRANSITIONS[transition]
    _old_files_with_deletes(h, old, hint, delta=True)
    spec = _spec(strategy, new, hint, delta=True)
    data = window_rows()
    _, exp1 = h.write_and_check(spec, data, window=WINDOW, run_id="w1")
    res2, _ = h.write_and_check(spec, data, window=WINDOW, run_id="w2")
    _assert_spec_is(h, spec, new)
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.raw(spec), exp1.table)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


def _schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
        NestedField(4, "day", DateType(), required=False),
        NestedField(5, "seq", LongType(), required=False),
        identifier_field_ids=[1],
    )


def _empty_table(h: Harness, name: str, *, buckets: int, version: int = 2) -> None:
    """A table made with pyiceberg, bucketed by id, that no write has committed to."""
    h.catalog.create_namespace_if_not_exists(NS)
    h.catalog.create_table(
        (NS, name),
        schema=_schema(),
        partition_spec=PartitionSpec(
            PartitionField(1, 1000, BucketTransform(buckets), "id_bucket")
        ),
        properties={"format-version": str(version)},
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_first_deploy_onto_an_empty_table_made_under_another_spec_evolves_it(
    h: Harness, strategy: str
) -> None:
    _empty_table(h, "customers", buckets=4)
    spec = _spec(strategy, ("bucket(8, id)",), "merge-on-read", delta=False)
    res, _ = h.write_and_check(spec, base(), run_id="f1")
    assert (res.write_mode, res.first_deploy) == ("replace", True)
    h.write_and_check(spec, redeploy_rows(), run_id="f2")
    h.write_and_check(spec, redeploy_rows(), run_id="f3")
    _assert_spec_is(h, spec, ("bucket(8, id)",))


def test_a_changed_parameter_gets_a_fresh_field_name_and_changing_back_reuses_the_old_field(
    h: Harness,
) -> None:
    names = []
    want = None
    for n, terms in enumerate(
        [("bucket(4, id)",), ("bucket(8, id)",), ("bucket(4, id)",), ("bucket(8, id)", "day")]
    ):
        spec = _spec("snapshot_replace", terms, "merge-on-read", delta=False)
        data = customers(range(n * 10, n * 10 + 30), version=n)
        _, exp = h.write_and_check(spec, data, run_id=f"s{n}")
        want = exp.table
        table = h.table(spec)
        names.append([(f.name, f.field_id, str(f.transform)) for f in table.spec().fields])
    assert names == [
        [("id_bucket", 1000, "bucket[4]")],
        [("id_bucket_8", 1001, "bucket[8]")],
        [("id_bucket", 1000, "bucket[4]")],
        [("id_bucket_8", 1001, "bucket[8]"), ("day", 1002, "identity")],
    ]
    assert want is not None
    assert_same_multiset(h.raw(spec), want)
    # files of all three specs are live, each read by its own spec
    assert {t.file.spec_id for t in h.table(spec).scan().plan_files()} >= {1, 2}


def test_a_format_version_1_table_evolves_keeping_removed_fields_as_void(h: Harness) -> None:
    _empty_table(h, "v1", buckets=4, version=1)
    spec4 = dataclasses.replace(
        _spec("snapshot_replace", ("bucket(4, id)",), "auto", delta=False), name="v1"
    )
    spec8 = dataclasses.replace(spec4, partition_by=("bucket(8, id)",))
    h.write_and_check(spec4, base(), run_id="a")
    for run in ("b", "c"):
        h.write_and_check(spec8, redeploy_rows(), run_id=run)
    fields = h.table(spec8).spec().fields
    assert [(f.name, str(f.transform)) for f in fields] == [
        ("id_bucket", "void"),
        ("id_bucket_8", "bucket[8]"),
    ]
    h.write_and_check(spec4, customers(range(50, 70), version=4), run_id="d")
    _assert_spec_is(h, spec4, ("bucket(4, id)",))
