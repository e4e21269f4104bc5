"""Modules loaded on first use (`infra/deferred_imports.py`): a compaction in a fresh process —
the benchmark's path: the store, the SQL catalog, a partitioned table of small files — never
imports `pyarrow.dataset` nor pandas (~50 MB of resident memory), nor urllib3 (the signed S3
client's, `stores/iceberg/table/file_io.py`), although pyiceberg's
`pyiceberg.io.pyarrow`, which imports it at its top, is imported; the module still works, loaded
on its first use, through every name it was bound to."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import polars as pl

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output_tests.iceberg_harness import NS, Harness
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.seaweed import unique_namespace

COMPACT_IN_A_FRESH_PROCESS = """
import json, sys
from pipeline_output import DatasetSpec, Delta, IcebergStore
from pipeline_output.infra.deferred_imports import loaded
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

uri, warehouse, libpq, ns = sys.argv[1:]
store = IcebergStore(FlatSqlCatalog("default", uri=uri, warehouse=warehouse), ns,
                     lock=AdvisoryLock(libpq))
spec = DatasetSpec(name="events", primary_key=("id",), strategy="snapshot_replace",
                   delta=Delta(source="raw", watermark="seq"), partition_by=("region",))
result = store.compact(spec)
out = {"compacted": result.describe(), "pyiceberg.io.pyarrow": "pyiceberg.io.pyarrow" in sys.modules,
       "pyarrow.dataset": loaded("pyarrow.dataset"), "pandas": "pandas" in sys.modules,
       "urllib3": "urllib3" in sys.modules}
import pyarrow.dataset as ds
import pyiceberg.io.pyarrow as iceberg_arrow
files = [t.file.file_path.removeprefix("file://") for t in store.load("events").scan().plan_files()]
out["rows by the module, on first use"] = ds.dataset(files, format="parquet").count_rows()
out["bound by pyiceberg"] = iceberg_arrow.ds.ParquetFileFormat is ds.ParquetFileFormat
out["loaded after"] = loaded("pyarrow.dataset") and "pandas" in sys.modules
print(json.dumps(out))
"""


def test_a_compaction_in_a_fresh_process_never_imports_pyarrow_dataset_nor_pandas(
    h: Harness, catalog_warehouse: str, pg_db_url: str
) -> None:
    spec = DatasetSpec(
        name="events",
        primary_key=("id",),
        strategy="snapshot_replace",
        delta=Delta(source="raw", watermark="seq"),
        partition_by=("region",),
    )
    for w in range(6):
        frame = pl.DataFrame(
            {
                "id": [w * 10 + i for i in range(1, 11)],
                "seq": [w * 10 + i for i in range(1, 11)],
                "region": ["eu", "us"] * 5,
            }
        )
        h.store().write(spec, frame, window=Window(low=w * 10, high=(w + 1) * 10))
    got = subprocess.run(
        [
            sys.executable,
            "-c",
            COMPACT_IN_A_FRESH_PROCESS,
            to_sqlalchemy_url(pg_db_url, driver="psycopg"),
            catalog_warehouse,
            pg_db_url,
            NS,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(got.stdout.strip().splitlines()[-1]) == {
        "compacted": "compact: rewrote 12 data file(s) into 2 file(s)",
        "pyiceberg.io.pyarrow": True,
        "pyarrow.dataset": False,
        "pandas": False,
        "urllib3": False,  # the signed S3 client's (`file_io`), imported on its first use
        "rows by the module, on first use": 60,
        "bound by pyiceberg": True,
        "loaded after": True,
    }


UPSERT_ON_AN_OBJECT_STORE_IN_A_FRESH_PROCESS = """
import json, sys
import polars as pl
from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.deferred_imports import loaded
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.table.catalog import open_catalog

from pyiceberg.io.pyarrow import PyArrowFileIO
made = []  # pyarrow S3 file systems made (each initializes the AWS SDK once a process)
making = PyArrowFileIO._initialize_s3_fs
PyArrowFileIO._initialize_s3_fs = lambda self, netloc: made.append(netloc) or making(self, netloc)

props, libpq, ns = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
store = IcebergStore(open_catalog("default", props, where=str), ns, lock=AdvisoryLock(libpq))
spec = DatasetSpec(name="items", primary_key=("id",), strategy="snapshot_replace",
                   write_strategy_hint="merge-on-read")
batch = pl.DataFrame({"id": list(range(0, 2000, 10)) + list(range(5000, 5100)),
                      "v": ["changed"] * 200 + ["new"] * 100})
result = store.write(spec, batch, run_id="upsert")
print(json.dumps({"updated": result.rows_updated, "inserted": result.rows_inserted,
                  "merge_path": str(result.merge_path), "pandas": "pandas" in sys.modules,
                  "pyarrow.dataset": loaded("pyarrow.dataset"), "s3 file systems": len(made),
                  "botocore": loaded("botocore")}))
"""


def test_a_first_upsert_on_an_object_store_in_a_fresh_process_imports_and_makes_nothing_heavy(
    seaweedfs: Any, pg_db_url: str
) -> None:
    """A process's first upsert into a table on S3 key-scans its candidate file through the
    table's FileIO (`key_scan.ObjectFiles`) without importing `pyarrow.dataset`, whose first
    import imports pandas where it is installed (~0.35 s of that write, 0.51 → 0.13 s in
    benchmarks/results/rest-catalog.md), and reads its manifest list and manifests without making
    pyarrow's S3 file system (the AWS SDK's initialization, ~30 ms); its catalog, SigV4-signed
    with static credentials, opened and committed to without botocore (boto3's import and
    sessions, ~90 ms: `rest_catalog.py`); the table then holds what the oracle says."""
    from pipeline_output import IcebergStore
    from pipeline_output.infra.locks import AdvisoryLock

    ns = unique_namespace("imports")
    spec = DatasetSpec(
        name="items",
        primary_key=("id",),
        strategy="snapshot_replace",
        write_strategy_hint="merge-on-read",
    )
    base = pl.DataFrame({"id": list(range(2000)), "v": ["old"] * 2000})
    store = IcebergStore(seaweedfs.catalog(), ns, lock=AdvisoryLock(pg_db_url))
    store.write(spec, base, run_id="base")
    got = subprocess.run(
        [
            sys.executable,
            "-c",
            UPSERT_ON_AN_OBJECT_STORE_IN_A_FRESH_PROCESS,
            json.dumps(seaweedfs.catalog_properties()),
            pg_db_url,
            ns,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["merge_path"].startswith("key_scan (1 candidate file(s), object-store Parquet")
    assert (out["updated"], out["inserted"]) == (200, 100)
    assert (out["pandas"], out["pyarrow.dataset"]) == (False, False)
    # every file the write read or wrote went by one signed GET or PUT: no pyarrow S3 file system
    assert out["s3 file systems"] == 0
    assert out["botocore"] is False
    batch = pl.DataFrame(
        {
            "id": list(range(0, 2000, 10)) + list(range(5000, 5100)),
            "v": ["changed"] * 200 + ["new"] * 100,
        }
    )
    expected = pl.concat([base.join(batch, on="id", how="anti"), batch])
    table = IcebergStore(seaweedfs.catalog(), ns, lock=AdvisoryLock(pg_db_url)).load(spec)
    assert table is not None
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected)
