"""Catalog requests per native write (issue 44): a process's first write of an existing table (a
fresh store) loads it once, under the writer lock, and commits once; its next write plans from the
table its commit left and only commits (the commit asserts that base; another engine's commit in
between fails it, and the write loads and plans again, once) — on pyiceberg's SQL catalog (calls
counted on the real catalog object) and on a real REST catalog (SeaweedFS; HTTP requests counted on
pyiceberg's own `requests` session). An append's first write loads once more, to pre-write its
files before the lock; the rows are checked against the frames written. On the
SQL catalog, the statements themselves: a load and a commit are one statement each, outside a
transaction, and opening the catalog is one probe that also finds the namespace."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pyarrow as pa
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.stores.iceberg.maintenance.health import table_health
from pipeline_output.stores.iceberg.table.catalog import ensure_namespace, open_catalog
from pipeline_output_tests.oracle import assert_same_multiset, expect
from pipeline_output_tests.seaweed import SeaweedFS, unique_namespace

SPEC = DatasetSpec(name="events", primary_key=("id",))


def rows(ids: range, value: str) -> pl.DataFrame:
    return pl.DataFrame({"id": list(ids), "v": [value] * len(ids)})


@contextmanager
def sql_calls(catalog: Any) -> Iterator[Counter[str]]:
    """`load_table` calls made by the project (not the ones pyiceberg's SQL `commit_table` makes
    inside itself) and `commit_table` calls on `catalog`, during the block."""
    counts: Counter[str] = Counter()
    load, commit = catalog.load_table, catalog.commit_table
    inside = [False]

    def counted_load(*args: Any, **kwargs: Any) -> Any:
        if not inside[0]:
            counts["load_table"] += 1
        return load(*args, **kwargs)

    def counted_commit(*args: Any, **kwargs: Any) -> Any:
        counts["commit_table"] += 1
        inside[0] = True
        try:
            return commit(*args, **kwargs)
        finally:
            inside[0] = False

    catalog.load_table, catalog.commit_table = counted_load, counted_commit
    try:
        yield counts
    finally:
        del catalog.load_table, catalog.commit_table


@contextmanager
def rest_requests(catalog: Any) -> Iterator[list[str]]:
    """Every HTTP request the REST catalog makes during the block (`METHOD path`)."""
    seen: list[str] = []

    def hook(response: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(f"{response.request.method} {response.request.path_url}")

    hooks = catalog._session.hooks["response"]
    hooks.append(hook)
    try:
        yield seen
    finally:
        hooks.remove(hook)


def write_twice(make_store: Callable[[], IcebergStore], counting: Callable[[], Any]) -> list[Any]:
    """Create the table, then count a fresh store's first write and that store's next one."""
    make_store().write(SPEC, rows(range(0, 100), "a"))
    store = make_store()  # a new process's store: it has not seen the table
    counted = []
    for n, frame in enumerate([rows(range(50, 150), "b"), rows(range(120, 200), "c")]):
        with counting() as calls:
            result = store.write(SPEC, frame)
        assert result.snapshot_id is not None, n
        counted.append(calls)
    expected = pl.concat(
        [rows(range(0, 50), "a"), rows(range(50, 120), "b"), rows(range(120, 200), "c")]
    )
    assert_same_multiset(store.read(SPEC), expected)
    return counted


def test_a_write_on_the_sql_catalog_loads_the_table_once_and_commits_once(
    catalog: Any, pg_db_url: str
) -> None:
    counted = write_twice(
        lambda: IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)),
        lambda: sql_calls(catalog),
    )
    first, then = counted
    assert first == Counter(load_table=1, commit_table=1), first  # nothing to pre-write
    # its next write plans from the table its commit left (under the writer lock): no load
    assert then == Counter(commit_table=1), then


def test_a_write_on_the_rest_catalog_makes_at_most_two_catalog_requests(
    seaweedfs: SeaweedFS, pg_db_url: str
) -> None:
    catalog = seaweedfs.catalog()
    namespace = unique_namespace("requests")
    catalog.create_namespace(namespace)
    counted = write_twice(
        lambda: IcebergStore(catalog, namespace, lock=AdvisoryLock(pg_db_url)),
        lambda: rest_requests(catalog),
    )
    first, then = counted
    # an upsert: a new process's first write loads the table once too (nothing to pre-write)
    assert len(first) == 2, first
    # the next one plans from the table its commit left (the response's metadata): commitTable
    assert len(then) == 1, then
    for requests in counted:
        assert sum(r.startswith("POST") for r in requests) == 1, requests  # the commit


def test_an_upsert_on_seaweedfs_sends_one_put_an_object_and_one_get_a_read_without_a_head(
    seaweedfs: SeaweedFS, pg_db_url: str
) -> None:
    """Through the project's FileIO (`file_io.ObjectStoreFileIO`): no multipart upload for a
    small file (pyarrow's default: POST, PUT, POST each), no HEAD + LIST before a data file, no
    HEAD for a new manifest's length; metadata and the small target file read with one GET each,
    no HEAD first. Counted by the server."""
    catalog = seaweedfs.catalog()
    namespace = unique_namespace("s3requests")
    catalog.create_namespace(namespace)
    make = lambda: IcebergStore(catalog, namespace, lock=AdvisoryLock(pg_db_url))  # noqa: E731
    make().write(SPEC, rows(range(0, 20_000), "a"))
    store = make()
    before = seaweedfs.s3_requests()
    with rest_requests(catalog) as seen:
        result = store.write(SPEC, rows(range(19_000, 21_000), "b"))
    sent = seaweedfs.s3_requests() - before
    assert (result.rows_updated, result.rows_inserted) == (1_000, 1_000)
    assert result.merge_path.startswith("key_scan (1 candidate file(s), object-store"), result
    assert len(seen) == 2, seen  # one loadTable, one commit
    # the new objects (data file, its delete file, manifests, manifest list): one PUT each
    assert sent["POST"] == 0 and sent["LIST"] == 0, sent
    assert 1 <= sent["PUT"] <= 5, sent
    # reads: the target file whole, one GET without pyarrow's HEAD first (`file_io.read_whole`);
    # the manifest list and manifest this process uploaded are read from what it sent; no HEAD
    # (SeaweedFS counts one as a GET) for a new object's length, nor to check the new objects
    # still exist: the lock the write holds, verified right before the swap, covers them
    # (`commit.py`, "Writes in flight")
    assert sent["GET"] == 1, sent
    assert sum(sent.values()) <= 6, sent
    # the checks after a write read the new snapshot's manifests and list's length from what
    # was sent: only `metadata.json`'s length is asked (a HEAD: SeaweedFS counts it as a GET)
    before = seaweedfs.s3_requests()
    health = table_health(catalog.load_table((namespace, SPEC.name)))
    assert health.records == 21_000 and health.manifest_bytes > 0, health
    assert (seaweedfs.s3_requests() - before)["GET"] == 1
    expected = pl.concat([rows(range(0, 19_000), "a"), rows(range(19_000, 21_000), "b")])
    assert_same_multiset(store.read(SPEC), expected)


@contextmanager
def catalog_statements(target: Any = Engine) -> Iterator[list[tuple[str, bool]]]:
    """The statements on the catalog's tables sent during the block by an engine (every engine:
    `Engine`) or by a psycopg session of the process (the catalog's plain statements run on
    the pooled sessions: `FlatSqlCatalog._po_run`), each with whether it ran outside a
    transaction (autocommit: no BEGIN / COMMIT round trips around it)."""
    seen: list[tuple[str, bool]] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "iceberg_" in statement:
            seen.append(
                (statement.split()[0].upper(), bool(conn.connection.dbapi_connection.autocommit))
            )

    real = psycopg.Connection.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        statement = query if isinstance(query, str) else query.as_string(self)
        if "iceberg_" in statement and "sqlalchemy" not in type(self).__module__:
            seen.append((statement.split()[0].upper(), bool(self.autocommit)))
        return real(self, query, *args, **kwargs)

    event.listen(target, "before_cursor_execute", before)
    psycopg.Connection.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Connection.execute = real  # type: ignore[method-assign]
        event.remove(target, "before_cursor_execute", before)


def test_a_fresh_stores_first_append_loads_once_more_to_prewrite_its_files(
    catalog: Any, pg_db_url: str
) -> None:
    appends = DatasetSpec(name="appended", strategy="append_always")
    make = lambda: IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))  # noqa: E731
    make().write(appends, rows(range(0, 10), "a"))
    store = make()
    with sql_calls(catalog) as first:
        store.write(appends, rows(range(10, 20), "b"))
        prepared = store.prepare(appends, rows(range(20, 30), "c"))
    assert first == Counter(load_table=2, commit_table=1), first
    assert prepared.files_ready == 1  # written before the lock (the table as last written)
    prepared.discard()
    assert store.read(appends).height == 20


def test_a_write_on_the_sql_catalog_is_one_load_and_one_update_outside_transactions(
    catalog: Any, pg_db_url: str
) -> None:
    counted = write_twice(
        lambda: IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)),
        lambda: catalog_statements(catalog.engine),
    )
    first, then = counted
    assert first == [("SELECT", True), ("UPDATE", True)], first
    assert then == [("UPDATE", True)], then  # no load, no reload inside the commit


def test_the_sql_catalogs_statements_share_the_writes_lock_session_and_its_engine_never_connects(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """On a psycopg database the catalog's probe, lookups and swaps run on the process's pooled
    control-plane sessions — a write's swap on the session holding its lock —: a fresh handle
    and store write twice on one session, and the handle's SQLAlchemy engine never connects
    (its first connect is ~5 ms of queries before a process's first write)."""
    engine_connects: list[object] = []
    sessions: set[int] = set()

    def connected(*_: Any) -> None:
        engine_connects.append(_)

    real = psycopg.Connection.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sessions.add(id(self))
        return real(self, query, *args, **kwargs)

    IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)).write(
        SPEC, rows(range(0, 100), "a")
    )  # created by another handle (a create goes through pyiceberg's engine)
    event.listen(Engine, "connect", connected)
    try:
        fresh = fresh_catalog()
        store = IcebergStore(fresh, "datasets", lock=AdvisoryLock(pg_db_url))
        psycopg.Connection.execute = execute  # type: ignore[method-assign]
        try:
            for frame in [rows(range(50, 150), "b"), rows(range(120, 200), "c")]:
                store.write(SPEC, frame)
        finally:
            psycopg.Connection.execute = real  # type: ignore[method-assign]
    finally:
        event.remove(Engine, "connect", connected)
    assert engine_connects == []
    assert len(sessions) == 1, sessions
    expected = pl.concat(
        [rows(range(0, 50), "a"), rows(range(50, 120), "b"), rows(range(120, 200), "c")]
    )
    assert_same_multiset(store.read(SPEC), expected)
    assert_same_multiset(
        pl.from_arrow(catalog.load_table(("datasets", SPEC.name)).scan().to_arrow()), expected
    )  # type: ignore[arg-type]


