"""Other engines read every kind of table this project writes, and agree with the oracle.

The tables are built once for the module (each write through `IcebergStore`, the expected rows
kept by the independent polars oracle): copy-on-write and merge-on-read upserts spread over
several files, a sync deleting absent keys (delete files replaced by their union), a windowed
replace, a partitioned table whose partition spec then evolves, a table whose schema evolves (a
column added, one widened), a merge-on-read table after compaction and snapshot expiry, and a
table partitioned by day written a Dagster partition at a time (a day replaced: its files dropped
whole; a day synced: delete files).

Readers, each independent of this project's read path:

- DuckDB's `iceberg` extension (the `duckdb-extension-iceberg` / `-avro` wheels, loaded from their
  files with extension auto-install and auto-load off: no network), `iceberg_scan` of the
  table's metadata file, and of its first snapshot (time travel);
- iceberg-rust, through `pyiceberg-core`'s DataFusion table provider (`datafusion`);
- polars' own `scan_iceberg`, and pyiceberg's own scan;
- and this project's read (`native_scan.snapshot_scan`: polars' scan, planned by
  `scan_planning` with fastavro-decoded manifests), whose plan is also compared file for file
  with pyiceberg's (with and without filters, now and at the first snapshot).

Each must return exactly the oracle's rows (a multiset, compared after casting to the oracle's
types): a reader that disagrees fails the suite. The metadata is checked the way other engines
rely on it: every delete-file manifest entry names its one data file (`referenced_data_file`,
read with fastavro), and data files count their float columns' NaN values.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import fastavro
import polars as pl
import pyarrow as pa
import pytest
from pyiceberg.expressions import AlwaysTrue, EqualTo, GreaterThan, LessThan

from pipeline_output import DatasetSpec, Delta, IcebergStore, Window, WriteResult
from pipeline_output.contract.slices import PartitionSlice, TimeRange
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog
from pipeline_output.stores.iceberg.table.native_scan import quiet, snapshot_scan
from pipeline_output.stores.iceberg.table.scan_planning import planned
from pipeline_output_tests.conftest import fresh_database
from pipeline_output_tests.iceberg_harness import NS, customers, duckdb_with_iceberg, expect_write
from pipeline_output_tests.oracle import assert_same_multiset

# polars' note that its optional planning plugin is missing (it plans with pyiceberg instead)
pytestmark = pytest.mark.filterwarnings("ignore:.*polars_iceberg")


@dataclasses.dataclass
class Built:
    """One table: its store handle, expected rows now, and after its first write."""

    spec: DatasetSpec
    expected: pl.DataFrame
    first: pl.DataFrame
    first_snapshot: int


class Tables:
    """Writes through a store and keeps the oracle's expected contents of each table."""

    def __init__(self, store: IcebergStore) -> None:
        self.store = store
        self.built: dict[str, Built] = {}

    def write(self, spec: DatasetSpec, data: pl.DataFrame, *, window: Window | None = None) -> None:
        name = spec.name
        before = self.built[name].expected if name in self.built else None
        if before is not None:  # a widened column: the rows before read back widened
            wider = [c for c in data.columns if c in before.columns]
            before = before.with_columns(pl.col(c).cast(data.schema[c]) for c in wider)
        expected = expect_write(spec, before, data, window).table
        result = self.store.write(spec, data, window=window)
        if name not in self.built:
            assert result.snapshot_id is not None
            self.built[name] = Built(spec, expected, expected, result.snapshot_id)
        else:
            self.built[name].expected = expected
            self.built[name].spec = spec

    def write_day(self, spec: DatasetSpec, data: pl.DataFrame, day: date) -> WriteResult:
        """Write Dagster's daily partition `day`: the oracle's day becomes exactly `data`."""
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        part = PartitionSlice(day.isoformat(), (TimeRange("day", start, start + timedelta(1)),))
        built = self.built[spec.name]
        result = self.store.write(spec, data, partition=part)
        kept = built.expected.filter(pl.col("day") != day)
        built.expected = pl.concat([kept, data.select(kept.columns).cast(kept.schema)])
        built.spec = spec
        return result

    def files(self, spec: DatasetSpec, parts: int, per: int = 30) -> None:
        """`parts` appends of `per` rows: that many data files."""
        appends = dataclasses.replace(spec, strategy="append_always", write_strategy_hint="auto")
        for j in range(parts):
            self.write(appends, customers(range(j * per + 1, (j + 1) * per + 1)))


def _spread(version: int) -> pl.DataFrame:
    """Keys in every file of `files(…, 4)`: changed, identical, and new ones."""
    changed = customers([2, 33, 64, 95, 118], version=version)
    same = customers([10, 40, 70, 100])
    new = customers(range(500 + version * 10, 505 + version * 10), version=version)
    return pl.concat([changed, same, new])


def _keyed(name: str, hint: str, strategy: str = "snapshot_replace", **kw: Any) -> DatasetSpec:
    return DatasetSpec(
        name=name,
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        write_strategy_hint=hint,  # type: ignore[arg-type]
        **kw,
    )


