"""Catalog requests per native write (issue 44): one table load, under the writer lock, and one
commit — on pyiceberg's SQL catalog (calls counted on the real catalog object) and on a real REST
catalog (SeaweedFS; HTTP requests counted on pyiceberg's own `requests` session). Counted for a
process's first write of an existing table (a fresh store: one more load, to pre-write its files
before the lock) and for its next write; the rows are checked against the frames written."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output_tests.oracle import assert_same_multiset
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
    assert first == Counter(load_table=2, commit_table=1), first
    assert then == Counter(load_table=1, commit_table=1), then


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
    assert len(first) <= 3 and len(then) <= 2, (first, then)
    for requests in counted:
        assert sum(r.startswith("POST") for r in requests) == 1, requests  # the commit