def test_opening_the_sql_catalog_is_one_probe_that_also_finds_the_namespace(
    fresh_catalog: Callable[[], Any], pg_db_url: str, catalog_warehouse: str
) -> None:
    fresh_catalog().create_namespace("datasets")  # an empty database: pyiceberg creates tables
    props = {
        "type": "sql",
        "uri": to_sqlalchemy_url(pg_db_url, driver="psycopg"),
        "warehouse": catalog_warehouse,
    }
    with catalog_statements() as seen:
        opened = open_catalog("default", props, namespace="datasets", where=str)
        ensure_namespace(opened, "datasets")  # the probe saw it: no second check
    try:
        assert seen == [("SELECT", True)], seen
        assert opened.knows_namespace("datasets")
        other = open_catalog("default", props, namespace="other", where=str)  # created
        assert fresh_catalog().namespace_exists("other")
        other.engine.dispose()
    finally:
        opened.engine.dispose()


def metadata_files(table: Any) -> list[str]:
    folder = table.metadata.location.removeprefix("file://") + "/metadata"
    return sorted(str(p) for p in Path(folder).glob("*.metadata.json"))


def test_a_commit_from_a_table_another_writer_moved_is_pyicebergs_own(
    fresh_catalog: Callable[[], Any],
) -> None:
    catalog = fresh_catalog()
    catalog.create_namespace("datasets")
    table = catalog.create_table("datasets.t", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    stale = catalog.load_table("datasets.t")
    fresh_catalog().load_table("datasets.t").append(pa.table({"id": pa.array([2], pa.int64())}))
    # main moved under it: pyiceberg's own commit (its append retries on the current table)
    stale.append(pa.table({"id": pa.array([3], pa.int64())}))
    # a change that does not depend on main is applied to the current metadata, as pyiceberg's
    stale.transaction().set_properties(owner="x").commit_transaction()
    current = fresh_catalog().load_table("datasets.t")
    assert current.properties["owner"] == "x"
    assert sorted(current.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    # every metadata file is one the table lists: the one staged against the stale table is gone
    assert len(metadata_files(current)) == len(current.metadata.metadata_log) + 1


def catalog_calls(backend: str, catalog: Any) -> Any:
    """The project's catalog calls during a block: `sql_calls` or the REST requests, both as
    a Counter of `load` / `commit`."""

    @contextmanager
    def counting() -> Iterator[Counter[str]]:
        counts: Counter[str] = Counter()
        if backend == "sql":
            with sql_calls(catalog) as calls:
                yield counts
            counts.update(
                {"load": calls["load_table"], "commit": calls["commit_table"]} if calls else {}
            )
            return
        with rest_requests(catalog) as seen:
            yield counts
        for request in seen:
            method, path = request.split(" ", 1)
            assert "/tables/" in path, request
            counts[{"GET": "load", "POST": "commit"}[method]] += 1

    return counting


@pytest.mark.both_catalogs
@pytest.mark.rest_default
def test_another_engines_commit_between_two_writes_is_seen_and_the_write_planned_again(
    catalog: Any, fresh_catalog: Callable[[], Any], catalog_backend: str, pg_db_url: str
) -> None:
    """The second write plans from the table the first one's commit left; a pyiceberg writer
    outside the project's lock appends keys in between: the second write's commit is refused
    (its base moved), it loads the table and plans the whole upsert again — no duplicate key,
    the appended rows updated — and the next writes load until one finds nobody else wrote."""
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    counting = catalog_calls(catalog_backend, catalog)
    store.write(SPEC, rows(range(0, 100), "a"))
    with counting() as first:
        store.write(SPEC, rows(range(50, 150), "b"))
    assert first == Counter(commit=1), first
    outside = fresh_catalog().load_table(("datasets", SPEC.name))  # another engine, no lock
    appended = rows(range(150, 160), "x")
    outside.append(appended.to_arrow().cast(outside.schema().as_arrow()))
    batch = rows(range(155, 200), "c")
    with counting() as second:
        result = store.write(SPEC, batch)
    # refused commit, the reload, the commit of the new plan
    assert second == Counter(load=1, commit=2), second
    assert (result.rows_updated, result.rows_inserted) == (5, 40), result
    target = pl.concat([rows(range(0, 50), "a"), rows(range(50, 150), "b"), appended])
    assert_same_multiset(store.read(SPEC), expect("snapshot_replace", target, batch, ["id"]).table)
    # another writer was seen: the next write loads first; it finds the table as this process
    # left it, so the one after plans from memory again
    with counting() as third:
        store.write(SPEC, rows(range(0, 10), "d"))
    with counting() as fourth:
        store.write(SPEC, rows(range(10, 20), "e"))
    assert (third, fourth) == (Counter(load=1, commit=1), Counter(commit=1)), (third, fourth)
    assert store.read(SPEC).height == 200


@pytest.mark.both_catalogs
@pytest.mark.rest_default
def test_another_engines_schema_change_between_two_writes_is_seen_and_the_write_planned_again(
    catalog: Any, fresh_catalog: Callable[[], Any], catalog_backend: str, pg_db_url: str
) -> None:
    """A column added outside the project's lock moves no snapshot: the write planned from memory
    asserts the schema it planned on, so its commit is refused, and it plans again on the new
    schema (the new column kept, null in the written rows)."""
    from pyiceberg.types import StringType

    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    counting = catalog_calls(catalog_backend, catalog)
    store.write(SPEC, rows(range(0, 100), "a"))
    outside = fresh_catalog().load_table(("datasets", SPEC.name))
    with outside.update_schema() as update:
        update.add_column("w", StringType())
    batch = rows(range(50, 150), "b")
    with counting() as calls:
        result = store.write(SPEC, batch)
    assert calls == Counter(load=1, commit=2), calls
    assert (result.rows_updated, result.rows_inserted) == (50, 50), result
    table = fresh_catalog().load_table(("datasets", SPEC.name))
    assert [f.name for f in table.schema().fields] == ["id", "v", "w"]
    expected = pl.concat([rows(range(0, 50), "a"), batch]).with_columns(w=pl.lit(None, pl.String))
    assert_same_multiset(store.read(SPEC), expected)


def test_another_engines_property_change_between_two_writes_is_seen_on_the_sql_catalog(
    catalog: Any, fresh_catalog: Callable[[], Any], catalog_backend: str, pg_db_url: str
) -> None:
    """A table property set outside the project's lock moves no snapshot, schema or spec: on the
    SQL catalog the write planned from memory still asserts the very metadata version it
    planned on (`AssertUnchanged`), so its commit is refused and it plans again, with the new
    property (here a smaller target file size: the rewritten rows cut into several files)."""
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    counting = catalog_calls(catalog_backend, catalog)
    store.write(SPEC, rows(range(0, 20_000), "a"))
    outside = fresh_catalog().load_table(("datasets", SPEC.name))
    with outside.transaction() as tx:
        tx.set_properties({"write.target-file-size-bytes": "120000"})
    batch = rows(range(0, 20_000), "b")  # every row changed: the file rewritten
    with counting() as calls:
        result = store.write(SPEC, batch)
    assert calls == Counter(load=1, commit=2), calls
    assert result.rows_updated == 20_000, result
    table = fresh_catalog().load_table(("datasets", SPEC.name))
    assert len(list(table.scan().plan_files())) >= 2
    assert table.properties["write.target-file-size-bytes"] == "120000"
    assert_same_multiset(store.read(SPEC), batch)


@pytest.mark.both_catalogs
def test_a_write_planned_from_memory_that_changes_nothing_checks_the_table_did_not_move(
    catalog: Any, fresh_catalog: Callable[[], Any], catalog_backend: str, pg_db_url: str
) -> None:
    """A plan that commits nothing asserts nothing: when it was made from memory, the write
    loads the table to check nobody committed since — here another engine deleted a row, so the
    "nothing changes" plan was stale: the write plans again and puts the row back."""
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    counting = catalog_calls(catalog_backend, catalog)
    base = rows(range(0, 100), "a")
    store.write(SPEC, base)
    with counting() as unchanged:
        assert store.write(SPEC, base).snapshot_id is None  # nothing changes: nothing committed
    assert unchanged == Counter(load=1), unchanged  # the check that nobody committed since
    fresh_catalog().load_table(("datasets", SPEC.name)).delete("id == 5")  # another engine
    with counting() as calls:
        result = store.write(SPEC, base)
    assert result.rows_inserted == 1, result
    assert calls["load"] == 2 and calls["commit"] == 1, calls
    assert_same_multiset(store.read(SPEC), base)


DAILY = DatasetSpec(name="daily", primary_key=("id",), strategy="replace")


def day_part(day: int) -> tuple[Any, pl.DataFrame]:
    """Day `day` of January 2024 as a partition slice, and its rows (ids `day*100 + 0..9`)."""
    from datetime import UTC, date, datetime, timedelta

    from pipeline_output.contract.slices import PartitionSlice, TimeRange

    start = datetime(2024, 1, day, tzinfo=UTC)
    part = PartitionSlice(
        start.date().isoformat(), (TimeRange("day", start, start + timedelta(days=1)),)
    )
    ids = [day * 100 + i for i in range(10)]
    frame = pl.DataFrame(
        {"id": pl.Series(ids, dtype=pl.Int64), "day": [date(2024, 1, day)] * len(ids)}
    )
    return part, frame


def partition_run(store: IcebergStore, day: int, frame: pl.DataFrame | None = None) -> Any:
    """One Dagster partition run of `DAILY` (`write_range` with one partition)."""
    part, rows_of_day = day_part(day)
    rows_in = rows_of_day if frame is None else frame
    ranged = store.write_range(DAILY, iter([(part, lambda: rows_in)]))
    assert ranged.stopped is None and len(ranged.results) == 1
    return ranged.results[0][1]


def data_files_on_disk_and_in_history(table: Any) -> tuple[set[str], set[str]]:
    """The table's Parquet files on disk, and the data files some snapshot of it reads: a file
    on disk that no snapshot reads is one a refused or abandoned attempt left behind."""
    folder = Path(table.metadata.location.removeprefix("file://")) / "data"
    on_disk = {str(p) for p in folder.rglob("*.parquet")}
    history = {
        t.file.file_path.removeprefix("file://")
        for snap in table.snapshots()
        for t in table.scan(snapshot_id=snap.snapshot_id).plan_files()
    }
    return on_disk, history


def day_2_replaced_theirs_kept_no_file_left(
    store: IcebergStore, catalog: Any, theirs: pl.DataFrame, mine: pl.DataFrame
) -> None:
    """The table is day 1, the other engine's rows outside day 2 and `mine` as day 2 (the oracle:
    plain polars over the inputs), and no data file of a refused attempt is left on disk."""
    expected = pl.concat([day_part(1)[1], theirs.filter(pl.col("day") != date(2024, 1, 2)), mine])
    assert_same_multiset(store.read(DAILY), expected)
    table = catalog.load_table(("datasets", DAILY.name))
    on_disk, history = data_files_on_disk_and_in_history(table)
    assert on_disk <= history, on_disk - history


def test_a_second_partition_run_in_a_process_loads_no_table(catalog: Any, pg_db_url: str) -> None:
    """A process's next partition run plans from the table its last commit left (under the
    writer lock, the commit asserting that base): one commit, no table load."""
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    partition_run(store, 1)
    with sql_calls(catalog) as second:
        partition_run(store, 2)
    assert second == Counter(commit_table=1), second
    # a re-run of day 1 replaces its slice; its key 205 moves from day 2 into it (one key)
    moved = pl.DataFrame({"id": [205], "day": [date(2024, 1, 1)]})
    day1 = pl.concat([day_part(1)[1].head(4), moved])
    with sql_calls(catalog) as again:
        result = partition_run(store, 1, day1)
    assert again == Counter(commit_table=1), again
    assert (result.rows_inserted, result.rows_deleted) == (5, 11), result
    expected = pl.concat([day1, day_part(2)[1].filter(pl.col("id") != 205)])
    assert_same_multiset(store.read(DAILY), expected)


def test_another_engines_commit_between_two_partition_runs_is_seen_and_the_run_planned_again(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """A pyiceberg writer outside the project's lock appends rows to days 2 and 3 between two
    partition runs: the second run's commit (planned from memory) is refused, it loads the table
    and replaces day 2's slice again on it — the other engine's day-2 rows replaced, its day-3
    rows kept, nothing lost — and no file of the refused attempt is left over."""
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    partition_run(store, 1)
    partition_run(store, 2)
    outside = fresh_catalog().load_table(("datasets", DAILY.name))  # another engine, no lock
    theirs = pl.concat([day_part(2)[1].head(3), day_part(3)[1]]).with_columns(id=pl.col("id") + 50)
    outside.append(theirs.to_arrow().cast(outside.schema().as_arrow()))
    mine = day_part(2)[1].tail(5)
    with sql_calls(catalog) as calls:
        result = partition_run(store, 2, mine)
    # the refused commit, the reload, the commit of the new plan
    assert calls == Counter(load_table=1, commit_table=2), calls
    assert (result.rows_inserted, result.rows_deleted) == (5, 13), result
    target = pl.concat([day_part(1)[1], day_part(2)[1], theirs])
    days = pl.col("day")
    expected = pl.concat([target.filter(days != pl.date(2024, 1, 2)), mine])
    assert_same_multiset(store.read(DAILY), expected)
    table = fresh_catalog().load_table(("datasets", DAILY.name))
    live = {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
    on_disk, history = data_files_on_disk_and_in_history(table)
    assert live <= on_disk and on_disk <= history, on_disk - history


def test_a_fresh_processs_partition_run_loads_the_table_once(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """A process's first partition run of a table another process wrote loads it once, before
    the writer lock, writes its files against it and commits on that table under the lock (the
    commit asserting it): no second load under the lock."""
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 1)
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 2)
    fresh = fresh_catalog()  # a new process's catalog handle and store
    store = IcebergStore(fresh, "datasets", lock=AdvisoryLock(pg_db_url))
    mine = day_part(2)[1].head(4)
    with sql_calls(fresh) as calls:
        result = partition_run(store, 2, mine)
    assert calls == Counter(load_table=1, commit_table=1), calls
    assert (result.rows_inserted, result.rows_deleted) == (4, 10), result
    assert_same_multiset(store.read(DAILY), pl.concat([day_part(1)[1], mine]))


def test_a_commit_between_a_fresh_runs_load_and_its_lock_is_seen_and_the_run_planned_again(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """Another engine appends to days 2 and 3 after a fresh process's partition run loaded the
    table and before it takes the writer lock: the commit planned on the first load is refused,
    the run loads the table under the lock and replaces day 2's slice on it — the other engine's
    day-2 rows replaced, its day-3 rows kept — and no file of the refused attempt is left."""
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 1)
    fresh = fresh_catalog()
    store = IcebergStore(fresh, "datasets", lock=AdvisoryLock(pg_db_url))
    theirs = pl.concat([day_part(2)[1].head(3), day_part(3)[1]]).with_columns(id=pl.col("id") + 50)
    loaded = store.tables.load

    def load_then_another_engine_commits(spec: Any) -> Any:
        table = loaded(spec)
        if not theirs_written:
            outside = fresh_catalog().load_table(("datasets", DAILY.name))  # no lock
            outside.append(theirs.to_arrow().cast(outside.schema().as_arrow()))
            theirs_written.append(True)
        return table

    theirs_written: list[bool] = []
    store.tables.load = load_then_another_engine_commits  # type: ignore[method-assign]
    mine = day_part(2)[1].tail(5)
    with sql_calls(fresh) as calls:
        result = partition_run(store, 2, mine)
    # the first load, the refused commit, the load under the lock, the commit of the new plan
    assert calls == Counter(load_table=2, commit_table=2), calls
    assert (result.rows_inserted, result.rows_deleted) == (5, 3), result
    day_2_replaced_theirs_kept_no_file_left(store, fresh_catalog(), theirs, mine)


def test_a_partition_run_given_its_table_loaded_ahead_loads_it_no_more(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """A fresh process's partition run handed the table loaded while its partition computed
    (`IcebergStore.load_ahead`, the Dagster IO manager's way) makes no load of its own: one
    commit, on that table, its slice replaced; run twice, the same table."""
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 1)
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 2)
    mine = day_part(2)[1].head(4)
    for _ in range(2):  # a re-run is the same write
        fresh = fresh_catalog()
        store = IcebergStore(fresh, "datasets", lock=AdvisoryLock(pg_db_url))
        with sql_calls(fresh) as ahead_calls:
            ahead = store.load_ahead(DAILY)
        with sql_calls(fresh) as calls:
            part, _ = day_part(2)
            ranged = store.write_range(DAILY, iter([(part, lambda: mine)]), ahead=ahead)
        assert ahead_calls == Counter(load_table=1), ahead_calls
        assert calls == Counter(commit_table=1), calls
        assert ranged.results[0][1].rows_inserted == 4
        assert_same_multiset(store.read(DAILY), pl.concat([day_part(1)[1], mine]))


def test_a_partition_run_given_its_table_loaded_ahead_converts_its_schema_no_more(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str, monkeypatch: Any
) -> None:
    """The schemas a run's files are written with (Arrow with field ids, and polars) are
    converted when the table is loaded ahead, beside the compute, not by the run after it; the
    files are written with them: the slice replaced, the table equal to the oracle, twice."""
    from pipeline_output.stores.iceberg.write import range_write

    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 1)
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 2)
    real = range_write._schemas
    converted: list[str] = []

    def schemas(schema: Any) -> Any:
        converted.append("converted")
        return real(schema)

    monkeypatch.setattr(range_write, "_schemas", schemas)
    mine = day_part(2)[1].tail(3)
    for _ in range(2):  # a re-run is the same write
        store = IcebergStore(fresh_catalog(), "datasets", lock=AdvisoryLock(pg_db_url))
        ahead = store.load_ahead(DAILY)
        assert converted == ["converted"], converted
        part, _ = day_part(2)
        ranged = store.write_range(DAILY, iter([(part, lambda: mine)]), ahead=ahead)
        assert converted == ["converted"], converted  # none by the run
        assert ranged.results[0][1].rows_inserted == 3
        assert_same_multiset(store.read(DAILY), pl.concat([day_part(1)[1], mine]))
        converted.clear()


