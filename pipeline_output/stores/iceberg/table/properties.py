"""Names the native arm shares: the `pipeline-output.` property prefix, the table properties a
new table gets, internal column names, defaults, and the arm's declared capabilities."""

from __future__ import annotations

from typing import Any

from pipeline_output.contract.store_protocol import KEY_TYPES, Capabilities

PROPERTY_PREFIX = "pipeline-output."
# A write's metadata work must not grow with the table's history (issue 18): merge small manifests
# on commit and keep only the last 25 metadata.json files. Tables created before these defaults
# get the ones they do not set on their next write (`manifests.upgrade_properties`).
MAINTENANCE_FREE_PROPERTIES = {
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "16",
    # merged manifests of 1 MiB, not Iceberg's 8: a copy-on-write removal rewrites the manifest
    # holding the file, and a keyed write skips the manifests whose partition ranges rule its keys
    # out, so smaller manifests make both cheaper (benchmarks/README.md, "Manifest pruning")
    "commit.manifest.target-size-bytes": str(1024 * 1024),
    "write.metadata.delete-after-commit.enabled": "true",
    # a table written per window commits often: 25 earlier metadata files (Iceberg's default is
    # 100) keep about a day of hourly windows' table states, at a quarter of the bytes
    "write.metadata.previous-versions-max": "25",
    # metadata.json lists every snapshot: gzip'd (by the project's SQL catalog) it is ~10x smaller
    "write.metadata.compression-codec": "gzip",
}
TABLE_PROPERTIES = {
    **MAINTENANCE_FREE_PROPERTIES,
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": "1",
    "write.target-file-size-bytes": str(512 * 1024 * 1024),
    "commit.retry.num-retries": "10",
    "commit.retry.min-wait-ms": "50",
    "commit.retry.max-wait-ms": "5000",
}
DEFAULT_LOCK: Any = object()
READ_THREADS = 4
POS_COLUMN = "__po_pos__"  # every internal column name starts with frames.RESERVED_PREFIX
FILEPOS_COLUMN = "__po_filepos__"  # a row's physical position in its data file (merge-on-read)
NEW_PREFIX = "__po_new__"  # the compute's value of column `c` in a merge join is `__po_new__c`

ICEBERG_CAPABILITIES = Capabilities(
    arm="iceberg",
    label="Iceberg arm",
    nested_types=True,  # lists, arrays and structs, to any depth
    max_identifier_length=None,
    max_columns=None,
    scalar_types=None,  # every type `frames.to_polars` leaves (it refuses durations and objects)
    key_types=KEY_TYPES,  # the same rule on both arms (stores/protocol.py)
    advice="",
)
