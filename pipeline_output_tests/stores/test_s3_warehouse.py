"""The native arm on an object-store warehouse: a real S3-compatible server (moto's server mode) on
127.0.0.1, a pyiceberg SQL catalog on the test Postgres with `warehouse=s3://...`, configured only
through pyiceberg's standard properties (`s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`,
`s3.region`, `s3.force-virtual-addressing`).

Every write mode is run twice against it and checked by the shared oracle harness (contents equal to
the polars oracle, counters, one snapshot per changing write, summary markers); the data files are
checked to be objects in the bucket, not local files. The doctor finds and removes orphan objects.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec
from pipeline_output.infra.settings import catalog_env_prefix, get_settings, to_sqlalchemy_url
from pipeline_output.services.doctor import find_orphans, remove_orphans
from pipeline_output.services.runtime import settings_catalog
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output_tests.iceberg_harness import (
    NS,
    WINDOW,
    Harness,
    base,
    customers,
    redeploy_rows,
    scored_batches,
    spec_for,
)
from pipeline_output_tests.oracle import assert_same_multiset

BUCKET = "po-warehouse"
KEY_ID = "testing-key"
SECRET = "testing-secret"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """`http://127.0.0.1:<port>` of a moto S3 server with the bucket `po-warehouse` created."""
    try:
        import boto3  # noqa: F401  (s3_client needs it: skip here when it is missing)
        from botocore.exceptions import EndpointConnectionError
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # the dev extra brings moto[server]
        pytest.skip(
            f"moto[server] is not installed, no S3-compatible server to test against: {exc}"
        )
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        server.start()
    except Exception as exc:  # any failure to start means: nothing to test against
        pytest.skip(f"moto's S3 server could not start on 127.0.0.1:{port}: {exc!r}")
    try:
        client = s3_client(endpoint)
        try:
            client.create_bucket(Bucket=BUCKET)
        except EndpointConnectionError as exc:  # the server thread never listened
            pytest.skip(f"moto's S3 server is not reachable at {endpoint}: {exc}")
        yield endpoint
    finally:
        server.stop()


def s3_properties(endpoint: str) -> dict[str, str]:
    """pyiceberg's standard FileIO properties for an S3-compatible endpoint (path-style)."""
    return {
        "s3.endpoint": endpoint,
        "s3.access-key-id": KEY_ID,
        "s3.secret-access-key": SECRET,
        "s3.region": REGION,
        "s3.force-virtual-addressing": "false",
    }


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client of the test server, with the test credentials."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name=REGION,
    )


