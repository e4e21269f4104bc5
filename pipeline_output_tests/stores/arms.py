"""Both arms behind one small interface, for the conformance suite (`both_arms/`).

`PgHarness` checks one write to the legacy Postgres arm against the independent polars oracle, as
`iceberg_harness.Harness` does for the native Iceberg arm. `IcebergArm` and `PgArm` wrap the two
with the same methods, so a scenario is written once and runs on each arm:

- `write_and_check(spec, frame, window=...)` -> `(WriteResult, Expected)`: the write, checked
  against the oracle's prediction (contents read back through fresh handles, counters, and the one
  commit it made or the none it must not have made);
- `write(spec, frame, window=..., partition=...)` -> `WriteResult`: a plain write (setup, refused
  writes; `partition` a Dagster partition's slice);
- `read(spec, window=..., columns=...)`: the store's own read, through a fresh handle;
- `rows(spec)`: the committed contents, cross-checked with the raw storage (a pyiceberg scan; the
  `jsonb` documents by plain SQL);
- `commits(spec)`: the arm's commit history (Iceberg snapshot ids; `pg` deploy record ids);
- `has_commit(spec)`: the freshness oracle (an Iceberg snapshot; a succeeded `pg` deploy);
- `drain(spec)`: delete every row outside the write path, keeping the commit history;
- `build(spec, chunks)`: a target built by one write per chunk (one data file each on Iceberg);
- `footprint(spec)`: everything a refused write must leave as it was (the Iceberg table's existence,
  snapshots and data files; the `pg` deploy records, registered schema and documents).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

import polars as pl
import psycopg
from pyiceberg.expressions import AlwaysTrue

from pipeline_output import DatasetSpec, Window, WriteResult
from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.ledger import Ledger
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.iceberg_harness import Harness, as_kind, build_in_files, expect_write
from pipeline_output_tests.oracle import (
    Expected,
    assert_counters,
    assert_same_multiset,
    is_identical_replace,
)

ARMS = ("iceberg", "pg")


@dataclass
class PgHarness:
    """One test's legacy arm: a writing store and fresh read-back handles."""

    url: str

    def store(self) -> PostgresStore:
        return PostgresStore(self.url)

    def ledger(self) -> Ledger:
        return Ledger(self.url)

    def deploy_ids(self, spec: DatasetSpec) -> list[int]:
        return [d.id for d in self.ledger().deploy_log.deploys(spec.name, arm="pg")]

    def raw_docs(self, spec: DatasetSpec | str) -> list[dict[str, Any]]:
        """The stored documents by plain SQL (no pipeline_output code), in row_index order."""
        name = spec if isinstance(spec, str) else spec.name
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT data::text FROM pipeline_output.dataset_rows WHERE dataset_id = %s "
                "ORDER BY row_index",
                (name,),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def contents(self, spec: DatasetSpec) -> pl.DataFrame | None:
        """Committed contents via a fresh store; None when the arm has no succeeded deploy."""
        fresh = self.store()
        if not fresh.target_state(spec).has_snapshot:
            return None
        got = fresh.read(spec)
        docs = self.raw_docs(spec)
        assert got.height == len(docs)
        if spec.primary_key and got.height:
            key = spec.primary_key[0]
            values = got[key].to_list()
            if got.schema[key] == pl.Time:  # a document holds a time as its ISO text
                values = [v.isoformat() for v in values]
            assert sorted(values) == sorted(d[key] for d in docs)
        return got

    def write_and_check(
        self,
        spec: DatasetSpec,
        data: pl.DataFrame,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        kind: str = "polars",
    ) -> tuple[WriteResult, Expected]:
        before = self.contents(spec)
        before_ids = self.deploy_ids(spec)
        exp = expect_write(spec, before, data, window)
        res = self.store().write(spec, as_kind(data, kind), window=window, run_id=run_id)
        assert res.arm == "pg"
        assert res.write_mode == exp.write_mode, (res.write_mode, exp.write_mode)
        assert res.first_deploy is exp.first_deploy
        after = self.contents(spec)
        assert after is not None
        assert_same_multiset(after, exp.table)

        identical_replace = is_identical_replace(exp, before)
        new_ids = [i for i in self.deploy_ids(spec) if i not in before_ids]
        if exp.changes or exp.first_deploy or (identical_replace and res.snapshot_id is not None):
            assert res.snapshot_id is not None, "a write that changes the arm must be recorded"
            assert new_ids == [res.snapshot_id]
            record = self.ledger().deploy_log.last_deploy(spec.name, "pg")
            assert record is not None and record.id == res.snapshot_id
            assert record.status == "succeeded" and record.run_id == run_id
            assert record.write_mode == res.write_mode and record.strategy == spec.strategy
            assert record.rows_total_after == res.rows_total_after
            assert record.window == (str(window) if window is not None else None)
        else:
            assert res.snapshot_id is None, "a no-op write must not record a deploy"
            assert new_ids == []

        assert_counters(res, exp, identical_replace=identical_replace)
        assert res.rows_total_after == exp.table.height
        return res, exp


