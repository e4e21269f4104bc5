"""Embedded Postgres: reuse, crash recovery, clean stop, unix socket only, short private socket dir."""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pipeline_output.infra import embedded_pg


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pg"
    try:
        yield path
    finally:
        embedded_pg.stop(data_dir=path)
        assert embedded_pg.postgres_pids(data_dir=path) == []


def _wait_gone(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split()[2] == "Z":  # a zombie nobody reaps is gone for us
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still running")


def test_start_twice_reuses_the_running_server(data_dir: Path) -> None:
    url = embedded_pg.start(data_dir=data_dir)
    first = embedded_pg.status(data_dir=data_dir)
    assert first.running and first.pid is not None
    assert embedded_pg.start(data_dir=data_dir) == url
    assert embedded_pg.status(data_dir=data_dir).pid == first.pid
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT current_database(), current_setting('listen_addresses')"
        ).fetchone()
    assert row == (embedded_pg.DATABASE, "")  # project database; no TCP listener
    assert first.socket_dir == data_dir
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700


def test_stale_pid_file_after_sigkill_is_recovered(data_dir: Path) -> None:
    url = embedded_pg.start(data_dir=data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE survivor (x int)")
        conn.execute("INSERT INTO survivor VALUES (42)")
    old = embedded_pg.status(data_dir=data_dir).pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    _wait_gone(old)
    assert (data_dir / "postmaster.pid").exists()  # the crash left its pid file behind
    assert not embedded_pg.status(data_dir=data_dir).running

    url_again = embedded_pg.start(data_dir=data_dir)
    new = embedded_pg.status(data_dir=data_dir)
    assert new.running and new.pid != old
    with psycopg.connect(url_again) as conn:
        assert conn.execute("SELECT x FROM survivor").fetchone() == (42,)


def test_a_server_whose_socket_file_was_removed_is_reported_unreachable_and_restarted(
    data_dir: Path,
) -> None:
    """A running server whose socket file is gone (removed by hand or by a temp-file cleaner)
    cannot be connected to: `status` says so, and the next `start` restarts it instead of
    handing out a URL nothing answers on."""
    url = embedded_pg.start(data_dir=data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE survivor (x int)")
        conn.execute("INSERT INTO survivor VALUES (7)")
    old = embedded_pg.status(data_dir=data_dir)
    assert old.running and old.reachable and old.socket_dir is not None
    (old.socket_dir / ".s.PGSQL.5432").unlink()
    gone = embedded_pg.status(data_dir=data_dir)
    assert gone.running and not gone.reachable and gone.pid == old.pid
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()

    assert embedded_pg.start(data_dir=data_dir) == url
    new = embedded_pg.status(data_dir=data_dir)
    assert new.reachable and new.pid != old.pid
    assert old.pid is not None
    _wait_gone(old.pid)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM survivor").fetchone() == (7,)


def test_stop_leaves_no_process(data_dir: Path) -> None:
    url = embedded_pg.start(data_dir=data_dir)
    with psycopg.connect(url, autocommit=True) as conn:  # a live backend too
        conn.execute("SELECT 1")
        assert embedded_pg.postgres_pids(data_dir=data_dir)
        assert embedded_pg.stop(data_dir=data_dir) is True
    assert embedded_pg.postgres_pids(data_dir=data_dir) == []
    assert not embedded_pg.status(data_dir=data_dir).running
    assert embedded_pg.stop(data_dir=data_dir) is False


def test_long_data_dir_gets_a_short_private_socket_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / ("d" * 90) / "pg"
    try:
        url = embedded_pg.start(data_dir=data_dir)
        current = embedded_pg.status(data_dir=data_dir)
        assert current.socket_dir is not None and current.socket_dir != data_dir
        assert len(str(current.socket_dir)) < 60
        assert stat.S_IMODE(current.socket_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(current.socket_dir.parent.stat().st_mode) == 0o711
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        embedded_pg.stop(data_dir=data_dir)
    assert embedded_pg.postgres_pids(data_dir=data_dir) == []
