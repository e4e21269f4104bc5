"""A table that lives through many writes keeps a flat per-write metadata cost (issue 18):
manifests merge and never pile up, `metadata.json` history stays bounded, an upsert coalesces the
files it rewrites with its inserts — and every snapshot still reads what it held."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import from_bytes
from pyiceberg.types import LongType

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.stores.iceberg.snapshot.manifests import read_index
from pipeline_output.stores.iceberg.table.tables import MAINTENANCE_FREE_PROPERTIES
from pipeline_output_tests.oracle import assert_same_multiset, expect

NS = "history"


def _store(catalog: Any, url: str) -> IcebergStore:
    return IcebergStore(catalog, NS, lock=AdvisoryLock(url))


def _rows(ids: list[int], *, version: int = 0) -> pl.DataFrame:
    return pl.DataFrame({"id": ids, "v": [i * 10 + version for i in ids]}).cast({"id": pl.Int64})


def _manifests(store: IcebergStore, name: str) -> list[tuple[int, int, bool]]:
    """(live entries, all entries, written by this snapshot) of each manifest in the current
    snapshot."""
    table = store.load(name)
    assert table is not None
    snapshot = table.current_snapshot()
    assert snapshot is not None
    out = []
    for manifest in snapshot.manifests(table.io):
        every = manifest.fetch_manifest_entry(table.io, discard_deleted=False)
        live = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        out.append((len(live), len(every), manifest.added_snapshot_id == snapshot.snapshot_id))
    return out


def _plain_catalog(url: str, warehouse: str) -> Any:
    return SqlCatalog("default", uri=to_sqlalchemy_url(url, driver="psycopg"), warehouse=warehouse)


def _data_files(store: IcebergStore, name: str) -> list[Any]:
    table = store.load(name)
    assert table is not None
    return [t.file for t in table.scan().plan_files()]


def _set_properties(store: IcebergStore, name: str, **props: str) -> None:
    table = store.load(name)
    assert table is not None
    with table.transaction() as tx:
        tx.set_properties(props)


@pytest.mark.parametrize("catalog_kind", ["flat", "pyiceberg"])
def test_many_upserts_leave_one_file_few_manifests_and_readable_history(
    catalog: Any, pg_db_url: str, catalog_warehouse: str, catalog_kind: str
) -> None:
    """Each upsert rewrites the file its matched keys live in and inserts new keys: the rewritten
    rows and the inserts go to ONE new file, the emptied manifests are dropped (pyiceberg carried
    a DELETED-only manifest forward per overwrite: two more manifests per write), and every
    snapshot of the history still scans to the rows it had — through the project's catalog and
    through pyiceberg's own SqlCatalog alike."""
    if catalog_kind == "pyiceberg":
        catalog = _plain_catalog(pg_db_url, catalog_warehouse)
    store = _store(catalog, pg_db_url)
    spec = DatasetSpec(name="upserted", primary_key=("id",), strategy="snapshot_replace")
    expected = _rows(list(range(1000)))
    store.write(spec, expected)
    totals = [expected.height]
    for i in range(30):
        matched = [(i * 37 + k * 101) % 1000 for k in range(5)]
        batch = _rows(matched + list(range(1000 + 5 * i, 1005 + 5 * i)), version=i + 1)
        for rerun in range(2):
            result = store.write(spec, batch)
            assert result.rows_inserted == (0 if rerun else 5)
        expected = expect("snapshot_replace", expected, batch, ["id"]).table
        totals.append(expected.height)
        manifests = _manifests(store, spec.name)
        # a manifest without live files is only this snapshot's record of what it deleted
        assert all(live or own for live, _, own in manifests), manifests
        assert len(manifests) <= 3, manifests
        assert len(_data_files(store, spec.name)) == 1
    assert_same_multiset(store.read(spec), expected)

    table = store.load(spec)
    assert table is not None
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected)  # type: ignore[arg-type]
    pl_scan = pl.scan_iceberg(table).collect()
    assert_same_multiset(pl_scan, expected)
    # every committed snapshot (re-runs commit nothing) still reads its own row count
    counts = [table.scan(snapshot_id=s.snapshot_id).to_arrow().num_rows for s in table.snapshots()]
    assert counts == totals