def test_a_commit_after_the_table_was_loaded_ahead_is_seen_and_the_run_planned_again(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str
) -> None:
    """Another engine appends to days 2 and 3 after the table was loaded ahead and before the
    run takes its writer lock: the commit planned on the table loaded ahead is refused, the run
    loads the table under the lock and replaces day 2's slice on it — the other engine's day-2
    rows replaced, its day-3 rows kept — and no file of the refused attempt is left."""
    partition_run(IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url)), 1)
    fresh = fresh_catalog()
    store = IcebergStore(fresh, "datasets", lock=AdvisoryLock(pg_db_url))
    ahead = store.load_ahead(DAILY)
    outside = fresh_catalog().load_table(("datasets", DAILY.name))  # another engine, no lock
    theirs = pl.concat([day_part(2)[1].head(3), day_part(3)[1]]).with_columns(id=pl.col("id") + 50)
    outside.append(theirs.to_arrow().cast(outside.schema().as_arrow()))
    mine = day_part(2)[1].tail(5)
    with sql_calls(fresh) as calls:
        part, _ = day_part(2)
        ranged = store.write_range(DAILY, iter([(part, lambda: mine)]), ahead=ahead)
    # the refused commit, the load under the lock, the commit of the new plan
    assert calls == Counter(load_table=1, commit_table=2), calls
    result = ranged.results[0][1]
    assert (result.rows_inserted, result.rows_deleted) == (5, 3), result
    day_2_replaced_theirs_kept_no_file_left(store, fresh_catalog(), theirs, mine)