def _build(t: Tables) -> None:
    for hint in ("copy-on-write", "merge-on-read"):
        name = "cow" if hint == "copy-on-write" else "mor"
        spec = _keyed(name, hint)
        t.files(spec, 4)
        t.write(spec, _spread(1))
        t.write(spec, _spread(2))  # a second delete file replaces the first (their union)
        sync = _keyed(name, hint, "sync")
        t.write(sync, pl.concat([_spread(2), customers(range(41, 60))]))

    # a windowed replace on a keyed, watermarked dataset (merge-on-read deletes the window)
    windowed = _keyed(
        "windowed", "merge-on-read", "replace", delta=Delta(source="raw", watermark="seq")
    )
    t.files(windowed, 3)
    t.write(windowed, customers(range(31, 41), version=4), window=Window(low=30, high=45))

    # partitioned by a bucket of the key, then by day: files of both specs, deletes on both
    parted = _keyed("parted", "merge-on-read", partition_by=("bucket(4, id)",))
    t.files(parted, 3)
    t.write(parted, _spread(1))
    by_day = dataclasses.replace(parted, partition_by=("day",))
    t.write(by_day, customers(range(200, 230), version=1))
    t.write(by_day, pl.concat([customers([3, 45, 205], version=7), customers([300])]))

    # schema evolution: a column added, an int column widened
    evolved = _keyed("evolved", "merge-on-read")
    t.files(evolved, 2)
    t.write(evolved, customers([1, 2]).with_columns(qty=pl.Series([1, 2], dtype=pl.Int32)))
    wide = customers([2, 40, 70], version=3).with_columns(
        qty=pl.Series([2**40, None, 7], dtype=pl.Int64), note=pl.lit("n")
    )
    t.write(evolved, wide)

    # Dagster partitions on a table partitioned by day: one day replaced (its files dropped whole),
    # another synced (merge-on-read: a delete file); ids 1..240 in 2 files, ~4 rows a day each
    sliced = _keyed("sliced", "merge-on-read", "replace", partition_by=("day",))
    t.files(sliced, 2, per=120)
    replaced = t.write_day(sliced, customers([2, 30, 58, 86], version=5), date(2024, 1, 3))
    summary = t.store.load(sliced).current_snapshot().summary  # type: ignore[union-attr]
    assert (summary["deleted-data-files"], summary["added-data-files"]) == ("2", "1")
    assert replaced.rows_deleted == 9 and replaced.files_merged_on_read == 0
    synced = dataclasses.replace(sliced, strategy="sync")
    day5 = pl.concat([customers([4, 32, 256], version=6), customers([60])])  # 88, 116.. go
    res = t.write_day(synced, day5, date(2024, 1, 5))
    assert res.files_merged_on_read == 1 and res.rows_deleted == 6 and res.rows_updated == 2

    # merge-on-read, then compacted and expired
    kept = _keyed("maintained", "merge-on-read")
    t.files(kept, 4)
    t.write(kept, _spread(1))
    t.write(kept, _spread(2).with_columns(amount=pl.lit(float("nan"))))
    t.store.compact(kept)
    t.store.expire_snapshots(kept, older_than=timedelta(0), retain_last=1)
    t.built["maintained"].first_snapshot = -1  # expired: no time travel to it


@pytest.fixture(scope="module")
def tables(pg_url: str) -> Iterator[Tables]:
    root = Path(tempfile.mkdtemp(prefix="po-interop-"))
    db = fresh_database(pg_url)
    url = next(db)
    try:
        catalog = FlatSqlCatalog(
            "default",
            uri=to_sqlalchemy_url(url, driver="psycopg"),
            warehouse=f"file://{root}/warehouse",
        )
        catalog.create_namespace(NS)
        built = Tables(IcebergStore(catalog, NS, lock=AdvisoryLock(url)))
        _build(built)
        yield built
        catalog.engine.dispose()
    finally:
        db.close()
        shutil.rmtree(root, ignore_errors=True)


def _as_oracle(got: pa.Table | pl.DataFrame, expected: pl.DataFrame) -> pl.DataFrame:
    frame = got if isinstance(got, pl.DataFrame) else pl.from_arrow(got)
    assert isinstance(frame, pl.DataFrame)
    assert sorted(frame.columns) == sorted(expected.columns), (frame.columns, expected.columns)
    return frame.select(pl.col(c).cast(expected.schema[c]) for c in expected.columns)


Reader = Callable[[Any, int | None], pa.Table | pl.DataFrame]