def list_objects(endpoint: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in (
        s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    ):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return keys


@pytest.fixture
def warehouse_prefix() -> str:
    """A per-test key prefix in the shared bucket."""
    return f"wh-{uuid.uuid4().hex[:10]}"


# conftest's `fresh_catalog` (and so `catalog` and the harness `h`) reads these two: overridden here,
# every catalog handle of this module keeps its warehouse in the bucket of the moto server.
@pytest.fixture
def catalog_warehouse(warehouse_prefix: str) -> str:
    """Overrides conftest's: `fresh_catalog` handles keep their warehouse in the S3 bucket."""
    return f"s3://{BUCKET}/{warehouse_prefix}"


@pytest.fixture
def catalog_properties(s3_endpoint: str) -> dict[str, str]:
    """Overrides conftest's: `fresh_catalog` handles reach the bucket through the test server."""
    return s3_properties(s3_endpoint)


def window_rows() -> pl.DataFrame:
    """Inside (10, 20]: 15..20 changed, 11..14 absent (sync/replace delete them), 100 new; the
    row with seq 10 (low bound) stays untouched."""
    return pl.concat([customers(range(15, 21), version=2), customers([100], seq=[20])])


# (write mode, strategy, window?) — every write mode the store implements.
WRITE_MODES = [
    ("replace", "replace", False),
    ("upsert", "snapshot_replace", False),
    ("append", "append_always", False),
    ("append_new", "append_new", False),
    ("sync", "sync", False),
    ("windowed-replace", "replace", True),
    ("windowed-sync", "sync", True),
]


@pytest.mark.parametrize(
    ("write_mode", "strategy", "windowed"), WRITE_MODES, ids=[m[0] for m in WRITE_MODES]
)
def test_every_write_mode_on_s3_matches_the_oracle_twice_with_one_snapshot_per_write(
    h: Harness,
    s3_endpoint: str,
    warehouse_prefix: str,
    write_mode: str,
    strategy: str,
    windowed: bool,
) -> None:
    spec = spec_for(strategy, delta=windowed, name=f"c_{strategy}")
    first, _ = h.write_and_check(spec, base(), run_id="deploy")
    assert first.write_mode == "replace" and first.first_deploy

    data = window_rows() if windowed else redeploy_rows()
    window = WINDOW if windowed else None
    expected_mode = write_mode.removeprefix("windowed-")
    results = []
    for attempt in ("run-1", "run-2"):
        res, exp = h.write_and_check(spec, data, window=window, run_id=attempt)
        assert res.write_mode == expected_mode
        results.append((res, exp))

    (res1, exp1), (res2, _) = results
    assert res1.snapshot_id is not None
    if strategy == "append_always":
        assert h.raw(spec).height == 40 + 2 * data.height
    else:
        assert_same_multiset(h.raw(spec), exp1.table)  # the second run leaves the same table
    if strategy in ("snapshot_replace", "append_new", "sync"):
        assert res2.snapshot_id is None, "an identical rerun of a merge must not commit"

    # Everything lives in the bucket: table location, metadata and data files.
    table = h.table(spec)
    assert table.location().startswith(f"s3://{BUCKET}/{warehouse_prefix}/")
    assert table.metadata_location.startswith("s3://")
    objects = list_objects(s3_endpoint, f"{warehouse_prefix}/{NS}/{spec.name}/")
    data_files = {
        f"s3://{BUCKET}/{key}" for key in objects if key.endswith(".parquet") and "/data/" in key
    }
    live = {task.file.file_path for task in table.scan().plan_files()}
    assert live and live <= data_files


def test_first_deploy_and_read_of_a_window_on_s3(h: Harness) -> None:
    spec = spec_for("snapshot_replace", delta=True, name="c_snapshot_replace")
    h.write_and_check(spec, base(), run_id="deploy")
    got = h.store(h.fresh()).read(spec, window=WINDOW)
    assert_same_multiset(got, base().filter((pl.col("seq") > 10) & (pl.col("seq") <= 20)))


def test_s3_warehouse_configured_through_pyiceberg_env_vars_only(
    settings_env: Any, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, pg_db_url: str
) -> None:
    """`settings_catalog(get_settings())` from `PYICEBERG_CATALOG__DEFAULT__*` alone writes to S3."""
    prefix = catalog_env_prefix("default")
    monkeypatch.setenv(prefix + "TYPE", "sql")
    monkeypatch.setenv(prefix + "URI", to_sqlalchemy_url(pg_db_url, driver="psycopg"))
    wh = f"wh-env-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(prefix + "WAREHOUSE", f"s3://{BUCKET}/{wh}")
    for key, value in s3_properties(s3_endpoint).items():
        monkeypatch.setenv(prefix + key.upper().replace(".", "__").replace("-", "_"), value)
    settings = get_settings()
    cat = settings_catalog(settings)
    try:
        from pipeline_output import IcebergStore
        from pipeline_output.infra.locks import AdvisoryLock

        store = IcebergStore(cat, settings.namespace, lock=AdvisoryLock(pg_db_url))
        spec = spec_for("snapshot_replace", name="c_snapshot_replace")
        store.write(spec, base(), run_id="env")
        res = store.write(spec, redeploy_rows(), run_id="env-2")
        assert res.write_mode == "upsert" and res.rows_total_after == 60
        assert store.load(spec).location().startswith(f"s3://{BUCKET}/{wh}/")  # type: ignore[union-attr]
        assert any(k.endswith(".parquet") for k in list_objects(s3_endpoint, f"{wh}/"))
    finally:
        cat.engine.dispose()


def test_doctor_finds_and_removes_orphan_objects_on_s3(
    h: Harness, s3_endpoint: str, warehouse_prefix: str, tmp_path: Path
) -> None:
    store = h.store()
    spec = DatasetSpec(name="scores", primary_key="id", strategy="replace")
    first = store.replace_streaming(spec, scored_batches(fail_after=99))
    with pytest.raises(RuntimeError, match="predict blew up"):
        store.replace_streaming(spec, scored_batches(fail_after=3))
    assert h.table(spec).current_snapshot().snapshot_id == first.snapshot_id

    cat = h.fresh()
    # the failed write deleted the objects of batches 0..2 itself
    assert find_orphans(cat, NS, grace_s=0) == []
    # what a writer killed between writing its data files and its commit leaves behind
    table = h.table(spec)
    writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
    for i in range(3):
        writer.write(pl.DataFrame({"id": [1000 + i], "v": [0.5]}))
    assert find_orphans(cat, NS, grace_s=3600) == []  # too young: never touched
    orphans = find_orphans(cat, NS, grace_s=0)
    assert sorted(o.path for o in orphans) == sorted(writer.written), orphans
    assert all(o.path.startswith(f"s3://{BUCKET}/{warehouse_prefix}/") for o in orphans)
    assert "s3.secret-access-key" not in repr(orphans[0])
    live = {task.file.file_path for task in h.table(spec).scan().plan_files()}
    assert not live & {o.path for o in orphans}
    assert remove_orphans(orphans, store=store) == 3
    assert find_orphans(cat, NS, grace_s=0) == []
    remaining = {
        f"s3://{BUCKET}/{k}" for k in list_objects(s3_endpoint, warehouse_prefix) if "/data/" in k
    }
    assert live <= remaining and not remaining & {o.path for o in orphans}
    assert h.raw(spec).height == 50  # referenced files untouched
