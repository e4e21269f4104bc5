"""`partition_by` (issue 16, item 2): parsed at definition, the Iceberg table partitioned as
declared (identity and Iceberg's transforms, one partition per data file), merges pruned by the
partitions of a key column, the spec evolved when the declaration changes, and the legacy arm's
contents unaffected (it has no physical layout)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet
import pytest
from pyiceberg.partitioning import partition_record_value

from pipeline_output import DatasetSpec, IcebergStore, InvalidSpec, PostgresStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.ledger import Ledger
from pipeline_output_tests.oracle import assert_same_multiset, expect

NS = "datasets"
START = datetime(2026, 1, 30, 22, tzinfo=UTC)


@pytest.fixture
def ice(catalog: Any, pg_db_url: str) -> IcebergStore:
    return IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))


def _frame(ids: Sequence[int], *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": list(ids),
            "region": [["eu", "us", "apac"][i % 3] for i in ids],
            "ts": [START + timedelta(hours=7 * i) for i in ids],
            "v": [i * 10 + version for i in ids],
        },
        schema={"id": pl.Int64, "region": pl.String, "ts": pl.Datetime("us", "UTC"), "v": pl.Int64},
    )


def _files(store: IcebergStore, spec: DatasetSpec) -> list[Any]:
    table = store.load(spec)
    assert table is not None
    return [task.file for task in table.scan().plan_files()]


def _partition_of_each_row(store: IcebergStore, spec: DatasetSpec) -> set[tuple[Any, ...]]:
    """(partition record, transformed row values) must agree for every row of every file."""
    table = store.load(spec)
    assert table is not None
    fields = table.spec().fields
    schema = table.schema()
    seen = set()
    for task in table.scan().plan_files():
        data = pa.parquet.read_table(task.file.file_path.removeprefix("file://"))
        record = tuple(task.file.partition[i] for i in range(len(fields)))
        for i, field in enumerate(fields):
            source = schema.find_field(field.source_id)
            transformed = field.transform.pyarrow_transform(source.field_type)(data[source.name])
            values = set(pl.from_arrow(transformed).unique().to_list())  # type: ignore[union-attr]
            assert len(values) == 1, f"file {task.file.file_path} holds several partitions"
            assert partition_record_value(field, values.pop(), schema) == record[i]
        seen.add(record)
    return seen


@pytest.mark.parametrize(
    "bad",
    ["bucket(x, id)", "foo(id)", "bucket(0, id)", "day(a b)", "truncate(3)", "day(1id)", ""],
)
def test_a_partition_term_that_is_not_one_is_refused_at_definition(bad: str) -> None:
    with pytest.raises(InvalidSpec, match=r"dataset 'p'.*partition_by"):
        DatasetSpec(name="p", primary_key=("id",), partition_by=(bad,))


def test_the_same_partition_field_twice_is_refused_at_definition() -> None:
    with pytest.raises(InvalidSpec, match="repeats"):
        DatasetSpec(name="p", partition_by=("day(ts)", "day( ts )"))


@pytest.mark.parametrize(
    ("terms", "transforms"),
    [
        (("region",), ["identity"]),
        (("day(ts)",), ["day"]),
        (("month(ts)", "bucket(2, id)"), ["month", "bucket[2]"]),
        (("bucket(4, id)",), ["bucket[4]"]),
        (("truncate(10, id)",), ["truncate[10]"]),
        (("hour(ts)", "truncate(1, region)"), ["hour", "truncate[1]"]),
    ],
    ids=lambda t: "+".join(t) if isinstance(t, tuple) else None,
)
def test_the_table_is_partitioned_as_declared_and_upserts_match_the_oracle(
    ice: IcebergStore, terms: tuple[str, ...], transforms: list[str]
) -> None:
    spec = DatasetSpec(name="parts", primary_key=("id",), partition_by=terms)
    first = _frame(range(40))
    ice.write(spec, first)
    table = ice.load(spec)
    assert table is not None
    assert [str(f.transform) for f in table.spec().fields] == transforms
    partitions = _partition_of_each_row(ice, spec)
    assert len(partitions) == len(_files(ice, spec)) > 1
    batch = pl.concat([_frame(range(30, 40), version=1), _frame(range(40, 50))])
    want = expect("snapshot_replace", first, batch, ["id"])
    for rerun in range(2):
        result = ice.write(spec, batch)
        assert_same_multiset(ice.read(spec), want.table)
        if rerun:
            assert result.noop
    _partition_of_each_row(ice, spec)
    # another engine's reader sees the same rows
    assert_same_multiset(pl.from_arrow(table.refresh().scan().to_arrow()), want.table)  # type: ignore[arg-type]


def test_an_upsert_into_a_table_partitioned_by_key_buckets_rewrites_only_touched_buckets(
    ice: IcebergStore,
) -> None:
    spec = DatasetSpec(name="bucketed", primary_key=("id",), partition_by=("bucket(8, id)",))
    base = _frame(range(400))
    ice.write(spec, base)
    assert len(_files(ice, spec)) == 8
    table = ice.load(spec)
    assert table is not None
    field = table.spec().fields[0]
    buckets = field.transform.pyarrow_transform(table.schema().find_field("id").field_type)(
        pa.array(list(range(400)), pa.int64())
    )
    in_one = [i for i, b in enumerate(buckets.to_pylist()) if b == buckets[0].as_py()][:5]
    changed = _frame(in_one, version=1)
    result = ice.write(spec, changed)
    assert (result.files_rewritten, result.rows_updated) == (1, 5)
    assert_same_multiset(ice.read(spec), expect("snapshot_replace", base, changed, ["id"]).table)


def test_changing_partition_by_evolves_the_spec_keeping_old_files_as_they_are(
    ice: IcebergStore,
) -> None:
    plain = DatasetSpec(name="evolving", primary_key=("id",), strategy="append_always")
    ice.write(plain, _frame(range(10)))
    bucketed = DatasetSpec(
        name="evolving",
        primary_key=("id",),
        strategy="append_always",
        partition_by=("bucket(2, id)",),
    )
    for _ in range(2):
        ice.write(bucketed, _frame(range(10, 20)))
    table = ice.load(bucketed)
    assert table is not None
    assert [f.name for f in table.spec().fields] == ["id_bucket"]
    specs = sorted({f.spec_id for f in _files(ice, bucketed)})
    assert specs == [0, table.spec().spec_id]  # the old file keeps spec 0
    want = pl.concat([_frame(range(10)), _frame(range(10, 20)), _frame(range(10, 20))])
    assert_same_multiset(ice.read(bucketed), want)
    ice.write(plain, _frame(range(20, 22)))  # saying nothing keeps the table's spec
    table = ice.load(plain)
    assert table is not None and [f.name for f in table.spec().fields] == ["id_bucket"]
    unpartitioned = DatasetSpec(
        name="evolving", primary_key=("id",), strategy="append_always", partition_by=()
    )
    ice.write(unpartitioned, _frame(range(22, 24)))  # and back to unpartitioned, said so
    table = ice.load(plain)
    assert table is not None and table.spec().fields == ()
    assert ice.read(plain).height == 34


def test_partition_by_a_column_the_compute_lacks_is_refused_and_nothing_is_written(
    ice: IcebergStore,
) -> None:
    spec = DatasetSpec(name="missing_part", primary_key=("id",), partition_by=("day(when)",))
    with pytest.raises(InvalidSpec, match=r"'missing_part'.*'when'"):
        ice.write(spec, _frame(range(3)))
    assert ice.load(spec) is None
    wrong = DatasetSpec(name="wrong_part", primary_key=("id",), partition_by=("day(region)",))
    with pytest.raises(InvalidSpec, match=r"'wrong_part'.*day.*'region'"):
        ice.write(wrong, _frame(range(3)))
    assert ice.load(wrong) is None


def test_the_legacy_arm_accepts_partition_by_and_stores_the_same_rows(
    ice: IcebergStore, pg_db_url: str
) -> None:
    Ledger(pg_db_url).migrate()
    pg = PostgresStore(pg_db_url)
    spec = DatasetSpec(name="both_parts", primary_key=("id",), partition_by=("day(ts)", "region"))
    for store in (ice, pg):
        store.write(spec, _frame(range(20)))
        store.write(spec, _frame(range(10, 30), version=1))
    assert_same_multiset(pg.read(spec), ice.read(spec))
