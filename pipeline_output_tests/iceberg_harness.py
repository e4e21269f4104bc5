"""Shared helpers for the Iceberg-arm tests: build stores, read back through a fresh catalog handle,
and check one write against the oracle (contents, counters, snapshots, summary properties).

The input frames and specs (`customers`, `spec_for`, `base`, `redeploy_rows`, `window_rows`) and
`expect_write` serve the legacy Postgres arm's tests as well, so both arms face the same scenarios.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

import pipeline_output
from pipeline_output import DatasetSpec, Delta, IcebergStore, Window, WriteResult
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output_tests.oracle import (
    Expected,
    assert_counters,
    assert_same_multiset,
    expect,
    is_identical_replace,
)

NS = "datasets"
PROP = "pipeline-output."


def customers(ids: Any, *, version: int = 0, seq: Any = None) -> pl.DataFrame:
    """A small typed frame: id int64, name string, amount float64, day date, seq int64."""
    ids = list(ids)
    seqs = list(seq) if seq is not None else ids
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "name": [f"c{i}-v{version}" for i in ids],
            "amount": pl.Series([i * 1.5 + version for i in ids], dtype=pl.Float64),
            "day": pl.Series([date(2024, 1, 1 + (i % 28)) for i in ids], dtype=pl.Date),
            "seq": pl.Series(seqs, dtype=pl.Int64),
        }
    )


def spec_for(strategy: str, *, delta: bool = False, name: str = "customers") -> DatasetSpec:
    """A dataset keyed on `id` (windowed on `seq` when `delta`)."""
    return DatasetSpec(
        name=name,
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        delta=Delta(source="raw", watermark="seq") if delta else None,
    )


def base() -> pl.DataFrame:
    """The first deploy's rows: ids 1..40 (seq = id)."""
    return customers(range(1, 41))


def redeploy_rows() -> pl.DataFrame:
    """Overlaps base(): 21..30 changed, 31..40 identical, 41..60 new; 1..20 not mentioned."""
    return pl.concat(
        [customers(range(21, 31), version=1), customers(range(31, 41)), customers(range(41, 61))]
    )


def nan_and_null_rows() -> pl.DataFrame:
    """base() with NaN and nulls in `amount` and nulls in `name` (identical reruns change nothing)."""
    return base().with_columns(
        amount=pl.when(pl.col("id") % 3 == 0)
        .then(float("nan"))
        .when(pl.col("id") % 3 == 1)
        .then(None)
        .otherwise(pl.col("amount")),
        name=pl.when(pl.col("id") % 2 == 0).then(None).otherwise(pl.col("name")),
    )


WINDOW = Window(low=10, high=20)


def window_rows() -> pl.DataFrame:
    """Compute for window (10, 20] over base(): 11..14 changed, 15..18 identical, 19 and 20 absent,
    and new keys 101..103 with seq 11, 15 and 20 (the high boundary is inside)."""
    return pl.concat(
        [
            customers(range(11, 15), version=2),
            customers(range(15, 19)),
            customers([101, 102, 103], seq=[11, 15, 20], version=2),
        ]
    )


def expect_write(
    spec: DatasetSpec, before: pl.DataFrame | None, data: pl.DataFrame, window: Window | None
) -> Expected:
    """The oracle's prediction for writing `data` with `spec` over `before` (None = first deploy)."""
    return expect(
        spec.strategy,
        before,
        data,
        list(spec.primary_key),
        window=(window.low, window.high) if window is not None else None,
        watermark=spec.delta.watermark if spec.delta else None,
    )


def as_kind(frame: pl.DataFrame, kind: str) -> Any:
    """The same rows as a polars DataFrame, LazyFrame or Arrow table."""
    if kind == "polars":
        return frame
    if kind == "lazy":
        return frame.lazy()
    if kind == "arrow":
        return frame.to_arrow()
    raise AssertionError(kind)


METRIC_FIELDS = (
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
)
"""A data file's column metrics (maps of field id to a count or a bound)."""

