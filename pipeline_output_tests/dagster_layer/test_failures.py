"""A pipeline-output error reaches Dagster as one line (`dagster_layer/failures.py`): a
`dg.Failure` naming the dataset and the cause, with the error's class, dataset and kind in its
metadata, retried by a retry policy only when running again may succeed, and no chained causes
under it. The user's own errors keep their traceback. Seen first as a Dagster user sees it, from
Dagster's own CLI against a control plane that does not answer, then in process."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

import pipeline_output
from pipeline_output import build_definitions, dataset
from pipeline_output.dagster_layer.resource import reset_runtime
from pipeline_output.dagster_layer.run_report import error_line
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output_tests.commands.cli_runner import isolated_env
from pipeline_output_tests.dagster_runs import configured_resource, failure_errors, run_assets

DAGSTER = Path(sys.executable).parent / "dagster"
CLOSED = "postgresql://postgres@127.0.0.1:1/x"  # nothing listens on port 1: refused at once
PACKAGE = Path(pipeline_output.__file__).parent
SALES_PARTITION = ("--select", "sales", "--partition", "2026-11-02")

# a user's first project, as `dagster asset materialize -f` loads it
USER_DEFINITIONS = """\
import dagster as dg
import polars as pl
from pipeline_output import build_definitions, dataset

DAYS = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-05")


@dataset(primary_key="id", mode="iceberg", partitions_def=DAYS, partition_column="day")
def sales(partition_key: str) -> pl.DataFrame:
    from datetime import date

    d = date.fromisoformat(partition_key)
    return pl.DataFrame({"id": [d.toordinal()], "day": [d], "amount": [1.0]})


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(datasets=[sales])
"""


def test_the_dagster_cli_prints_a_failed_write_as_one_line_naming_the_dataset(
    pg_db_url: str, tmp_path: Path
) -> None:
    """Right after STEP_FAILURE: the one line naming the dataset and the cause; no frame of
    pipeline-output's internals, no psycopg error chained under it, no BetaWarning, and the
    whole output short (it was 143 lines: our frames and psycopg's, all printed twice)."""
    module = tmp_path / "definitions.py"
    module.write_text(USER_DEFINITIONS)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = isolated_env(tmp_path, CLOSED)
    env.update(
        DAGSTER_HOME=str(dagster_home),
        PYICEBERG_CATALOG__DEFAULT__TYPE="sql",
        PYICEBERG_CATALOG__DEFAULT__URI=to_sqlalchemy_url(pg_db_url, driver="psycopg"),
        PYICEBERG_CATALOG__DEFAULT__WAREHOUSE=f"file://{tmp_path / 'warehouse'}",
    )
    proc = subprocess.run(
        [str(DAGSTER), "asset", "materialize", "-f", str(module), "-a", "defs", *SALES_PARTITION],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
        check=False,
    )
    out = proc.stdout
    lines = out.splitlines()
    assert proc.returncode != 0, out
    at = next(i for i, line in enumerate(lines) if "STEP_FAILURE" in line)
    cause = next(line for line in lines[at + 1 :] if line.strip())
    assert cause.startswith(
        "dagster._core.definitions.events.Failure: dataset 'sales': PIPELINE_OUTPUT_PG_URL: "
        "cannot connect to postgresql://postgres@127.0.0.1:1/x"
    ), out
    frames = re.findall(r'File "([^"]+)", line \d+', out)
    ours = {Path(f).name for f in frames if Path(f).is_relative_to(PACKAGE)}
    assert ours <= {"io_manager.py", "failures.py"}, out  # the boundary and its raise only
    assert not [f for f in frames if "psycopg" in f], out
    assert "The above exception was caused by" not in out, out
    assert "BetaWarning" not in out, out
    assert len(lines) < 70, out


@pytest.fixture
def fresh_runtime() -> Any:
    reset_runtime()
    yield
    reset_runtime()


def _failure(result: dg.ExecuteInProcessResult) -> tuple[Any, dict[str, Any]]:
    """The step's error as Dagster recorded it, and its Failure's metadata (plain values)."""
    (event,) = result.get_step_failure_events()
    data = event.step_failure_data
    meta = data.user_failure_data.metadata if data.user_failure_data is not None else {}
    return data.error, {k: getattr(v, "value", v) for k, v in meta.items()}


def _retried(result: dg.ExecuteInProcessResult) -> int:
    return sum(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)


def _location(
    compute: Callable[[], pl.DataFrame], url: str, warehouse: Path, *, retries: int
) -> dg.Definitions:
    """A location of one `orders` dataset computed by `compute`, retried `retries` times, on
    the control plane `url` (its SQL catalog's files under `warehouse`)."""
    orders = dataset(
        name="orders",
        primary_key="id",
        mode="iceberg",
        retry_policy=dg.RetryPolicy(max_retries=retries),
    )(compute)
    return build_definitions(datasets=[orders], resource=configured_resource(url, warehouse))


def test_bad_input_fails_once_as_one_terminal_line_and_the_users_own_error_keeps_its_chain(
    pg_db_url: str, tmp_path: Path, fresh_runtime: Any
) -> None:
    """Duplicate keys (terminal): a Failure that names the dataset once, says the error's class
    and kind, and is not retried under a retry policy. A compute that raises its own error is
    left to Dagster as it is: wrapped by Dagster, with its traceback."""
    rows: dict[str, Any] = {"id": [1, 1]}

    def orders() -> pl.DataFrame:
        if rows.get("raise"):
            raise ValueError("the user's own bug")
        return pl.DataFrame(rows)

    defs = _location(orders, pg_db_url, tmp_path / "wh", retries=2)
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["orders"], raise_on_error=False)
        error, meta = _failure(result)
        assert meta == {"error": "DuplicateKeys", "dataset": "orders", "retryable": False}
        assert error.cls_name == "Failure" and error.cause is None and error.context is None
        line = error.message.strip()
        assert "\n" not in line and line.count("'orders'") == 1, line
        assert _retried(result) == 0, "a terminal error is not retried"

        rows["raise"] = True
        result = run_assets(defs, instance, ["orders"], raise_on_error=False)
        assert failure_errors(result) == [""], "not a pipeline-output error: no Failure"
        error, _ = _failure(result)
        assert error.cause is not None and error.cause.cls_name == "ValueError"
        assert any(__file__ in frame for frame in error.cause.stack)
        assert _retried(result) == 2, "the user's error follows the retry policy"


