"""Writers that lose their lock, and writers outside the project (issue 17, items 3-5).

Each Iceberg scenario runs the project's writer in a separate process (spawned, its own catalog
handle and advisory lock) and stops it right before its commit — after it planned against the
table and wrote its files — while this process does what production does to it: terminates the
backend holding its writer lock (an idle-session killer, a pooler, a failover) and writes the same
keys as a second writer, or appends with plain pyiceberg (a writer that knows nothing of our lock).
Then the paused writer continues. Keys must never appear twice: the losing write fails with
`LockLost` / `WriteConflict` naming the dataset, and commits nothing. Plain appends, whose rows
do not depend on the table, still retry and both land.

The legacy arm's write is one transaction holding a transaction-level lock: a terminated backend
takes its rows and its lock with it, and the commit reports `LockLost` instead of a raw psycopg
error. The catalog engine the project builds survives a dropped control-plane connection.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.errors import LockLost
from pipeline_output.infra.locks import AdvisoryLock, lock_key
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.oracle import assert_same_multiset

NS = "datasets"
NAME = "keyed"
TIMEOUT_S = 120


def _rows(ids: list[int], tag: str) -> pl.DataFrame:
    return pl.DataFrame({"id": pl.Series(ids, dtype=pl.Int64), "v": [f"{tag}{i}" for i in ids]})


def _paused_writer(
    props: dict[str, str],
    lock_url: str,
    strategy: str,
    ids: list[int],
    reached: Any,
    go: Any,
    out: Any,
) -> None:
    """The project's writer in its own process, paused just before its catalog commit."""
    try:
        from pyiceberg.catalog.sql import SqlCatalog

        import pipeline_output.stores.iceberg.snapshot.commit as iceberg_module

        def pause(point: str) -> None:
            if point == "before_commit":
                reached.set()
                if not go.wait(TIMEOUT_S):
                    raise TimeoutError("the test never released the paused writer")

        iceberg_module.fault_injection = pause  # type: ignore[assignment]
        catalog = SqlCatalog("default", **props)
        store = IcebergStore(catalog, NS, lock=AdvisoryLock(lock_url))
        spec = DatasetSpec(NAME, primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
        res = store.write(spec, _rows(ids, "paused"))
        out.put(("ok", res.write_mode, res.rows_inserted))
    except BaseException as exc:
        reached.set()
        out.put(("error", type(exc).__name__, str(exc)))


class PausedWriter:
    """Start `_paused_writer`, wait until it is about to commit, then `finish()` it."""

    def __init__(self, catalog: Any, lock_url: str, strategy: str, ids: list[int]) -> None:
        ctx = mp.get_context("spawn")
        self.reached, self.go, self.out = ctx.Event(), ctx.Event(), ctx.Queue()
        props = {k: str(v) for k, v in catalog.properties.items()}
        self.proc = ctx.Process(
            target=_paused_writer,
            args=(props, lock_url, strategy, ids, self.reached, self.go, self.out),
        )
        self.proc.start()
        assert self.reached.wait(TIMEOUT_S), "the writer never reached its commit"
        try:
            early = self.out.get_nowait()
        except queue.Empty:
            early = None
        assert early is None, f"the writer failed before its commit: {early}"

    def finish(self) -> tuple[str, str, Any]:
        self.go.set()
        try:
            result: tuple[str, str, Any] = self.out.get(timeout=TIMEOUT_S)
        finally:
            self.proc.join(timeout=TIMEOUT_S)
            if self.proc.is_alive():
                self.proc.kill()
        return result


def _lock_backend(url: str, name: str) -> int:
    """The pid of the backend holding the advisory lock `name` (session or transaction level)."""
    unsigned = lock_key(name) & 0xFFFFFFFFFFFFFFFF
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = %s::oid AND objid = %s::oid",
            (unsigned >> 32, unsigned & 0xFFFFFFFF),
        ).fetchone()
    assert row is not None, f"nobody holds {name}"
    return int(row[0])


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row is not None and row[0] is True


def _table_rows(catalog: Any) -> pl.DataFrame:
    arrow = catalog.load_table(f"{NS}.{NAME}").scan().to_arrow()
    return pl.from_arrow(arrow).select("id")  # type: ignore[union-attr]