DATA_FILE_FIELDS = (
    "content",
    "file_path",
    "file_format",
    "record_count",
    "file_size_in_bytes",
    *METRIC_FIELDS,
    "key_metadata",
    "split_offsets",
    "equality_ids",
    "sort_order_id",
    "spec_id",
)
"""Every field of a manifest entry's data file but its partition (a `Record`)."""


def data_file_values(data_file: Any) -> dict[str, Any]:
    """A data file's `DATA_FILE_FIELDS` (maps as dicts) and its partition (a tuple): what two
    reads of the same entry must agree on."""
    out = {name: getattr(data_file, name) for name in DATA_FILE_FIELDS}
    out = {k: dict(v) if hasattr(v, "items") else v for k, v in out.items()}
    out["partition"] = tuple(data_file.partition)
    return out


def duckdb_with_iceberg() -> Any:
    """A DuckDB connection with its Avro and Iceberg extensions loaded from their PyPI wheels
    (no download at test time: the machine may have no network)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        folder = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}"
        con.execute(f"LOAD '{folder / f'{name}.duckdb_extension'}'")
    return con


def release(catalog: Any) -> None:
    """Close a SQL catalog handle's pooled connections (the engine reconnects on demand); a REST
    catalog holds no database connections."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


@dataclass
class Harness:
    """One test's view of the warehouse: a writing store and fresh read-back handles."""

    catalog: Any
    fresh_catalog: Any
    pg_db_url: str
    # whether a downstream consumes a dataset's changes (`IcebergStore(change_consumers=)`; the
    # runtime asks the ledger): None, like a bare store, knows of none
    change_consumers: Callable[[str], bool] | None = None

    def store(self, catalog: Any = None) -> IcebergStore:
        return IcebergStore(
            catalog if catalog is not None else self.catalog,
            NS,
            lock=AdvisoryLock(self.pg_db_url),
            change_consumers=self.change_consumers,
        )

    def fresh(self) -> Any:
        """A new catalog handle whose pooled connections are closed right away (the engine
        reconnects on demand), so many handles never exhaust the server's connection slots."""
        cat = self.fresh_catalog()
        release(cat)
        return cat

    def table(self, spec: DatasetSpec | str, cat: Any = None) -> Any:
        name = spec if isinstance(spec, str) else spec.name
        cat = cat or self.fresh()
        table = cat.load_table((NS, name))
        release(cat)
        return table

    def exists(self, spec: DatasetSpec | str, cat: Any = None) -> bool:
        name = spec if isinstance(spec, str) else spec.name
        cat = cat or self.fresh()
        found = bool(cat.table_exists((NS, name)))
        release(cat)
        return found

    def snapshot_ids(self, spec: DatasetSpec | str, cat: Any = None) -> list[int]:
        cat = cat or self.fresh()
        if not self.exists(spec, cat):
            return []
        return [s.snapshot_id for s in self.table(spec, cat).snapshots()]

    def raw(self, spec: DatasetSpec | str, cat: Any = None) -> pl.DataFrame:
        """The table as pyiceberg itself scans it (no pipeline_output code involved)."""
        arrow: pa.Table = self.table(spec, cat).scan().to_arrow()
        return pl.from_arrow(arrow)  # type: ignore[return-value]

    def contents(self, spec: DatasetSpec, cat: Any = None) -> pl.DataFrame | None:
        """Committed contents via a fresh store's `read`, cross-checked with a raw pyiceberg scan;
        None when the target has no committed write (the freshness oracle's 'first deploy')."""
        cat = cat or self.fresh()
        if not self.exists(spec, cat) or self.table(spec, cat).current_snapshot() is None:
            return None
        got = self.store(cat).read(spec)
        release(cat)
        raw = self.raw(spec, cat)
        assert_same_multiset(got, raw)
        return got

    def write_and_check(
        self,
        spec: DatasetSpec,
        data: pl.DataFrame,
        *,
        window: Window | None = None,
        run_id: str = "r1",
        kind: str = "polars",
        check_counters: bool = True,
    ) -> tuple[WriteResult, Expected]:
        """Write `data`, then check everything the oracle predicts about that write."""
        cat = self.fresh()
        before = self.contents(spec, cat)
        before_ids = self.snapshot_ids(spec, cat)
        before_current = self.table(spec, cat).current_snapshot() if before_ids else None
        exp = expect_write(spec, before, data, window)
        res = self.store().write(spec, as_kind(data, kind), window=window, run_id=run_id)

        assert res.write_mode == exp.write_mode, (res.write_mode, exp.write_mode)
        assert res.first_deploy is exp.first_deploy
        cat = self.fresh()  # a new handle: nothing cached from before the write
        after = self.contents(spec, cat)
        assert after is not None or exp.table.height == 0
        if after is not None:
            assert_same_multiset(after, exp.table)

        # A replace of data identical to the target may be a no-op or a snapshot: accept both.
        identical_replace = is_identical_replace(exp, before)
        # An empty first deploy may commit an empty snapshot (marking the deploy) or none.
        identical_replace = identical_replace or (exp.first_deploy and data.height == 0)
        after_ids = self.snapshot_ids(spec, cat)
        new_ids = [i for i in after_ids if i not in before_ids]
        if identical_replace and res.snapshot_id is None:
            assert new_ids == []
        elif exp.changes or identical_replace:
            assert res.snapshot_id is not None, "a write that changes the table must commit"
            assert new_ids == [res.snapshot_id], f"expected one new snapshot, got {new_ids}"
            self.check_summary(spec, res, run_id=run_id, window=window, cat=cat)
            snap = self.table(spec, cat).current_snapshot()
            assert snap.snapshot_id == res.snapshot_id
            if before_current is not None:
                assert snap.parent_snapshot_id == before_current.snapshot_id
        else:
            assert res.snapshot_id is None, "a no-op write must not commit"
            assert new_ids == [], f"a no-op write created snapshots {new_ids}"

        if check_counters:
            assert_counters(res, exp, identical_replace=identical_replace)
        assert res.rows_total_after == exp.table.height
        return res, exp

    def check_summary(
        self,
        spec: DatasetSpec,
        res: WriteResult,
        *,
        run_id: str,
        window: Window | None,
        cat: Any = None,
    ) -> None:
        snap = self.table(spec, cat).snapshot_by_id(res.snapshot_id)
        props = dict(snap.summary.additional_properties)
        assert props.get(PROP + "dataset") == spec.name, props
        assert props.get(PROP + "strategy") == spec.strategy, props
        assert props.get(PROP + "write-mode") == res.write_mode, props
        assert props.get(PROP + "run-id") == run_id, props
        assert props.get(PROP + "version") == pipeline_output.__version__, props
        if window is None:
            assert PROP + "window" not in props, props
        else:
            text = props.get(PROP + "window")
            assert text, props
            for bound in (window.low, window.high):
                if bound is None:
                    continue
                spellings = {str(bound), bound.isoformat() if hasattr(bound, "isoformat") else ""}
                spellings.add(window.to_key())
                assert any(s and s in text for s in spellings) or window.to_key() == text, text
        # Iceberg's own row count agrees with what the store reports.
        # (rows deleted by position still count in their data file's records)
        deleted = int(props.get("total-position-deletes", "0"))
        assert int(props["total-records"]) - deleted == res.rows_total_after


def build_in_files(h: Harness, spec: DatasetSpec, chunks: list[pl.DataFrame]) -> int:
    """First deploy the first chunk, then append the rest one by one (new keys only): one data
    file per chunk (an upsert would fold a small file into its new file). Returns the number of
    data files."""
    upsert = DatasetSpec(
        name=spec.name, primary_key=spec.primary_key, strategy="append_always", delta=spec.delta
    )
    h.store().write(upsert, chunks[0], run_id="c0")
    for n, chunk in enumerate(chunks[1:], start=1):
        h.store().write(upsert, chunk, run_id=f"c{n}")
    return len(list(h.table(spec).scan().plan_files()))


def scored_batches(fail_after: int) -> Iterator[pl.DataFrame]:
    """Five batches of 10 scored rows, like a model node's; batch `fail_after` raises instead."""
    for i in range(5):
        if i == fail_after:
            raise RuntimeError("predict blew up")
        yield pl.DataFrame({"id": list(range(i * 10, i * 10 + 10)), "v": [float(i)] * 10})
