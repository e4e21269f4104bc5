"""Concurrent writers of one Iceberg table: real processes, released together by a barrier.

Appends never conflict in Iceberg, so two unserialised "insert only new keys" writers could both
insert the same key; the store's advisory lock must make that impossible.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import warnings
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output_tests.processes import run_workers

NS = "datasets"
TABLE = "shared"
ROUNDS = 5


def _frame(ids: list[int], writer: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "writer": pl.Series([writer] * len(ids), dtype=pl.Int64),
            "name": [f"w{writer}-{i}" for i in ids],
        }
    )


def _worker(
    writer: int,
    catalog_name: str,
    catalog_props: dict[str, str],
    lock_url: str,
    strategy: str,
    rounds: list[list[int]],
    barrier: Any,
    out: Any,
) -> None:
    """One writer process: its own catalog handle, store and lock; one write per round."""
    try:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog(catalog_name, **catalog_props)
        store = IcebergStore(catalog, NS, lock=AdvisoryLock(lock_url))
        spec = DatasetSpec(name=TABLE, primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
        results = []
        for n, ids in enumerate(rounds):
            barrier.wait(timeout=120)
            res = store.write(spec, _frame(ids, writer), run_id=f"w{writer}-r{n}-{os.getpid()}")
            results.append(
                {
                    "mode": res.write_mode,
                    "inserted": res.rows_inserted,
                    "skipped": res.rows_skipped,
                    "snapshot": res.snapshot_id,
                }
            )
        out.put((writer, results, None))
    except BaseException as exc:  # report, and release the other writer from the barrier
        barrier.abort()
        out.put((writer, [], f"{type(exc).__name__}: {exc}"))


def _run_two_writers(
    fresh_catalog: Any, lock_url: str, strategy: str, rounds_a: list, rounds_b: list
) -> dict[int, list[dict]]:
    cat = fresh_catalog()
    props = {k: str(v) for k, v in cat.properties.items()}
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(w, cat.name, props, lock_url, strategy, rounds, barrier, out),
        )
        for w, rounds in ((0, rounds_a), (1, rounds_b))
    ]
    return {writer: res for writer, res, _ in run_workers(procs, out, timeout=240)}


def _rounds() -> tuple[list[list[int]], list[list[int]]]:
    """Round 0 races on a missing table (both first deploys); later rounds on an existing one.
    Each round the two writers' key sets overlap by a third."""
    a, b = [], []
    for r in range(4):
        base = r * 1000
        a.append(list(range(base, base + 600)))
        b.append(list(range(base + 300, base + 900)))
    return a, b


def _table(fresh_catalog: Any) -> pl.DataFrame:
    return pl.from_arrow(fresh_catalog().load_table((NS, TABLE)).scan().to_arrow())  # type: ignore[return-value]


def test_concurrent_append_new_writers_never_insert_the_same_key_twice(fresh_catalog, pg_db_url):
    rounds_a, rounds_b = _rounds()
    results = _run_two_writers(fresh_catalog, pg_db_url, "append_new", rounds_a, rounds_b)

    table = _table(fresh_catalog)
    expected = set().union(*map(set, rounds_a), *map(set, rounds_b))
    dupes = table.group_by("id").len().filter(pl.col("len") > 1)
    assert dupes.height == 0, f"keys inserted twice: {dupes.head(10).rows()}"
    assert set(table["id"].to_list()) == expected

    # Per round the two writers' inserts add up to the round's union, and their skips to the overlap.
    for r in range(len(rounds_a)):
        ins = results[0][r]["inserted"] + results[1][r]["inserted"]
        assert ins == len(set(rounds_a[r]) | set(rounds_b[r])), (r, results)
    # Round 0: exactly one writer created the table (replace), the other saw a re-deploy.
    assert sorted(x["mode"] for x in (results[0][0], results[1][0])) == ["append_new", "replace"]

    # Every committed write is exactly one snapshot, and each stored row came from one writer.
    committed = [x["snapshot"] for w in results.values() for x in w if x["snapshot"] is not None]
    snapshots = [s.snapshot_id for s in fresh_catalog().load_table((NS, TABLE)).snapshots()]
    assert sorted(committed) == sorted(snapshots)
    assert table.filter(pl.col("name") != pl.format("w{}-{}", "writer", "id")).height == 0


def test_concurrent_append_new_into_an_existing_table_never_duplicates_a_key(
    catalog, fresh_catalog, pg_db_url
):
    """The table exists before the race, so every round is a pure append_new race."""
    spec = DatasetSpec(name=TABLE, primary_key=("id",), strategy="append_new")
    IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url)).write(spec, _frame([-1], 9))
    a = [list(range(r * 100, r * 100 + 80)) for r in range(ROUNDS)]
    b = [list(range(r * 100 + 20, r * 100 + 100)) for r in range(ROUNDS)]
    results = _run_two_writers(fresh_catalog, pg_db_url, "append_new", a, b)
    table = _table(fresh_catalog)
    dupes = table.group_by("id").len().filter(pl.col("len") > 1)
    assert dupes.height == 0, f"keys inserted twice: {dupes.head(10).rows()}"
    assert table.height == 1 + ROUNDS * 100
    for r in range(ROUNDS):
        assert results[0][r]["inserted"] + results[1][r]["inserted"] == 100
        assert results[0][r]["skipped"] + results[1][r]["skipped"] == 60


def test_concurrent_upserts_lose_no_rows(fresh_catalog, pg_db_url):
    rounds_a, rounds_b = _rounds()
    rounds_a, rounds_b = rounds_a[:2], rounds_b[:2]
    _run_two_writers(fresh_catalog, pg_db_url, "snapshot_replace", rounds_a, rounds_b)
    table = _table(fresh_catalog)
    assert table.group_by("id").len().filter(pl.col("len") > 1).height == 0
    only_a = set().union(*map(set, rounds_a)) - set().union(*map(set, rounds_b))
    only_b = set().union(*map(set, rounds_b)) - set().union(*map(set, rounds_a))
    assert set(table["id"].to_list()) == set().union(*map(set, rounds_a), *map(set, rounds_b))
    writers = dict(table.select("id", "writer").rows())
    assert all(writers[i] == 0 for i in only_a)
    assert all(writers[i] == 1 for i in only_b)


def test_store_without_lock_warns_that_concurrent_writers_are_unsafe(catalog):
    store = IcebergStore(catalog, NS, lock=None)
    spec = DatasetSpec(name="unlocked", primary_key=("id",), strategy="append_new")
    with pytest.warns(Warning) as record:
        store.write(spec, _frame([1, 2, 3], 0))
    text = " ".join(str(w.message).lower() for w in record)
    assert "concurren" in text or "lock" in text


def test_store_with_default_lock_writes_without_warning(catalog, settings_env):
    store = IcebergStore(catalog, NS)
    spec = DatasetSpec(name="locked", primary_key=("id",), strategy="append_new")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = store.write(spec, _frame([1, 2, 3], 0))
    assert res.rows_total_after == 3


def test_a_held_lock_blocks_a_writer_until_released(catalog, pg_db_url):
    """A second AdvisoryLock user on the same name waits; a different name does not."""
    lock = AdvisoryLock(pg_db_url)
    other = AdvisoryLock(pg_db_url, timeout_s=0.5)
    from pipeline_output.errors import LockUnavailable

    with lock.hold("datasets.x"):
        with pytest.raises(LockUnavailable), other.hold("datasets.x"):
            pass
        with other.hold("datasets.y"):
            pass
    with other.hold("datasets.x"):
        pass