def test_an_unreachable_control_plane_is_a_retryable_failure_naming_the_dataset(
    tmp_path: Path, fresh_runtime: Any
) -> None:
    def orders() -> pl.DataFrame:
        return pl.DataFrame({"id": [1]})

    defs = _location(orders, CLOSED, tmp_path / "wh", retries=1)
    with dg.DagsterInstance.ephemeral() as instance:
        result = run_assets(defs, instance, ["orders"], raise_on_error=False)
    outer, meta = _failure(result)
    assert meta == {"error": "PostgresUnavailable", "dataset": "orders", "retryable": True}
    assert _retried(result) == 1, "running again may succeed: the retry policy retries"
    # the last attempt's Failure, under Dagster's own "exceeded max_retries"
    error = outer.cause
    assert error is not None and error.cause is None and error.context is None, outer
    data = result.get_step_failure_events()[0].step_failure_data
    line, retryable = error_line(data.error, data.user_failure_data)  # `materialize`'s report
    assert retryable and line.startswith("dataset 'orders': PipelineOutputResource.pg_url"), line
    assert error.message.startswith(
        "dagster._core.definitions.events.Failure: dataset 'orders': "
        "PipelineOutputResource.pg_url: cannot connect to postgresql://postgres@127.0.0.1:1/x"
    ), error.message


def test_a_failure_names_the_dataset_once_also_when_the_error_is_about_an_upstream() -> None:
    """An input's error names its upstream (`dataset 'up': ...`): the step's Failure says that
    line as it is, not `dataset 'down': dataset 'up': ...`; its metadata names the step's."""
    from pipeline_output.dagster_layer.failures import as_failure
    from pipeline_output.errors import BadInput, DatasetNotWritten

    about_up = as_failure(DatasetNotWritten("dataset 'up' has no table yet"), dataset="down")
    assert about_up.description == "dataset 'up' has no table yet"
    assert about_up.metadata["dataset"].value == "down"
    plain = as_failure(BadInput("key 'id' is null in 2 rows"), dataset="down")
    assert plain.description == "dataset 'down': key 'id' is null in 2 rows"