TWO_RUNS_IN_A_FRESH_PROCESS = """
import sys
from pipeline_output import IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
from pipeline_output_tests.stores.test_catalog_requests import partition_run

uri, warehouse, pg = sys.argv[1:]
store = IcebergStore(FlatSqlCatalog("default", uri=uri, warehouse=warehouse), "datasets",
                     lock=AdvisoryLock(pg))
partition_run(store, 1)
partition_run(store, 2)  # planned from memory: the commit asserts its base
print("pyiceberg.catalog.rest" in sys.modules, "requests" in sys.modules)
"""


def test_a_process_committing_on_the_sql_catalog_never_imports_the_rest_client(
    catalog: Any, pg_db_url: str, catalog_warehouse: str
) -> None:
    """Whether a commit may stage its base's assertion depends on the catalog being REST; a
    process with only the SQL catalog does not import pyiceberg's REST catalog (and `requests`,
    urllib3: ~0.2 s of imports in its first asserted commit) to find it is not one."""
    uri = to_sqlalchemy_url(pg_db_url, driver="psycopg")
    done = subprocess.run(
        [sys.executable, "-c", TWO_RUNS_IN_A_FRESH_PROCESS, uri, catalog_warehouse, pg_db_url],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["False", "False"], done.stdout


def _as_read(entry: Any) -> tuple[Any, ...]:
    """What a planner or a commit uses of a manifest entry."""
    f = entry.data_file
    return (
        entry.status,
        entry.snapshot_id,
        entry.sequence_number,
        entry.file_sequence_number,
        f.content,
        f.file_path,
        f.spec_id,
        f.record_count,
        f.file_size_in_bytes,
        tuple(f.partition),
        f.lower_bounds,
        f.upper_bounds,
        f.null_value_counts,
    )


def test_a_partition_run_decodes_no_manifest_its_process_last_committed(
    catalog: Any, fresh_catalog: Callable[[], Any], pg_db_url: str, monkeypatch: Any
) -> None:
    """The commit keeps the manifest list and the manifests it encoded as a read gives them
    (sequence numbers as the list assigns them): the process's next partition runs decode
    neither again, nor the manifests a merge-append merges. What it kept is what the files
    hold, and the table reads the same through another pyiceberg handle after a re-run that
    replaces a slice."""

    from pipeline_output.stores.iceberg.snapshot import manifests
    from pipeline_output.stores.iceberg.table.manifest_decoding import read_manifest

    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    partition_run(store, 1)
    decoded: list[str] = []
    real_read, real_list = manifests.read_manifest, manifests.manifest_list

    def counted_read(manifest: Any, io: Any, **options: Any) -> Any:
        decoded.append(manifest.manifest_path)
        return real_read(manifest, io, **options)

    def counted_list(io: Any, snapshot: Any) -> Any:
        decoded.append(snapshot.manifest_list)
        return real_list(io, snapshot)

    monkeypatch.setattr(manifests, "read_manifest", counted_read)
    monkeypatch.setattr(manifests, "manifest_list", counted_list)
    days = range(2, 21)  # past the 16 manifests a merge-append merges
    for day in days:
        partition_run(store, day)
    assert decoded == [], decoded
    table = fresh_catalog().load_table(("datasets", DAILY.name))
    assert len(table.current_snapshot().manifests(table.io)) < 16  # merged on the way
    day1 = day_part(1)[1].head(4)
    partition_run(store, 1, day1)  # removes day 1's file: its entry rewritten as DELETED
    monkeypatch.undo()
    expected = pl.concat([day1, *(day_part(day)[1] for day in days)])
    assert_same_multiset(store.read(DAILY), expected)
    table = fresh_catalog().load_table(("datasets", DAILY.name))
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected)  # type: ignore[arg-type]
    snapshot = table.current_snapshot()
    kept_list = manifests.READ_MANIFESTS.manifests(snapshot, table.io)
    assert [repr(m) for m in kept_list] == [repr(m) for m in snapshot.manifests(table.io)]
    for manifest in kept_list:
        kept, _ = manifests.READ_MANIFESTS.read(manifest, table.io)
        read, _ = read_manifest(manifest, table.io)
        assert [_as_read(e) for e in kept] == [_as_read(e) for e in read], manifest