def _readers() -> dict[str, Reader]:
    con = duckdb_with_iceberg()

    def duck(table: Any, snapshot: int | None) -> pa.Table:
        if snapshot is None:
            return con.execute("SELECT * FROM iceberg_scan(?)", [table.metadata_location]).arrow()
        query = "SELECT * FROM iceberg_scan(?, snapshot_from_id = ?)"
        return con.execute(query, [table.metadata_location, snapshot]).arrow()

    def rust(table: Any, snapshot: int | None) -> pa.Table:
        from datafusion import SessionContext

        assert snapshot is None
        ctx = SessionContext()
        ctx.register_table("t", table)
        return ctx.sql("SELECT * FROM t").to_arrow_table()

    def polars(table: Any, snapshot: int | None) -> pl.DataFrame:
        return pl.scan_iceberg(table, snapshot_id=snapshot).collect()

    def pyiceberg(table: Any, snapshot: int | None) -> pa.Table:
        return table.scan(snapshot_id=snapshot).to_arrow()

    def ours(table: Any, snapshot: int | None) -> pl.DataFrame:  # polars, planned by scan_planning
        with quiet():
            return snapshot_scan(table, snapshot).collect()

    return {
        "duckdb": duck,
        "iceberg-rust": rust,
        "polars": polars,
        "pyiceberg": pyiceberg,
        "pipeline-output": ours,
    }


READERS = ("duckdb", "iceberg-rust", "polars", "pyiceberg", "pipeline-output")
TABLES = ("cow", "mor", "windowed", "parted", "evolved", "maintained", "sliced")


@pytest.fixture(scope="module")
def readers() -> dict[str, Reader]:
    return _readers()


@pytest.mark.parametrize("reader", READERS)
def test_every_engine_reads_every_table_as_the_oracle_has_it(tables, readers, reader):
    for name in TABLES:
        built = tables.built[name]
        table = tables.store.load(name)
        got = readers[reader](table, None)
        try:
            assert_same_multiset(_as_oracle(got, built.expected), built.expected)
        except AssertionError as exc:
            raise AssertionError(f"{reader} reads table {name!r} differently: {exc}") from exc


@pytest.mark.parametrize("reader", ("duckdb", "polars", "pyiceberg", "pipeline-output"))
def test_every_engine_reads_the_first_snapshot_as_it_was(tables, readers, reader):
    for name in TABLES:
        built = tables.built[name]
        if built.first_snapshot < 0:
            continue
        got = readers[reader](tables.store.load(name), built.first_snapshot)
        first = built.first
        assert_same_multiset(_as_oracle(got, first).select(first.columns), first)


def _planned_files(scan: Any) -> list[tuple[Any, ...]]:
    return [
        (
            t.file.file_path,
            [dict(v) if isinstance(v, Mapping) else v for v in t.file._data],
            t.file.spec_id,
            sorted(d.file_path for d in t.delete_files),
            repr(t.residual),
        )
        for t in scan.plan_files()
    ]


def test_our_scan_planning_plans_every_table_as_pyiceberg_does(tables):
    filters = [
        AlwaysTrue(),
        EqualTo("id", 45),
        GreaterThan("id", 100),
        LessThan("amount", 50.0),
        EqualTo("day", "2024-01-03"),
    ]
    for name in TABLES:
        table = tables.store.load(name)
        snapshots = [None] + ([tables.built[name].first_snapshot] * (name != "maintained"))
        for snapshot in snapshots:
            for row_filter in filters:
                ours = planned(table).scan(row_filter=row_filter, snapshot_id=snapshot)
                theirs = table.scan(row_filter=row_filter, snapshot_id=snapshot)
                assert _planned_files(ours) == _planned_files(theirs), (name, row_filter)


def _entries(table: Any, content: int) -> list[dict[str, Any]]:
    """Live manifest entries of one content (0 data, 1 deletes), read with fastavro."""
    out = []
    for manifest in table.current_snapshot().manifests(table.io):
        if int(manifest.content) != content:
            continue
        with open(manifest.manifest_path.removeprefix("file://"), "rb") as fh:
            out.extend(e for e in fastavro.reader(fh) if e["status"] != 2)
    return out


def test_delete_file_entries_name_the_one_data_file_they_apply_to(tables):
    seen = 0
    for name in ("mor", "windowed", "parted", "evolved", "sliced"):
        table = tables.store.load(name)
        data = {e["data_file"]["file_path"] for e in _entries(table, 0)}
        for entry in _entries(table, 1):
            referenced = entry["data_file"]["referenced_data_file"]
            assert referenced in data, (name, referenced)
            bounds = {b["key"]: b["value"] for b in entry["data_file"]["lower_bounds"]}
            assert bounds[2147483546] == referenced.encode()
            seen += 1
    assert seen >= 4  # the module's tables do carry delete files


def test_data_files_count_their_float_columns_nan_values(tables):
    table = tables.store.load("maintained")
    amount = table.schema().find_field("amount").field_id
    counts = [
        {c["key"]: c["value"] for c in e["data_file"]["nan_value_counts"] or []}
        for e in _entries(table, 0)
    ]
    assert counts and all(amount in c for c in counts)
    expected_nans = tables.built["maintained"].expected["amount"].is_nan().sum()
    assert sum(c[amount] for c in counts) == expected_nans > 0


def test_the_duckdb_extension_loads_without_the_network():
    con = duckdb_with_iceberg()
    loaded = con.execute(
        "SELECT extension_name FROM duckdb_extensions() WHERE loaded AND extension_name IN "
        "('iceberg', 'avro') ORDER BY 1"
    ).fetchall()
    assert loaded == [("avro",), ("iceberg",)]