def test_appends_merge_small_manifests_on_commit(catalog: Any, pg_db_url: str) -> None:
    store = _store(catalog, pg_db_url)
    spec = DatasetSpec(name="appended", strategy="append_always")
    expected = []
    for i in range(40):
        chunk = _rows([i * 10 + k for k in range(10)])
        store.write(spec, chunk)
        expected.append(chunk)
        limit = int(MAINTENANCE_FREE_PROPERTIES["commit.manifest.min-count-to-merge"])
        assert len(_manifests(store, spec.name)) <= limit
    assert len(_data_files(store, spec.name)) == 40
    assert_same_multiset(store.read(spec), pl.concat(expected))


def test_a_manifest_property_the_table_sets_is_kept(catalog: Any, pg_db_url: str) -> None:
    store = _store(catalog, pg_db_url)
    spec = DatasetSpec(name="unmerged", strategy="append_always")
    store.write(spec, _rows([0]))
    _set_properties(store, spec.name, **{"commit.manifest-merge.enabled": "false"})
    for i in range(1, 20):
        store.write(spec, _rows([i]))
    assert len(_manifests(store, spec.name)) == 20  # one per append: merging is off
    table = store.load(spec)
    assert table is not None
    assert table.properties["commit.manifest-merge.enabled"] == "false"


def test_an_older_table_gets_the_defaults_and_keeps_bounded_metadata_files(
    catalog: Any, pg_db_url: str
) -> None:
    """A table created before the defaults existed (none of them set) gets the missing ones on
    its next write; its own `previous-versions-max` wins, and old metadata.json files go."""
    store = _store(catalog, pg_db_url)
    spec = DatasetSpec(name="older", primary_key=("id",), strategy="snapshot_replace")
    store.write(spec, _rows([0, 1, 2]))
    table = store.load(spec)
    assert table is not None
    with table.transaction() as tx:
        tx.remove_properties(*MAINTENANCE_FREE_PROPERTIES)
        tx.set_properties({"write.metadata.previous-versions-max": "4"})
    for i in range(12):
        store.write(spec, _rows([0, 100 + i], version=i + 1))
    table = store.load(spec)
    assert table is not None
    for key, value in MAINTENANCE_FREE_PROPERTIES.items():
        if key != "write.metadata.previous-versions-max":
            assert table.properties[key] == value
    assert table.properties["write.metadata.previous-versions-max"] == "4"
    metadata_dir = Path(table.metadata.location.removeprefix("file://")) / "metadata"
    assert len(list(metadata_dir.glob("*.metadata.json"))) <= 5  # the current one + 4
    assert store.read(spec).height == 3 + 12


@pytest.mark.parametrize("partition_by", [(), ("bucket(3, id)",)])
def test_an_upsert_over_many_files_coalesces_them_with_its_inserts(
    catalog: Any, pg_db_url: str, partition_by: tuple[str, ...]
) -> None:
    store = _store(catalog, pg_db_url)
    name = f"coalesced_{len(partition_by)}"
    chunks = [_rows(list(range(100 * k, 100 * k + 100))) for k in range(6)]
    appended = DatasetSpec(
        name=name, primary_key=("id",), strategy="append_always", partition_by=partition_by
    )
    for chunk in chunks:
        store.write(appended, chunk)
    before = {f.file_path for f in _data_files(store, name)}
    upsert = DatasetSpec(name=name, primary_key=("id",), partition_by=partition_by)
    batch = _rows([5, 150, 250, 350, 450, 550, 900, 901], version=1)
    expected = expect("snapshot_replace", pl.concat(chunks), batch, ["id"]).table
    for rerun in range(2):
        result = store.write(upsert, batch)
        assert (result.rows_updated, result.rows_inserted) == ((0, 0) if rerun else (6, 2))
        files = _data_files(store, name)
        new = [f for f in files if f.file_path not in before]
        if partition_by:  # one new file per partition the write touched
            assert len({f.partition[0] for f in new}) == len(new) <= 3
        else:  # six rewritten files and the inserts: one new file
            assert len(new) == 1 and len(files) == 1
        assert len(files) == len(before) - 6 + len(new)
        assert_same_multiset(store.read(upsert), expected)


