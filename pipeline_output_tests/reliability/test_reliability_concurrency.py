"""8 real writer processes against one Postgres and one catalog, on both arms.

- same keyed table: writers mix upsert (snapshot_replace) and append_new on overlapping keys;
- same keyless table: writers append (append_always) disjoint batches;
- different tables: each writer owns a table, strategies rotating.

Invariants: no key lost, no duplicate key, every stored value is one some writer wrote for that key,
each key inserted exactly once across all writers (sum of rows_inserted == distinct keys), every
appended row present exactly once. Reported: commit attempts that failed and were retried (counted
by wrapping the catalog's `commit_table` in each writer) and lock waits (`WriteResult.lock_wait_s`).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import polars as pl
import pytest

from pipeline_output_tests.processes import run_workers
from pipeline_output_tests.reliability.report import record

NS = "datasets"
WRITERS = 8
ROUNDS = 3


def _worker(w: int, props: dict[str, str], url: str, job: str, barrier: Any, out: Any) -> None:
    try:
        from pyiceberg.catalog.sql import SqlCatalog

        from pipeline_output import DatasetSpec, IcebergStore
        from pipeline_output.infra.locks import AdvisoryLock
        from pipeline_output.stores.postgres import PostgresStore

        catalog = SqlCatalog("default", **props)
        stats = {"attempts": 0, "failed": 0}
        real = catalog.commit_table

        def counting(*a: Any, **k: Any) -> Any:
            stats["attempts"] += 1
            try:
                return real(*a, **k)
            except Exception:
                stats["failed"] += 1
                raise

        catalog.commit_table = counting  # type: ignore[method-assign]
        ice = IcebergStore(catalog, NS, lock=AdvisoryLock(url))
        pg = PostgresStore(url)
        results = []
        for r in range(ROUNDS):
            if job == "same":
                strategy = "snapshot_replace" if w % 2 == 0 else "append_new"
                spec = DatasetSpec(name="shared", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
                ids = list(range(r * 500 + w * 40, r * 500 + w * 40 + 120))  # overlaps 2 neighbours
            elif job == "append":
                spec = DatasetSpec(name="events", strategy="append_always")
                ids = list(range((r * WRITERS + w) * 100, (r * WRITERS + w) * 100 + 100))
            else:
                strategy = ("snapshot_replace", "append_new", "append_always")[(w + r) % 3]
                spec = DatasetSpec(name=f"own{w}", primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
                ids = list(range(r * 50, r * 50 + 100))
            frame = pl.DataFrame(
                {"id": pl.Series(ids, dtype=pl.Int64), "v": [f"w{w}r{r}-{i}" for i in ids]}
            )
            barrier.wait(timeout=120)
            for arm, store in (("iceberg", ice), ("pg", pg)):
                res = store.write(spec, frame, run_id=f"w{w}r{r}")
                results.append(
                    {
                        "arm": arm,
                        "table": spec.name,
                        "inserted": res.rows_inserted,
                        "lock_wait_s": res.lock_wait_s,
                        "strategy": spec.strategy,
                    }
                )
        out.put((w, results, stats, None))
    except BaseException as exc:
        barrier.abort()
        out.put((w, [], {}, f"{type(exc).__name__}: {exc}"))


def _run(catalog: Any, url: str, job: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    props = {k: str(v) for k, v in catalog.properties.items()}
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(w, props, url, job, barrier, out)) for w in range(WRITERS)
    ]
    results: list[dict[str, Any]] = []
    totals = {"attempts": 0, "failed": 0}
    for _, res, stats, _ in run_workers(procs, out, timeout=300):
        results += res
        for k in totals:
            totals[k] += stats.get(k, 0)
    return results, totals


def _tables(catalog: Any, url: str, name: str) -> dict[str, pl.DataFrame]:
    from pipeline_output.stores.postgres import PostgresStore

    ice = pl.from_arrow(catalog.load_table((NS, name)).scan().to_arrow())
    assert isinstance(ice, pl.DataFrame)
    return {"iceberg": ice, "pg": PostgresStore(url).read(name)}


def _report(scenario: str, results: list[dict[str, Any]], totals: dict[str, int], t: float) -> None:
    waits = [r["lock_wait_s"] for r in results]
    record(
        scenario,
        writers=WRITERS,
        writes=len(results),
        commit_attempts=totals["attempts"],
        commit_retries=totals["failed"],
        lock_wait_max_s=round(max(waits), 3),
        lock_wait_total_s=round(sum(waits), 3),
        seconds=round(t, 1),
        rows_lost=0,
        duplicate_keys=0,
        command="pytest pipeline_output_tests/reliability/test_reliability_concurrency.py",
    )


def test_eight_writers_same_keyed_table_upsert_and_append_new(catalog: Any, pg_db_url: str) -> None:
    started = time.perf_counter()
    results, totals = _run(catalog, pg_db_url, "same")
    written: dict[int, set[str]] = {}
    for w in range(WRITERS):
        for r in range(ROUNDS):
            for i in range(r * 500 + w * 40, r * 500 + w * 40 + 120):
                written.setdefault(i, set()).add(f"w{w}r{r}-{i}")
    for arm, frame in _tables(catalog, pg_db_url, "shared").items():
        assert frame.height == len(written), f"{arm}: {frame.height} rows, {len(written)} keys"
        assert frame["id"].n_unique() == frame.height, f"{arm}: duplicate keys"
        assert set(frame["id"].to_list()) == set(written), f"{arm}: keys lost"
        for i, v in frame.select("id", "v").iter_rows():
            assert v in written[i], (arm, i, v)
        inserted = sum(r["inserted"] for r in results if r["arm"] == arm)
        assert inserted == len(written), f"{arm}: {inserted} inserts for {len(written)} keys"
    _report(
        "concurrency: 8 writers, one keyed table, upsert + append_new",
        results,
        totals,
        time.perf_counter() - started,
    )


@pytest.mark.slow
def test_eight_writers_append_to_one_table_nothing_lost_or_doubled(
    catalog: Any, pg_db_url: str
) -> None:
    started = time.perf_counter()
    results, totals = _run(catalog, pg_db_url, "append")
    want = WRITERS * ROUNDS * 100
    for arm, frame in _tables(catalog, pg_db_url, "events").items():
        assert frame.height == want, (arm, frame.height)
        assert frame["id"].n_unique() == want, arm
    _report(
        "concurrency: 8 writers appending to one table",
        results,
        totals,
        time.perf_counter() - started,
    )


@pytest.mark.slow
def test_eight_writers_eight_tables_rotating_strategies(catalog: Any, pg_db_url: str) -> None:
    started = time.perf_counter()
    results, totals = _run(catalog, pg_db_url, "own")
    for w in range(WRITERS):
        tables = _tables(catalog, pg_db_url, f"own{w}")
        assert tables["iceberg"].height == tables["pg"].height
        keys = set(range(ROUNDS * 50 + 50))
        for arm, frame in tables.items():
            assert set(frame["id"].to_list()) == keys, arm
    _report(
        "concurrency: 8 writers on 8 tables, rotating strategies",
        results,
        totals,
        time.perf_counter() - started,
    )