@dataclass
class IcebergArm:
    """The native arm: commits are snapshots, rows are cross-checked with a raw pyiceberg scan."""

    iceberg: Harness
    name: ClassVar[str] = "iceberg"

    def write_and_check(
        self,
        spec: DatasetSpec,
        data: pl.DataFrame,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        kind: str = "polars",
    ) -> tuple[WriteResult, Expected]:
        res, exp = self.iceberg.write_and_check(spec, data, window=window, run_id=run_id, kind=kind)
        assert res.arm == "iceberg"
        return res, exp

    def write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        partition: PartitionSlice | None = None,
    ) -> WriteResult:
        return self.iceberg.store().write(
            spec, data, window=window, run_id=run_id, partition=partition
        )

    def read(self, spec: DatasetSpec, **kwargs: Any) -> pl.DataFrame:
        return self.iceberg.store(self.iceberg.fresh()).read(spec, **kwargs)

    def rows(self, spec: DatasetSpec) -> pl.DataFrame:
        got = self.iceberg.contents(spec)
        assert got is not None, f"{spec.name} has no committed snapshot"
        return got

    def commits(self, spec: DatasetSpec) -> list[int]:
        return self.iceberg.snapshot_ids(spec)

    def has_commit(self, spec: DatasetSpec) -> bool:
        return self.iceberg.store(self.iceberg.fresh()).target_state(spec).has_snapshot

    def drain(self, spec: DatasetSpec) -> None:
        """Delete every row with pyiceberg itself (a delete snapshot; the history stays)."""
        self.iceberg.table(spec).delete(delete_filter=AlwaysTrue())

    def build(self, spec: DatasetSpec, chunks: list[pl.DataFrame]) -> None:
        build_in_files(self.iceberg, spec, chunks)

    def footprint(self, spec: DatasetSpec) -> tuple[Any, ...]:
        """Whether the table exists, its snapshot ids and the data files under its location."""
        if not self.iceberg.exists(spec):
            return (False, [], [])
        return (True, self.commits(spec), data_files_under(self.iceberg.table(spec)))


def data_files_under(table: Any) -> list[str]:
    """The Parquet files under the table's location, listed through its FileIO's filesystem
    (a local directory or an S3 prefix alike)."""
    from pyarrow.fs import FileSelector, FileType
    from pyiceberg.io.pyarrow import PyArrowFileIO

    location = table.location()
    scheme, netloc, path = PyArrowFileIO.parse_location(location)
    assert isinstance(table.io, PyArrowFileIO), type(table.io)
    fs = table.io.fs_by_scheme(scheme, netloc)
    infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == FileType.File and i.path.endswith(".parquet"))


