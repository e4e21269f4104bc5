"""Secrets: a password in the Postgres URL or a catalog property never shows in logs, Iceberg
metadata, the ledger, errors or `pipeline-output env`; the embedded server listens on a unix socket
in a 0700 directory only (no TCP).

The test server trusts its unix socket, so a URL carrying a password still connects: the password
travels through every code path without being needed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import polars as pl
import psutil
import psycopg
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.settings import Settings, get_settings
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.services.runtime import settings_catalog
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.reliability.report import record

SECRET = "S3cr3t-Pw-d0-not-leak"
CATALOG_SECRET = "AKIA-catalog-secret-value"
CLI = str(Path(sys.executable).with_name("pipeline-output"))


def _with_password(url: str) -> str:
    assert url.startswith("postgresql://postgres@"), url
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


@pytest.fixture
def secret_env(settings_env: Settings, pg_db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    url = _with_password(pg_db_url)
    monkeypatch.setenv("PIPELINE_OUTPUT_PG_URL", url)
    return url


def _dump_text(root: Path) -> str:
    out = []
    for path in root.rglob("*"):
        if path.is_file():
            out.append(path.read_bytes().decode("latin-1"))
    return "\n".join(out)


def test_password_absent_from_logs_metadata_ledger_and_results(
    secret_env: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = get_settings()
    url = settings.control_plane_url()
    assert SECRET in url  # the password is really in play
    ice = IcebergStore(settings_catalog(settings), settings.namespace)
    pub = Publisher(iceberg=ice, postgres=PostgresStore(url))
    spec = DatasetSpec(name="secretive", primary_key=("id",))
    frame = pl.DataFrame({"id": [1, 2], "v": ["a", "b"]})
    out = pub.publish(spec, frame, mode=ResolvedMode("dual", "run config"), run_id="r1")
    out2 = pub.publish(spec, frame.head(1), mode=ResolvedMode("dual", "run config"), run_id="r2")
    texts = [caplog.text, *capfd.readouterr()]
    texts += [repr(r.as_dict()) for o in (out, out2) for r in o.results.values()]
    table = ice.load(spec)
    assert table is not None
    texts.append(repr(table.properties))
    texts += [repr(s.summary) for s in table.snapshots()]
    texts.append(_dump_text(settings.home))  # warehouse: metadata JSON, manifests, data files
    with psycopg.connect(url) as conn:
        for (name,) in conn.execute(
            "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) "
            "FROM information_schema.tables WHERE table_schema NOT IN "
            "('pg_catalog', 'information_schema')"
        ).fetchall():
            rows = conn.execute(f"SELECT * FROM {name}").fetchall()
            texts.append(repr(rows))
    leaks = [t[:200] for t in texts if SECRET in t]
    assert not leaks, leaks
    record(
        "secrets: Postgres password through a dual publish",
        places_checked=len(texts),
        leaks=0,
        command="pytest pipeline_output_tests/reliability/test_secrets.py",
    )


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def test_password_absent_from_connection_errors(settings_env: Settings, tmp_path: Path) -> None:
    bad = f"postgresql://postgres:{SECRET}@/nodb?host={tmp_path}/no-such-socket-dir"
    failures: list[BaseException] = []
    with pytest.raises(Exception) as settings_error:
        get_settings(
            {"PIPELINE_OUTPUT_PG_URL": bad, "PIPELINE_OUTPUT_HOME": str(tmp_path)}
        ).control_plane_url()
    failures.append(settings_error.value)
    with pytest.raises(Exception) as store_error:
        PostgresStore(bad).write(DatasetSpec(name="x"), pl.DataFrame({"a": [1]}))
    failures.append(store_error.value)
    from pipeline_output.infra.locks import AdvisoryLock

    with pytest.raises(Exception) as lock_error, AdvisoryLock(bad).hold("iceberg:x"):
        pass
    failures.append(lock_error.value)
    for exc in failures:
        assert SECRET not in _error_text(exc), _error_text(exc)


def test_env_command_masks_pg_and_catalog_secrets(
    secret_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = subprocess.run(
        [CLI, "env"], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert "***" in proc.stdout
    # a pyiceberg catalog configured with a password in its URI and an S3 secret key
    sa_url = secret_env.replace("postgresql://", "postgresql+psycopg://", 1)
    env = dict(os.environ)
    env.update(
        {
            "PYICEBERG_CATALOG__DEFAULT__TYPE": "sql",
            "PYICEBERG_CATALOG__DEFAULT__URI": sa_url,
            "PYICEBERG_CATALOG__DEFAULT__WAREHOUSE": f"file://{Path.cwd()}/wh",
            "PYICEBERG_CATALOG__DEFAULT__S3__SECRET_ACCESS_KEY": CATALOG_SECRET,
        }
    )
    proc = subprocess.run([CLI, "env"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout + proc.stderr
    assert SECRET not in shown and CATALOG_SECRET not in shown, shown


def test_embedded_postgres_listens_only_on_a_private_unix_socket(pg_url: str) -> None:
    if os.environ.get("PIPELINE_OUTPUT_TEST_PG_URL"):
        pytest.skip("an external test server is not the embedded one")
    host = parse_qs(urlparse(pg_url).query)["host"][0]
    sock_dir = Path(host)
    assert (sock_dir.stat().st_mode & 0o777) == 0o700, oct(sock_dir.stat().st_mode)
    socket_file = sock_dir / ".s.PGSQL.5432"
    assert socket_file.exists()
    assert (socket_file.stat().st_mode & 0o077) == 0, oct(socket_file.stat().st_mode)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        # ask for the backend's parent while the connection (and so the backend) still lives
        postmaster = psutil.Process(pid).parent()
    assert postmaster is not None
    tcp: list[Any] = [
        c for c in postmaster.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
    ]
    assert tcp == [], tcp
