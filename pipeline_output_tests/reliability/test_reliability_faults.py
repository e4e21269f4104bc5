"""Faults during publish: SIGKILL at each step, the Postgres server restarted mid-run, a read-only
warehouse, a full disk. After each: the table never shows a partial write, the next run converges,
and orphan data files are listed by `pipeline-output doctor` and removed by `--fix`.

Writers run as real subprocesses (`python -c`) resolving the same settings as the test (the
`settings_env` fixture's environment), so a SIGKILL is a real process death mid-write.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import psycopg
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.errors import LockUnavailable
from pipeline_output.infra import embedded_pg
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.infra.settings import Settings
from pipeline_output.services.runtime import settings_catalog
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.reliability.report import record

CLI = str(Path(sys.executable).with_name("pipeline-output"))

WRITER = r"""
import json, sys
import polars as pl
from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.ledger import Ledger
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.infra.settings import get_settings
from pipeline_output.services.runtime import settings_catalog
from pipeline_output.stores.postgres import PostgresStore

name, lo, hi, ver, mode, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
s = get_settings()
url = s.control_plane_url()
ledger = Ledger(url)
ledger.migrate()
if extra == "kill_after_commit":  # killed between the Iceberg commit and the ledger update
    import os, signal
    ledger.deploy_log.record_deploy = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
