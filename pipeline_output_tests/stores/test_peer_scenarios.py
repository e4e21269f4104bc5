"""Scenarios from peer projects' suites (pyiceberg's test_upsert, delta-rs' test_merge, dbt's
incremental tests) run on both arms: the defects they found (issue 16), each a regression test."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline_output import DatasetSpec, DuplicateKeys, IcebergStore, PostgresStore, Window
from pipeline_output.contract.spec import Delta
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.ledger import Ledger
from pipeline_output_tests.oracle import assert_same_multiset

NS = "datasets"
COUNTERS = ("rows_inserted", "rows_updated", "rows_deleted", "rows_preserved", "rows_total_after")


@pytest.fixture
def stores(catalog: Any, pg_db_url: str) -> dict[str, Any]:
    Ledger(pg_db_url).migrate()
    return {
        "iceberg": IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url)),
        "pg": PostgresStore(pg_db_url),
    }


def _commits(store: Any, spec: DatasetSpec) -> int:
    if isinstance(store, IcebergStore):
        table = store.load(spec)
        return len(table.snapshots()) if table is not None else 0
    return len(store.ledger.deploy_log.deploys(spec.name, arm="pg"))


def _counters(result: Any) -> tuple[int, ...]:
    return tuple(getattr(result, c) for c in COUNTERS)


def _rows(ids: list[int], seqs: list[int], tag: str) -> pl.DataFrame:
    return pl.DataFrame({"id": ids, "seq": seqs, "v": [f"{tag}{i}" for i in ids]})


def test_a_windowed_replace_replaces_a_computed_key_whose_row_lies_in_another_window(
    stores: dict[str, Any],
) -> None:
    """The legacy arm kept the moved key's old row (deleted 1, inserted 2: the key twice)."""
    spec = DatasetSpec(
        name="moved_keys",
        primary_key=("id",),
        strategy="replace",
        delta=Delta(source="events", watermark="seq"),
    )
    first = _rows([1, 2, 3], [10, 20, 30], "a")
    # id 3's row lies in (20, 30]; the re-run of (10, 20] computes it with seq 15
    rerun = _rows([2, 3], [20, 15], "b")
    expected = pl.concat([first.filter(pl.col("id") == 1), rerun])
    outcomes = {}
    for arm, store in stores.items():
        store.write(spec, first, window=Window(None, 30))
        for _ in range(2):  # a re-run of the window is safe: the same rows, the same counters
            result = store.write(spec, rerun, window=Window(10, 20))
            assert _counters(result) == (2, 0, 2, 1, 3), arm
            got = store.read(spec)
            assert_same_multiset(got, expected)
            assert got.get_column("id").is_unique().all(), f"{arm}: a key is stored twice"
        outcomes[arm] = _counters(result)
    assert outcomes["iceberg"] == outcomes["pg"]


@pytest.mark.parametrize("strategy", ["snapshot_replace", "sync"])
@pytest.mark.parametrize("arm", ["iceberg", "pg"])
def test_a_matching_write_into_a_target_holding_its_key_twice_is_refused_and_writes_nothing(
    stores: dict[str, Any], arm: str, strategy: str
) -> None:
    """pyiceberg refuses ("Target table has duplicate rows"); we updated both rows silently."""
    store = stores[arm]
    name = f"dupes_{strategy}_{arm}"
    appended = DatasetSpec(name=name, primary_key=("id",), strategy="append_always")
    store.write(appended, _rows([1, 2], [1, 2], "a"))
    store.write(appended, _rows([2], [2], "a"))  # the target now holds key 2 twice
    before, commits = store.read(appended), _commits(store, appended)
    matching = DatasetSpec(name=name, primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    with pytest.raises(DuplicateKeys) as err:
        store.write(matching, _rows([2, 3], [2, 3], "b"))
    message = str(err.value)
    assert f"'{name}'" in message and "2" in message and "nothing was written" in message
    assert_same_multiset(store.read(appended), before)
    assert _commits(store, appended) == commits
    # keys the write does not match may stay duplicated: an upsert of other keys succeeds
    if strategy == "snapshot_replace":
        result = store.write(matching, _rows([1, 3], [1, 3], "c"))
        assert (result.rows_updated, result.rows_inserted) == (1, 1)
        assert store.read(matching).filter(pl.col("id") == 2).height == 2


def test_an_upsert_into_an_iceberg_table_another_tool_appended_duplicates_to_is_refused(
    stores: dict[str, Any],
) -> None:
    store: IcebergStore = stores["iceberg"]
    spec = DatasetSpec(name="foreign_dupes", primary_key=("id",))
    store.write(spec, _rows([1, 2, 3], [1, 2, 3], "a"))
    table = store.load(spec)
    assert table is not None
    # another writer appends a second row for key 3 with plain pyiceberg
    table.append(_rows([3], [3], "z").to_arrow().cast(table.schema().as_arrow()))
    before = store.read(spec)
    with pytest.raises(DuplicateKeys, match=r"'foreign_dupes'.*more than once"):
        store.write(spec, _rows([3, 4], [3, 4], "b"))
    assert_same_multiset(store.read(spec), before)


@pytest.mark.parametrize("strategy", ["snapshot_replace", "sync"])
def test_an_upsert_that_moves_a_row_to_another_partition_leaves_one_row_per_key(
    stores: dict[str, Any], strategy: str
) -> None:
    """delta-rs' partitioned merge scenario: the matched row's partition column changes."""
    spec = DatasetSpec(
        name=f"moving_{strategy}",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        partition_by=("region", "bucket(2, id)"),
    )
    base = pl.DataFrame({"id": [1, 2, 3, 4], "region": ["eu", "eu", "us", "us"], "v": [1, 2, 3, 4]})
    batch = pl.DataFrame(
        {"id": [1, 2, 3, 4], "region": ["us", "eu", "eu", "us"], "v": [9, 2, 8, 4]}
    )
    for arm, store in stores.items():
        store.write(spec, base)
        for rerun in range(2):
            result = store.write(spec, batch)
            assert_same_multiset(store.read(spec), batch)
            assert (result.rows_updated, result.rows_inserted) == ((0, 0) if rerun else (2, 0)), arm
    table = stores["iceberg"].load(spec)
    assert table is not None
    for task in table.scan().plan_files():  # each file holds the one region it is filed under
        regions = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["region"])
        assert set(regions.column("region").to_pylist()) == {task.file.partition[0]}