def test_coalesced_output_is_cut_at_the_target_size_into_sorted_disjoint_files(
    catalog: Any, pg_db_url: str
) -> None:
    store = _store(catalog, pg_db_url)
    name = "cut"
    appended = DatasetSpec(name=name, primary_key=("id",), strategy="append_always")
    chunks = [_rows(list(range(k, 20_000, 4))) for k in range(4)]  # interleaved key ranges
    for chunk in chunks:
        store.write(appended, chunk)
    _set_properties(store, name, **{"write.target-file-size-bytes": str(120_000)})
    upsert = DatasetSpec(name=name, primary_key=("id",))
    batch = _rows([0, 1, 2, 3, 19_999, 25_000], version=1)
    store.write(upsert, batch)
    files = _data_files(store, name)
    assert len(files) >= 2
    table = store.load(name)
    assert table is not None
    field_id = table.schema().find_field("id").field_id
    bounds = sorted(
        (
            from_bytes(LongType(), f.lower_bounds[field_id]),
            from_bytes(LongType(), f.upper_bounds[field_id]),
        )
        for f in files
    )
    assert all(a[1] < b[0] for a, b in itertools.pairwise(bounds)), bounds
    expected = expect("snapshot_replace", pl.concat(chunks), batch, ["id"]).table
    assert_same_multiset(store.read(upsert), expected)


def test_the_manifest_index_is_read_once_and_plans_the_same_files_as_pyiceberg(
    catalog: Any, pg_db_url: str
) -> None:
    store = _store(catalog, pg_db_url)
    spec = DatasetSpec(name="indexed", primary_key=("id",), strategy="append_always")
    for k in range(5):
        store.write(spec, _rows(list(range(10 * k, 10 * k + 10))))
    table = store.load(spec)
    assert table is not None
    ours = sorted(t.file.file_path for t in read_index(table).tasks())
    theirs = sorted(t.file.file_path for t in table.scan().plan_files())
    assert ours == theirs and len(ours) == 5


def test_the_project_catalog_parses_each_metadata_file_once_and_sees_other_handles_commits(
    fresh_catalog: Any, pg_db_url: str, catalog_warehouse: str
) -> None:
    first, second = fresh_catalog(), fresh_catalog()
    first.create_namespace(NS)
    spec = DatasetSpec(name="cached", primary_key=("id",), strategy="snapshot_replace")
    _store(first, pg_db_url).write(spec, _rows([1, 2]))
    seen = second.load_table((NS, "cached"))
    assert second.load_table((NS, "cached")).metadata is seen.metadata  # parsed once
    _store(second, pg_db_url).write(spec, _rows([2, 3], version=1))  # a commit by the other
    table = first.load_table((NS, "cached"))
    assert table.metadata_location != seen.metadata_location
    # the same metadata pyiceberg's own catalog parses from the file
    plain = _plain_catalog(pg_db_url, catalog_warehouse).load_table((NS, "cached"))
    assert plain.metadata_location == table.metadata_location
    assert plain.metadata == table.metadata
    assert_same_multiset(
        _store(first, pg_db_url).read(spec), _rows([1]).vstack(_rows([2, 3], version=1))
    )


def test_metadata_files_are_gzipped_unless_the_table_says_otherwise(
    catalog: Any, pg_db_url: str, catalog_warehouse: str
) -> None:
    import gzip
    import json

    store = _store(catalog, pg_db_url)
    spec = DatasetSpec(name="gz", primary_key=("id",), strategy="snapshot_replace")
    store.write(spec, _rows([1, 2]))
    store.write(spec, _rows([2, 3], version=1))
    location = store.load(spec).metadata_location  # type: ignore[union-attr]
    assert location.endswith(".gz.metadata.json")
    # gzip'd at the fastest level (the header's XFL byte: 4 fastest, 2 slowest): the file lists
    # every snapshot and every commit writes it whole
    assert Path(location.removeprefix("file://")).read_bytes()[8] == 4
    with gzip.open(location.removeprefix("file://")) as fh:
        assert (
            json.load(fh)["current-snapshot-id"] == store.load(spec).current_snapshot().snapshot_id
        )  # type: ignore[union-attr]
    plain = _plain_catalog(pg_db_url, catalog_warehouse).load_table((NS, "gz"))
    assert plain.metadata == store.load(spec).metadata  # type: ignore[union-attr]
    _set_properties(store, "gz", **{"write.metadata.compression-codec": "none"})
    store.write(spec, _rows([4], version=2))
    assert not store.load(spec).metadata_location.endswith(".gz.metadata.json")  # type: ignore[union-attr]
    assert_same_multiset(
        store.read(spec), _rows([1]).vstack(_rows([2, 3], version=1)).vstack(_rows([4], version=2))
    )