pub = Publisher(iceberg=IcebergStore(settings_catalog(s), s.namespace), postgres=PostgresStore(url, ledger=ledger), ledger=ledger)
spec = DatasetSpec(name=name, primary_key=("id",), strategy="snapshot_replace")
ids = list(range(lo, hi))
frame = pl.DataFrame({"id": pl.Series(ids, dtype=pl.Int64), "v": [f"v{ver}-{i}" for i in ids]})
out = pub.publish(spec, frame, mode=ResolvedMode(mode, "run config"), run_id=f"r{ver}")
print(json.dumps({arm: r.snapshot_id for arm, r in out.results.items()}))
"""


def expected(*writes: tuple[int, int, int]) -> pl.DataFrame:
    """Upserts applied in order: the last version of every id written."""
    rows: dict[int, str] = {}
    for lo, hi, ver in writes:
        for i in range(lo, hi):
            rows[i] = f"v{ver}-{i}"
    return pl.DataFrame({"id": pl.Series(list(rows), dtype=pl.Int64), "v": list(rows.values())})


def run_writer(
    name: str,
    lo: int,
    hi: int,
    ver: int,
    *,
    mode: str = "iceberg",
    fault: str | None = None,
    extra: str = "-",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    environ = dict(env if env is not None else os.environ)
    environ.pop("PIPELINE_OUTPUT_FAULT", None)
    if fault:
        environ["PIPELINE_OUTPUT_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", WRITER, name, str(lo), str(hi), str(ver), mode, extra],
        env=environ,
        capture_output=True,
        text=True,
        timeout=180,
    )


def doctor(*args: str) -> str:
    proc = subprocess.run(
        [CLI, "doctor", *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def iceberg_rows(settings: Settings, name: str) -> tuple[pl.DataFrame, int | None]:
    cat = settings_catalog(settings)
    table = cat.load_table((settings.namespace, name))
    snap = table.current_snapshot()
    frame = pl.from_arrow(table.scan().to_arrow())
    cat.engine.dispose()
    assert isinstance(frame, pl.DataFrame)
    return frame, snap.snapshot_id if snap else None


def spec(name: str) -> DatasetSpec:
    return DatasetSpec(name=name, primary_key=("id",), strategy="snapshot_replace")


def test_sigkill_after_data_files_written_before_commit_then_doctor_and_rerun(
    settings_env: Settings,
) -> None:
    ok = run_writer("kb", 0, 100, 0)
    assert ok.returncode == 0, ok.stderr
    _, snap = iceberg_rows(settings_env, "kb")
    killed = run_writer("kb", 50, 150, 1, fault="before_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after, snap_after = iceberg_rows(settings_env, "kb")
    assert snap_after == snap  # no partial write: the commit never happened
    assert_same_multiset(after, expected((0, 100, 0)))

    listed = doctor("--grace", "0")
    orphans = [line for line in listed.splitlines() if line.startswith("orphan ")]
    assert orphans and all("datasets.kb" in line for line in orphans), listed
    assert "no orphan data files" in doctor("--grace", "3600")  # too young: never touched

    rerun = run_writer("kb", 50, 150, 1)
    assert rerun.returncode == 0, rerun.stderr
    converged, _ = iceberg_rows(settings_env, "kb")
    assert_same_multiset(converged, expected((0, 100, 0), (50, 150, 1)))

    fixed = doctor("--grace", "0", "--fix")
    assert f"removed {len(orphans)} orphan file(s)" in fixed, fixed
    assert "no orphan data files" in doctor("--grace", "0")
    final, _ = iceberg_rows(settings_env, "kb")
    assert_same_multiset(final, converged)  # referenced files untouched
    record(
        "fault: SIGKILL after data files written, before the Iceberg commit",
        runs=3,
        kills=1,
        orphans_listed=len(orphans),
        orphans_removed=len(orphans),
        rows_lost=0,
        command="pytest pipeline_output_tests/reliability/test_reliability_faults.py -k before_commit",
    )


def test_sigkill_between_iceberg_commit_and_ledger_update_rerun_converges(
    settings_env: Settings,
) -> None:
    assert run_writer("ka", 0, 40, 0).returncode == 0
    killed = run_writer("ka", 20, 60, 1, extra="kill_after_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    committed, snap = iceberg_rows(settings_env, "ka")
    assert_same_multiset(committed, expected((0, 40, 0), (20, 60, 1)))  # whole commit, not part
    rerun = run_writer("ka", 20, 60, 1)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout.strip().splitlines()[-1]) == {"iceberg": None}  # no-op rerun
    final, snap_final = iceberg_rows(settings_env, "ka")
    assert snap_final == snap
    assert_same_multiset(final, committed)
    record(
        "fault: SIGKILL after the Iceberg commit, before the ledger update",
        runs=3,
        kills=1,
        rows_lost=0,
        command="pytest pipeline_output_tests/reliability/test_reliability_faults.py -k ledger_update",
    )


def test_sigkill_in_dual_before_iceberg_commit_leaves_both_arms_unchanged(
    settings_env: Settings,
) -> None:
    assert run_writer("kd", 0, 30, 0, mode="dual").returncode == 0
    killed = run_writer("kd", 10, 50, 1, mode="dual", fault="before_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    url = settings_env.control_plane_url()
    pg = PostgresStore(url)
    ice, _ = iceberg_rows(settings_env, "kd")
    for frame in (ice, pg.read("kd")):
        assert_same_multiset(frame, expected((0, 30, 0)))
    assert run_writer("kd", 10, 50, 1, mode="dual").returncode == 0
    ice, _ = iceberg_rows(settings_env, "kd")
    want = expected((0, 30, 0), (10, 50, 1))
    assert_same_multiset(ice, want)
    assert_same_multiset(pg.read("kd"), want)
    record(
        "fault: SIGKILL in dual mode with the Postgres transaction open",
        runs=3,
        kills=1,
        rows_lost=0,
        command="pytest pipeline_output_tests/reliability/test_reliability_faults.py -k dual",
    )


HOLDER = r"""
import sys, time
from pipeline_output.infra.locks import AdvisoryLock
with AdvisoryLock(sys.argv[1]).hold(sys.argv[2]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_sigkill_while_holding_the_writer_lock_releases_it(settings_env: Settings) -> None:
    url = settings_env.control_plane_url()
    store = IcebergStore(
        settings_catalog(settings_env), settings_env.namespace, lock=AdvisoryLock(url)
    )
    frame = expected((0, 10, 0))
    store.write(spec("kl"), frame)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, f"iceberg:{settings_env.namespace}.kl"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        blocked = IcebergStore(
            settings_catalog(settings_env),
            settings_env.namespace,
            lock=AdvisoryLock(url, timeout_s=0.5),
        )
        with pytest.raises(LockUnavailable, match="timed out"):
            blocked.write(spec("kl"), expected((5, 15, 1)))
        os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    patient = IcebergStore(
        settings_catalog(settings_env), settings_env.namespace, lock=AdvisoryLock(url, timeout_s=20)
    )
    res = patient.write(spec("kl"), expected((5, 15, 1)))
    assert res.lock_wait_s < 10
    with psycopg.connect(url) as conn:
        held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    assert held == (0,)
    rows, _ = iceberg_rows(settings_env, "kl")
    assert_same_multiset(rows, expected((0, 10, 0), (5, 15, 1)))
    record(
        "fault: SIGKILL while holding the writer's advisory lock",
        runs=3,
        kills=1,
        lock_wait_s_after_kill=round(res.lock_wait_s, 3),
        rows_lost=0,
        command="pytest pipeline_output_tests/reliability/test_reliability_faults.py -k holding",
    )


LOOP = r"""
import json, sys, time
import polars as pl
from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.settings import get_settings
from pipeline_output.services.runtime import settings_catalog
from pipeline_output.stores.postgres import PostgresStore

batches = int(sys.argv[1])
spec = DatasetSpec(name="restart", primary_key=("id",), strategy="snapshot_replace")
failures = 0
for b in range(batches):
    ids = list(range(b * 10, b * 10 + 20))
    frame = pl.DataFrame({"id": pl.Series(ids, dtype=pl.Int64), "v": [f"v{b}-{i}" for i in ids]})
    for arm in ("iceberg", "pg"):
        while True:
            try:
                s = get_settings()
                if arm == "iceberg":
                    IcebergStore(settings_catalog(s), s.namespace).write(spec, frame, run_id=f"b{b}")
                else:
                    PostgresStore(s.control_plane_url()).write(spec, frame, run_id=f"b{b}")
                break
            except Exception as exc:
                failures += 1
                print("retry", type(exc).__name__, flush=True)
                time.sleep(0.3)
    print("batch", b, flush=True)
print(json.dumps({"failures": failures}), flush=True)
"""


@pytest.mark.slow
def test_postgres_server_restarted_mid_run_next_attempts_converge(
    settings_env: Settings, tmp_path: Path
) -> None:
    root = Path(tempfile.mkdtemp(prefix="po-restart-"))
    data_dir = root / "data"
    try:
        url = embedded_pg.start(data_dir=data_dir)
        env = dict(
            os.environ, PIPELINE_OUTPUT_PG_URL=url, PIPELINE_OUTPUT_HOME=str(tmp_path / "h2")
        )
        batches = 12
        proc = subprocess.Popen(
            [sys.executable, "-c", LOOP, str(batches)], env=env, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        restarts = 0
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("batch") and int(line.split()[1]) in (3, 7):
                embedded_pg.stop(data_dir=data_dir)
                time.sleep(0.5)
                assert embedded_pg.start(data_dir=data_dir) == url
                restarts += 1
        assert proc.wait(timeout=300) == 0, lines
        failures = json.loads(lines[-1])["failures"]
        want = expected(*[(b * 10, b * 10 + 20, b) for b in range(batches)])
        from pyiceberg.catalog.sql import SqlCatalog

        from pipeline_output.infra.settings import to_sqlalchemy_url

        cat = SqlCatalog(
            "default",
            uri=to_sqlalchemy_url(url, driver="psycopg"),
            warehouse=f"file://{tmp_path}/h2/warehouse",
        )
        ice = pl.from_arrow(cat.load_table(("datasets", "restart")).scan().to_arrow())
        cat.engine.dispose()
        assert_same_multiset(ice, want)  # type: ignore[arg-type]
        assert_same_multiset(PostgresStore(url).read("restart"), want)
        record(
            "fault: embedded Postgres stopped and restarted mid-run (writer retries)",
            runs=batches * 2,
            restarts=restarts,
            failed_attempts_retried=failures,
            rows_lost=0,
            command="pytest -m slow pipeline_output_tests/reliability/test_reliability_faults.py -k restarted",
        )
    finally:
        embedded_pg.stop(data_dir=data_dir)
        shutil.rmtree(root, ignore_errors=True)


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def test_read_only_warehouse_fails_cleanly_and_next_run_converges(settings_env: Settings) -> None:
    assert run_writer("ro", 0, 20, 0).returncode == 0
    _, snap = iceberg_rows(settings_env, "ro")
    warehouse = settings_env.home / "warehouse"
    how = "read-only bind mount"
    if not (_mount("--bind", str(warehouse), str(warehouse))):
        pytest.skip("cannot bind-mount here (not root?)")
    try:
        if not _mount("-o", "remount,ro,bind", str(warehouse)):
            pytest.skip("cannot remount read-only here")
        failed = run_writer("ro", 10, 30, 1)
        assert failed.returncode != 0
        assert "Read-only file system" in failed.stderr, failed.stderr[-2000:]
    finally:
        subprocess.run(["umount", str(warehouse)], check=False)
    rows, snap_after = iceberg_rows(settings_env, "ro")
    assert snap_after == snap
    assert_same_multiset(rows, expected((0, 20, 0)))
    assert run_writer("ro", 10, 30, 1).returncode == 0
    rows, _ = iceberg_rows(settings_env, "ro")
    assert_same_multiset(rows, expected((0, 20, 0), (10, 30, 1)))
    record(
        f"fault: warehouse made read-only ({how})",
        runs=3,
        failed_writes=1,
        rows_lost=0,
        command="pytest pipeline_output_tests/reliability/test_reliability_faults.py -k read_only",
    )


def test_disk_full_for_data_files_fails_cleanly_doctor_frees_and_rerun_converges(
    settings_env: Settings,
) -> None:
    warehouse = settings_env.home / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(warehouse)):
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        assert run_writer("full", 0, 50, 0).returncode == 0
        _, snap = iceberg_rows(settings_env, "full")
        big = subprocess.run(
            [sys.executable, "-c", _BIG_WRITE],
            capture_output=True,
            text=True,
            timeout=180,
            env=dict(os.environ),
        )
        assert big.returncode != 0
        assert "No space left on device" in big.stderr, big.stderr[-2000:]
        rows, snap_after = iceberg_rows(settings_env, "full")
        assert snap_after == snap
        assert_same_multiset(rows, expected((0, 50, 0)))
        listed = doctor("--grace", "0")
        orphans = [line for line in listed.splitlines() if line.startswith("orphan ")]
        fixed = doctor("--grace", "0", "--fix")
        assert "no orphan data files" in doctor("--grace", "0"), fixed
        assert run_writer("full", 25, 75, 1).returncode == 0
        rows, _ = iceberg_rows(settings_env, "full")
        assert_same_multiset(rows, expected((0, 50, 0), (25, 75, 1)))
        record(
            "fault: disk full while writing data files (1 MiB tmpfs warehouse)",
            runs=3,
            failed_writes=1,
            orphans_listed=len(orphans),
            rows_lost=0,
            command="pytest pipeline_output_tests/reliability/test_reliability_faults.py -k disk_full",
        )
    finally:
        subprocess.run(["umount", "-l", str(warehouse)], check=False)


_BIG_WRITE = r"""
import os
import polars as pl
from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.settings import get_settings
from pipeline_output.services.runtime import settings_catalog
s = get_settings()
ids = list(range(1000, 1400))
frame = pl.DataFrame({"id": pl.Series(ids, dtype=pl.Int64), "v": [os.urandom(4000).hex() for _ in ids]})
IcebergStore(settings_catalog(s), s.namespace).write(
    DatasetSpec(name="full", primary_key=("id",), strategy="snapshot_replace"), frame)
"""
