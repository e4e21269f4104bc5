"""The pure-Python runtime through the public API only (`from pipeline_output import connect`): on
a fresh database and a fresh catalog it migrates the control plane, creates the namespace, and
the publisher it builds writes and reads a dataset; the reference's Python API example (the file
`docs/example_python_api.py`, quoted verbatim in `docs/reference.md`) is executed as it is (issue
30, item 8).

It used to be impossible: README showed `Publisher(iceberg=..., postgres=..., ledger=...)` but no
ledger was exported, and on a fresh database the obvious `Ledger(url)` raised psycopg's
`UndefinedTable` until the schema existed.
"""

from __future__ import annotations

import ast
import dataclasses
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output_tests.oracle import assert_same_multiset

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "example_python_api.py"
REFERENCE = REPO / "docs" / "reference.md"


def control_plane_schema_exists(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'pipeline_output'"
        ).fetchone()
    return bool(row and row[0])


def iceberg_rows(catalog: Any, identifier: str) -> pl.DataFrame:
    """The table's rows read by a separate pyiceberg catalog handle (not the runtime's)."""
    frame = pl.from_arrow(catalog.load_table(identifier).scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


def test_reference_python_api_example_is_quoted_verbatim_and_uses_only_the_public_api() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert f"```python\n{text}```" in REFERENCE.read_text(encoding="utf-8")
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported == {"os", "polars", "pipeline_output"}


def test_reference_python_api_example_publishes_and_reads_back_on_a_fresh_database(
    pg_db_url: str,
    catalog_warehouse: str,
    fresh_catalog: Callable[[], Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert not control_plane_schema_exists(pg_db_url), "a fresh database"
    monkeypatch.setenv("CONTROL_PLANE_URL", pg_db_url)
    monkeypatch.setenv("CATALOG_URI", to_sqlalchemy_url(pg_db_url, driver="psycopg"))
    monkeypatch.setenv("WAREHOUSE", catalog_warehouse)

    ran = runpy.run_path(str(EXAMPLE), run_name="__main__")
    expected = pl.DataFrame({"order_id": [1, 2, 3], "amount": [9.5, 20.0, 3.25]})
    runtime, result = ran["runtime"], ran["result"]
    try:
        assert control_plane_schema_exists(pg_db_url)
        written = iceberg_rows(fresh_catalog(), "datasets.orders")
        assert_same_multiset(written.select(expected.columns), expected)
        last = runtime.ledger.deploy_log.last_deploy("orders", "iceberg")
        assert last is not None and last.status == "succeeded"
        assert last.snapshot_id == result.primary.snapshot_id
        out = capsys.readouterr().out
        assert out.startswith(f"replace {result.primary.snapshot_id}\n"), out

        # running it again (a second process, the next day) migrates nothing and re-deploys
        again = runpy.run_path(str(EXAMPLE), run_name="__main__")
        again["runtime"].catalog.engine.dispose()
        assert again["result"].primary.noop, "identical rows: snapshot_replace changes nothing"
        assert_same_multiset(iceberg_rows(fresh_catalog(), "datasets.orders"), written)
    finally:
        runtime.catalog.engine.dispose()


def test_connect_with_a_catalog_object_migrates_creates_the_namespace_and_publishes_both_arms(
    pg_db_url: str, fresh_catalog: Callable[[], Any]
) -> None:
    from pipeline_output import DatasetSpec, Runtime, connect

    handle = fresh_catalog()
    assert not control_plane_schema_exists(pg_db_url)
    assert ("sales",) not in handle.list_namespaces()

    runtime = connect(pg_url=pg_db_url, catalog=handle, namespace="sales")
    assert isinstance(runtime, Runtime)
    assert ("sales",) in handle.list_namespaces()
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.namespace = "other"  # type: ignore[misc]

    spec = DatasetSpec(name="totals", primary_key=("region",), strategy="sync", mode="dual")
    frame = pl.DataFrame({"region": ["N", "S", "W"], "revenue": [10.0, 2.5, 7.25]})
    mode = runtime.publisher.resolve(spec)
    out = runtime.publisher.publish(spec, frame, mode=mode, run_id="r1")
    assert set(out.results) == {"iceberg", "pg"}
    assert_same_multiset(iceberg_rows(fresh_catalog(), "sales.totals"), frame)
    assert_same_multiset(runtime.postgres.read(spec), frame)
    assert_same_multiset(runtime.publisher.read(spec, mode=mode), frame)
    for arm in ("iceberg", "pg"):
        last = runtime.ledger.deploy_log.last_deploy("totals", arm)
        assert last is not None and last.status == "succeeded" and last.run_id == "r1"

    # a second runtime on the same control plane: nothing to migrate, it sees the same state
    second = connect(pg_url=pg_db_url, catalog=fresh_catalog(), namespace="sales")
    assert second.ledger.applied_migrations() == runtime.ledger.applied_migrations()
    assert_same_multiset(second.iceberg.read(spec), frame)


def test_connect_refuses_bad_arguments_with_one_line_project_errors(
    pg_db_url: str, fresh_catalog: Callable[[], Any], tmp_path: Path
) -> None:
    from pipeline_output import PipelineOutputError, SettingsError, connect
    from pipeline_output.errors import InvalidArgument, PostgresUnavailable

    handle = fresh_catalog()
    with pytest.raises(SettingsError, match=r"^pg_url: expected a libpq URI"):
        connect(pg_url="mysql://me@host/db", catalog=handle)
    with pytest.raises(PostgresUnavailable, match=r"control plane .*cannot connect"):
        connect(pg_url=f"postgresql://me@/db?host={tmp_path}", catalog=handle)
    with pytest.raises(SettingsError, match=r"^namespace: 'bad name' is not a valid namespace"):
        connect(pg_url=pg_db_url, catalog=handle, namespace="bad name")
    with pytest.raises(SettingsError, match=r"^catalog\['type'\]: unknown catalog type 'nope'"):
        connect(pg_url=pg_db_url, catalog={"type": "nope"})
    with pytest.raises(SettingsError, match=r"^catalog\['uri'\]: a sql catalog needs a uri"):
        connect(pg_url=pg_db_url, catalog={"type": "sql"})
    with pytest.raises(InvalidArgument, match=r"catalog must be a pyiceberg Catalog"):
        connect(pg_url=pg_db_url, catalog="datasets")  # type: ignore[arg-type]
    with pytest.raises(PipelineOutputError):
        connect(pg_url=pg_db_url, catalog=handle, default_mode="delta")  # type: ignore[arg-type]