def _ids(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The oracle: every key written, exactly once."""
    return pl.concat([f.select("id") for f in frames]).unique().sort("id")


@pytest.fixture
def store(catalog: Any, pg_db_url: str) -> IcebergStore:
    return IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))


@pytest.mark.parametrize("strategy", ["append_new", "snapshot_replace"])
def test_a_writer_whose_lock_backend_is_terminated_fails_and_commits_nothing(
    store: IcebergStore, catalog: Any, pg_db_url: str, strategy: str
) -> None:
    spec = DatasetSpec(NAME, primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    first = _rows(list(range(1, 11)), "a")
    store.write(spec, first)
    new = list(range(8, 16))  # 8..10 exist, 11..15 are new
    paused = PausedWriter(catalog, pg_db_url, strategy, new)
    _terminate(pg_db_url, _lock_backend(pg_db_url, f"iceberg:{NS}.{NAME}"))

    # the second writer gets the lock at once and commits the same keys
    for _ in range(2):  # re-runs are safe
        second = store.write(spec, _rows(new, "second"))
    assert second.rows_inserted == 0
    status, kind, message = paused.finish()
    assert (status, kind) == ("error", "LockLost"), (status, kind, message)
    assert "lost" in message and f"{NS}.{NAME}" in message
    got = _table_rows(catalog)
    assert got.height == 15, f"a key was written twice: {got.height} rows for 15 keys"
    assert_same_multiset(got, _ids([first, _rows(new, "x")]))


def test_a_lost_lock_fails_the_write_even_when_nobody_else_wrote(
    store: IcebergStore, catalog: Any, pg_db_url: str
) -> None:
    spec = DatasetSpec(NAME, primary_key=("id",), strategy="append_new")
    store.write(spec, _rows(list(range(1, 11)), "a"))
    before = catalog.load_table(f"{NS}.{NAME}").current_snapshot().snapshot_id
    paused = PausedWriter(catalog, pg_db_url, "append_new", [11, 12])
    _terminate(pg_db_url, _lock_backend(pg_db_url, f"iceberg:{NS}.{NAME}"))
    status, kind, _ = paused.finish()
    assert (status, kind) == ("error", "LockLost")
    assert catalog.load_table(f"{NS}.{NAME}").current_snapshot().snapshot_id == before
    store.write(spec, _rows([11, 12], "retry"))  # the retry of the run succeeds
    assert _table_rows(catalog).height == 12


@pytest.mark.parametrize("strategy", ["append_new", "snapshot_replace"])
def test_an_outside_pyiceberg_append_between_plan_and_commit_is_a_write_conflict(
    store: IcebergStore, catalog: Any, pg_db_url: str, strategy: str
) -> None:
    """append_new, and an upsert whose keys are all new: both commit as a fast append."""
    spec = DatasetSpec(NAME, primary_key=("id",), strategy=strategy)  # type: ignore[arg-type]
    first = _rows(list(range(1, 11)), "a")
    for _ in range(2):
        store.write(spec, first)
    new = list(range(11, 16))
    paused = PausedWriter(catalog, pg_db_url, strategy, new)
    outside = catalog.load_table(f"{NS}.{NAME}")
    outside.append(_rows(new, "outside").to_arrow().cast(outside.schema().as_arrow()))

    status, kind, message = paused.finish()
    assert (status, kind) == ("error", "WriteConflict"), (status, kind, message)
    assert repr(NAME) in message and "nothing was committed" in message
    got = _table_rows(catalog)
    assert got.height == 15, f"a key was written twice: {got.height} rows for 15 keys"
    assert_same_multiset(got, _ids([first, _rows(new, "x")]))
    # the run's retry re-plans on the new state: nothing left to insert, still one row per key
    again = store.write(spec, _rows(new, "retry"))
    assert again.rows_inserted == 0 and _table_rows(catalog).height == 15


def test_plain_appends_still_retry_past_an_outside_append(
    store: IcebergStore, catalog: Any, pg_db_url: str
) -> None:
    spec = DatasetSpec(NAME, strategy="append_always")
    store.write(spec, _rows(list(range(1, 11)), "a"))
    store.write(spec, _rows([100], "b"))  # now a re-deploy: plain append
    paused = PausedWriter(catalog, pg_db_url, "append_always", [11, 12, 13])
    outside = catalog.load_table(f"{NS}.{NAME}")
    outside.append(_rows([20, 21], "outside").to_arrow().cast(outside.schema().as_arrow()))
    status, _, inserted = paused.finish()
    assert (status, inserted) == ("ok", 3)
    assert _table_rows(catalog).height == 10 + 1 + 2 + 3


def test_legacy_write_whose_backend_is_terminated_reports_lock_lost_and_keeps_keys_unique(
    pg_db_url: str,
) -> None:
    spec = DatasetSpec(NAME, primary_key=("id",), strategy="append_new")
    first = _rows(list(range(1, 11)), "a")
    writer = PostgresStore(pg_db_url)
    for _ in range(2):
        writer.write(spec, first)
    new = list(range(8, 16))
    pending = writer.begin_write(spec, _rows(new, "paused"))
    # the backend holding the pending write's transaction lock
    _terminate(pg_db_url, _lock_backend(pg_db_url, f"pg:{NAME}"))
    second = PostgresStore(pg_db_url).write(spec, _rows(new, "second"))
    assert second.rows_inserted == 5
    with pytest.raises(LockLost, match=repr(NAME)):
        pending.commit()
    got = writer.read(NAME).select("id")
    assert got.height == 15
    assert_same_multiset(got, _ids([first, _rows(new, "x")]))


def test_the_project_catalog_survives_a_dropped_control_plane_connection(
    settings_env: Any, pg_db_url: str
) -> None:
    """pool_pre_ping: after the server drops the catalog's pooled connections the next write
    works (it used to fail once with a raw sqlalchemy OperationalError)."""
    from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime

    reset_runtime()
    try:
        iceberg = get_runtime().iceberg
        spec = DatasetSpec(NAME, primary_key=("id",), strategy="snapshot_replace")
        iceberg.write(spec, _rows([1, 2], "a"))
        with psycopg.connect(pg_db_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        for _ in range(2):
            iceberg.write(spec, _rows([2, 3], "b"))
        assert sorted(iceberg.read(NAME)["id"].to_list()) == [1, 2, 3]
    finally:
        reset_runtime()
