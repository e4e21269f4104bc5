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

import polars as pl

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output_tests.iceberg_harness import NS, Harness

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
