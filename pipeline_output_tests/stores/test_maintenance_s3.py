"""Table maintenance on the REST catalog over S3 (SeaweedFS): compaction, expiry and orphan
removal read and delete objects, not local files — deletions go out as S3 multi-object deletes of
at most 1,000 keys (`orphans.delete_files`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import polars as pl
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.iceberg.maintenance.orphans import DELETE_BATCH, delete_files
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.seaweed import SeaweedFS, unique_namespace


@pytest.fixture
def s3_store(seaweedfs: SeaweedFS, pg_db_url: str) -> Iterator[IcebergStore]:
    catalog = seaweedfs.catalog()
    namespace = unique_namespace("maint")
    catalog.create_namespace(namespace)
    yield IcebergStore(catalog, namespace, lock=AdvisoryLock(pg_db_url))


def keys_under(seaweedfs: SeaweedFS, location: str) -> set[str]:
    parsed = urlparse(location)
    client = seaweedfs.s3_client()
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=parsed.netloc, Prefix=parsed.path.lstrip("/")
    ):
        keys.update(obj["Key"] for obj in page.get("Contents", []))
    return keys


def test_compaction_expiry_and_orphan_removal_on_s3_leave_only_the_compacted_table(
    s3_store: IcebergStore, seaweedfs: SeaweedFS
) -> None:
    spec = DatasetSpec(name="events", primary_key=("id",), strategy="append_always")
    frames = [
        pl.DataFrame({"id": list(range(w * 10, w * 10 + 10)), "v": [f"w{w}"] * 10})
        for w in range(6)
    ]
    for frame in frames:
        s3_store.write(spec, frame)
    table: Any = s3_store.load(spec)
    location = table.location()
    stray = f"{location.rstrip('/')}/data/stray-from-a-killed-write.parquet"
    parsed = urlparse(stray)
    seaweedfs.s3_client().put_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"), Body=b"x")
    before = keys_under(seaweedfs, location)

    compacted = s3_store.compact(spec)
    expired = s3_store.expire_snapshots(spec, older_than=timedelta(0))
    orphans = s3_store.remove_orphans(spec, grace_s=0)

    assert compacted.files_rewritten == 6 and compacted.files_added == 1
    assert expired.snapshots_expired == 6 and expired.files_deleted > 6
    assert orphans.files == 1
    after = keys_under(seaweedfs, location)
    data = sorted(k for k in after if k.endswith(".parquet"))
    assert len(data) == 1 and "stray" not in data[0]
    assert len(after) < len(before) - 6
    assert_same_multiset(s3_store.read(spec), pl.concat(frames))


def test_s3_deletes_go_out_in_batches_of_at_most_a_thousand_keys_and_skip_missing_ones(
    s3_store: IcebergStore, seaweedfs: SeaweedFS
) -> None:
    spec = DatasetSpec(name="bulk", primary_key=("id",), strategy="append_always")
    s3_store.write(spec, pl.DataFrame({"id": [1]}))
    table: Any = s3_store.load(spec)
    folder = urlparse(f"{table.location().rstrip('/')}/data/bulk/")
    client = seaweedfs.s3_client()
    n = DELETE_BATCH * 2 + 5
    keys = [f"{folder.path.lstrip('/')}f{i:05d}" for i in range(n)]
    for key in keys:
        client.put_object(Bucket=folder.netloc, Key=key, Body=b"")
    locations = [f"s3://{folder.netloc}/{k}" for k in keys]

    deleted, failed = delete_files(
        [*locations, f"s3://{folder.netloc}/{folder.path.lstrip('/')}never-written"],
        dict(table.io.properties),
    )

    assert failed == []
    assert deleted >= n
    assert keys_under(seaweedfs, f"s3://{folder.netloc}{folder.path}") == set()
    assert_same_multiset(s3_store.read(spec), pl.DataFrame({"id": [1]}))
