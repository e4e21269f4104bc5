"""`dagster definitions validate` on the repository's workspace (what CI runs), and a negative
control: a code location with a bad dataset spec fails validation naming the dataset.

(`dg check defs` needs the separate dagster-dg-cli package, which is not installed here.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"


def _validate(
    workspace: Path, cwd: Path, dagster_home: Path, pg_url: str
) -> subprocess.CompletedProcess[str]:
    """`dagster definitions validate` on the test's own Postgres and home: loading a location
    connects its runtime (the column schemas at load), which must not start an embedded server in
    the checkout."""
    dagster_home.mkdir(exist_ok=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = dict(
        os.environ,
        DAGSTER_HOME=str(dagster_home),
        PIPELINE_OUTPUT_HOME=str(dagster_home.parent / "po_home"),
        PIPELINE_OUTPUT_PG_URL=pg_url,
    )
    return subprocess.run(
        [str(DAGSTER), "definitions", "validate", "-w", str(workspace)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_repository_workspace_passes_dagster_definitions_validate(
    tmp_path: Path, pg_db_url: str
) -> None:
    proc = _validate(REPO / "workspace.yaml", REPO, tmp_path / "dagster_home", pg_db_url)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "All code locations passed validation" in output


def test_code_location_with_a_bad_dataset_spec_fails_validation_naming_it(
    tmp_path: Path, pg_db_url: str
) -> None:
    (tmp_path / "broken_defs.py").write_text(
        "import polars as pl\n"
        "from pipeline_output import build_definitions, dataset\n\n"
        "@dataset(strategy='sync', mode='iceberg')\n"
        "def unkeyed(raw: pl.LazyFrame) -> pl.LazyFrame:\n"
        "    return raw\n\n"
        "defs = build_definitions(datasets=[unkeyed])\n"
    )
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        f"load_from:\n  - python_file:\n      relative_path: broken_defs.py\n"
        f"      working_directory: {tmp_path}\n"
    )
    proc = _validate(workspace, tmp_path, tmp_path / "dagster_home", pg_db_url)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "'unkeyed'" in output and "needs a primary_key" in output, output[-3000:]