@dataclass
class PgArm:
    """The legacy arm: commits are `pg` deploy records, rows are cross-checked with the `jsonb`
    documents fetched by plain SQL."""

    pg: PgHarness
    name: ClassVar[str] = "pg"

    def write_and_check(
        self,
        spec: DatasetSpec,
        data: pl.DataFrame,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        kind: str = "polars",
    ) -> tuple[WriteResult, Expected]:
        return self.pg.write_and_check(spec, data, window=window, run_id=run_id, kind=kind)

    def write(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        partition: PartitionSlice | None = None,
    ) -> WriteResult:
        return self.pg.store().write(spec, data, window=window, run_id=run_id, partition=partition)

    def read(self, spec: DatasetSpec, **kwargs: Any) -> pl.DataFrame:
        return self.pg.store().read(spec, **kwargs)

    def rows(self, spec: DatasetSpec) -> pl.DataFrame:
        got = self.pg.contents(spec)
        assert got is not None, f"{spec.name} has no succeeded pg deploy"
        return got

    def commits(self, spec: DatasetSpec) -> list[int]:
        return self.pg.deploy_ids(spec)

    def has_commit(self, spec: DatasetSpec) -> bool:
        return self.pg.store().target_state(spec).has_snapshot

    def drain(self, spec: DatasetSpec) -> None:
        """The store's drain: deletes the rows, keeps the deploy history."""
        self.pg.store().drain(spec)

    def build(self, spec: DatasetSpec, chunks: list[pl.DataFrame]) -> None:
        upsert = DatasetSpec(
            name=spec.name,
            primary_key=spec.primary_key,
            strategy="snapshot_replace" if spec.primary_key else "append_always",
            delta=spec.delta,
        )
        for n, chunk in enumerate(chunks):
            self.pg.store().write(upsert, chunk, run_id=f"c{n}")

    def footprint(self, spec: DatasetSpec) -> tuple[Any, ...]:
        """Every `pg` deploy record, the registered schema and the stored documents."""
        schema = self.pg.store().schema(spec)
        return (
            self.commits(spec),
            schema.to_string() if schema is not None else None,
            self.pg.raw_docs(spec),
        )


# --- frames more than one test module uses ---------------------------------------------------------


def composite(n_from: int, n_to: int, *, version: int = 0) -> pl.DataFrame:
    """Rows keyed on (k_int, k_str, k_date) for ids n_from..n_to-1; `version` changes the values."""
    i = pl.int_range(n_from, n_to, eager=True, dtype=pl.Int64)
    return pl.DataFrame(
        {
            "k_int": i % 1000,
            "k_str": "s" + (i // 1000).cast(pl.String),
            "k_date": pl.Series([date(2021, 1, 1) + timedelta(days=int(x) % 3) for x in i]),
            "value": i.cast(pl.Float64) + version,
            "label": "v" + pl.Series([version] * len(i)).cast(pl.String),
        }
    ).with_columns(pl.col("k_date").cast(pl.Date))


def typed_frame() -> pl.DataFrame:
    """Five rows of every scalar type both arms store, with nulls, NaN, infinities and extremes."""
    return pl.DataFrame(
        {
            "id": pl.Series([1, 2, 3, 4, 5], dtype=pl.Int64),
            "i32": pl.Series([1, None, -(2**31), 2**31 - 1, 0], dtype=pl.Int32),
            "i64": pl.Series([2**63 - 1, -(2**63), None, 0, 42], dtype=pl.Int64),
            "f64": [math.nan, math.inf, -math.inf, None, 0.30000000000000004],
            "f32": pl.Series([0.1, math.nan, None, 3.4e38, -1.5], dtype=pl.Float32),
            "tiny": [1e-300, 5e-324, 1.7976931348623157e308, -0.5, 1 / 3],
            "ts": [
                datetime(2024, 1, 1, 1, 2, 3, 456789),
                None,
                datetime(1, 1, 1),
                None,
                datetime(9999, 12, 31, 23, 59, 59, 999999),
            ],
            "tsz": pl.Series(
                [
                    datetime(2024, 6, 1, 12, 0, 0, 1, tzinfo=UTC),
                    None,
                    datetime(1970, 1, 1, tzinfo=UTC),
                    datetime(2000, 2, 29, tzinfo=UTC),
                    None,
                ]
            ),
            "day": [date(2024, 2, 29), None, date(1, 1, 1), date(9999, 12, 31), date(1970, 1, 1)],
            "dec": pl.Series(
                [
                    Decimal("1.50"),
                    None,
                    Decimal("-12345678901234567.89"),
                    Decimal("0.00"),
                    Decimal("99999999999999999999.99"),
                ],
                dtype=pl.Decimal(22, 2),
            ),
            "flag": [True, False, None, True, False],
            "text": [
                "plain",
                "",
                None,
                "quote \" and ' and \\ and ; drop table x; --",
                "ünïcödé\n\ttab,comma",
            ],
            "blob": [b"\x00\x01", b"", None, b"\xff" * 3, b"x"],
            "nothing": pl.Series([None] * 5, dtype=pl.String),
        }
    )
