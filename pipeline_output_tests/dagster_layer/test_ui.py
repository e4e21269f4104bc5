"""The UI works for real: dagster-webserver on a free localhost port, Postgres-backed instance, the
demo code location; a materialisation launched through GraphQL runs to SUCCESS in a subprocess and
writes the Iceberg table, and the run's metadata is visible through GraphQL and the instance."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pytest

from pipeline_output.infra.settings import Settings, to_sqlalchemy_url
from pipeline_output_tests.processes import end_leftovers, free_port

REPO = Path(__file__).resolve().parents[2]
WEBSERVER = Path(sys.executable).parent / "dagster-webserver"
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180

ASSET_METADATA = """
query ($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    __typename
    ... on Asset {
      assetMaterializations(limit: 1) {
        runId
        metadataEntries {
          label
          ... on TextMetadataEntry { text }
          ... on IntMetadataEntry { intValue }
        }
      }
    }
  }
}
"""


def _graphql(port: int, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]  # type: ignore[no-any-return]


def _wait_for_server(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster-webserver exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                if json.loads(r.read()).get("dagster_webserver_version"):
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"dagster-webserver not up after {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


def test_materialisation_launched_through_the_webserver_graphql_api_writes_iceberg(
    settings_env: Settings, pg_db_url: str, catalog: Any, tmp_path: Path
) -> None:
    from dagster_graphql import DagsterGraphQLClient

    from pipeline_output.demo import shop_data

    shop_data.seed(pg_db_url)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    storage_url = to_sqlalchemy_url(pg_db_url, driver="psycopg2")  # dagster-postgres: psycopg2
    # DefaultRunCoordinator: launchRun starts the run at once (the queued one needs the daemon).
    (dagster_home / "dagster.yaml").write_text(
        f"storage:\n  postgres:\n    postgres_url: {json.dumps(storage_url)}\n"
        "run_coordinator:\n  module: dagster.core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n"
        "      module_name: pipeline_output.demo.code_location\n"
        f"      working_directory: {json.dumps(str(REPO))}\n"
    )
    env = dict(os.environ, DAGSTER_HOME=str(dagster_home))
    port = free_port()
    log = tmp_path / "webserver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(WEBSERVER), "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its code-server children go down with it
        )
    try:
        _wait_for_server(port, proc, log)
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        run_id = client.submit_job_execution("__ASSET_JOB", asset_selection=["active_products"])
        deadline = time.monotonic() + RUN_TIMEOUT_S
        status = client.get_run_status(run_id)
        while status.value not in ("SUCCESS", "FAILURE", "CANCELED"):
            assert time.monotonic() < deadline, f"run {run_id} still {status.value}"
            time.sleep(0.5)
            status = client.get_run_status(run_id)
        assert status.value == "SUCCESS", log.read_text()[-5000:]

        data = _graphql(port, ASSET_METADATA, {"path": ["active_products"]})
        [mat] = data["assetOrError"]["assetMaterializations"]
        assert mat["runId"] == run_id
        entries = {e["label"]: e.get("text", e.get("intValue")) for e in mat["metadataEntries"]}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        end_leftovers(tmp_path)

    with psycopg.connect(pg_db_url) as conn:
        active = conn.execute(
            "SELECT product_id FROM shop.raw_products WHERE active ORDER BY product_id"
        ).fetchall()
    table = catalog.load_table("datasets.active_products")
    frame = pl.from_arrow(table.scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    assert sorted(frame["product_id"].to_list()) == [r[0] for r in active]
    snapshot = table.current_snapshot()
    assert snapshot is not None

    assert entries["write_mode"] == "replace"
    assert entries["why"] == "first deploy"
    assert entries["dagster/row_count"] == len(active)
    assert entries["iceberg/snapshot_id"] == str(snapshot.snapshot_id)
    assert entries["dagster/table_name"] == "default.datasets.active_products"

    instance = dg.DagsterInstance.from_config(str(dagster_home))
    try:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        event = instance.get_latest_materialization_event(dg.AssetKey("active_products"))
        assert event is not None and event.run_id == run_id
        write_mode = event.asset_materialization.metadata["write_mode"]  # type: ignore[union-attr]
        assert getattr(write_mode, "value", write_mode) == "replace"
    finally:
        instance.dispose()
