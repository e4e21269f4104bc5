"""Statistics-driven pruning by every key column (issue 13's third point): a composite key whose
first column is the same in every file, or a string second column, still narrows an upsert to
the files whose bounds admit the batch's keys; results match the polars oracle."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.write.key_scan import prune_by_keys
from pipeline_output_tests.oracle import assert_same_multiset, expect

NS = "datasets"
FILES = 10


def _chunk(k: int, *, version: int = 0, second: str) -> pl.DataFrame:
    n = list(range(100 * k, 100 * k + 100))
    return pl.DataFrame(
        {
            "region": ["eu"] * len(n),  # the first key column: one value in every file
            "n": n if second == "int" else [0] * len(n),
            "code": [f"c{k:02d}-{i:03d}" for i in range(len(n))],
            "v": [i * 10 + version for i in n],
        }
    )


def _candidates(store: IcebergStore, spec: DatasetSpec, frame: pl.DataFrame) -> int:
    table = store.load(spec)
    assert table is not None
    return len(prune_by_keys(table, spec, frame, list(table.scan().plan_files())))


@pytest.mark.parametrize(
    ("second", "key"), [("int", ("region", "n")), ("str", ("region", "n", "code"))]
)
def test_an_upsert_reads_only_files_every_key_column_admits(
    catalog: Any, pg_db_url: str, second: str, key: tuple[str, ...]
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    name = f"pruned_{second}"
    appended = DatasetSpec(name=name, primary_key=key, strategy="append_always")
    chunks = [_chunk(k, second=second) for k in range(FILES)]
    for chunk in chunks:
        store.write(appended, chunk)
    upsert = DatasetSpec(name=name, primary_key=key)
    batch = _chunk(7, version=1, second=second).head(20)
    # the first key column alone admits every file; the next key column admits one
    assert _candidates(store, upsert, batch) == 1
    base = pl.concat(chunks)
    for rerun in range(2):
        result = store.write(upsert, batch)
        assert (result.rows_updated, result.files_rewritten) == ((0, 0) if rerun else (20, 1))
        assert_same_multiset(
            store.read(upsert), expect("snapshot_replace", base, batch, list(key)).table
        )
