"""Fixtures of the command tests that run the console script against the test database's
settings (`settings_env`). Test files whose commands need another code location or database
define their own `cli`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline_output.infra.settings import Settings
from pipeline_output_tests.commands.cli_runner import BIN, Run, runner


@pytest.fixture
def cli(settings_env: Settings, tmp_path: Path) -> Run:
    """Run the console script with PIPELINE_OUTPUT_PG_URL/HOME of the test database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return runner(env=env, cwd=tmp_path, timeout_s=180)


@pytest.fixture
def runtime(settings_env: Settings) -> Iterator[Any]:
    """This process's runtime on the test database (reset before and after)."""
    from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime

    reset_runtime()
    yield get_runtime()
    reset_runtime()
