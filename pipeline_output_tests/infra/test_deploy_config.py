"""`deploy/dagster.yaml` is a valid production instance: loaded with Dagster's own loader against the
test Postgres (dagster-postgres storage), it yields the queued run coordinator with its limits, run
retries and telemetry off, and the storage works (a run can be created, queued and read back)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from pipeline_output.infra.settings import to_sqlalchemy_url

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml"


@pytest.fixture
def deploy_home(tmp_path: Path, pg_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY, home / "dagster.yaml")
    url = to_sqlalchemy_url(pg_db_url, driver="psycopg2")
    monkeypatch.setenv("PIPELINE_OUTPUT_DAGSTER_PG_URL", url)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def instance(deploy_home: Path) -> Iterator[dg.DagsterInstance]:
    inst = dg.DagsterInstance.from_config(str(deploy_home))
    try:
        yield inst
    finally:
        inst.dispose()


def test_deploy_instance_uses_postgres_storage_queued_runs_retries_and_no_telemetry(instance):
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import PostgresRunStorage

    assert isinstance(instance.run_storage, PostgresRunStorage)
    coordinator = instance.run_coordinator
    assert isinstance(coordinator, QueuedRunCoordinator)
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None
    assert queue.max_concurrent_runs == 8
    limits = {lim["key"]: lim for lim in queue.tag_concurrency_limits}
    assert limits["pipeline-output/dataset"]["limit"] == 1
    assert limits["pipeline-output/dataset"]["value"] == {"applyLimitPerUniqueValue": True}
    assert instance.run_retries_enabled is True
    assert instance.run_retries_max_retries == 2
    assert instance.run_monitoring_enabled is True
    assert instance.telemetry_enabled is False


def test_deploy_instance_storage_round_trips_a_queued_run(instance):
    @dg.op
    def noop() -> None:
        return None

    @dg.job
    def tiny() -> None:
        noop()

    run = instance.create_run_for_job(
        tiny, tags={"pipeline-output/dataset": "orders"}, status=dg.DagsterRunStatus.NOT_STARTED
    )
    stored = instance.get_run_by_id(run.run_id)
    assert stored is not None and stored.tags["pipeline-output/dataset"] == "orders"
    instance.delete_run(run.run_id)


def test_dagster_instance_info_accepts_the_deploy_config(deploy_home):
    out = subprocess.run(
        [sys.executable, "-m", "dagster", "instance", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # It printed the instance configuration and migrated/read Postgres storage schemas.
    for expected in ("max_retries: 2", "enabled: false", "run_storage"):
        assert expected in out.stdout, out.stdout[-3000:]
