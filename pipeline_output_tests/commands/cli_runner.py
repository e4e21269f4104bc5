"""What every CLI test needs: the console script of the interpreter running the tests, run as a
real process with an environment isolated from the developer's (`isolated_env`, `runner`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

BIN = Path(sys.executable).parent
CLI = str(BIN / "pipeline-output")

Run = Callable[..., subprocess.CompletedProcess[str]]


def isolated_env(tmp_path: Path, pg_url: str) -> dict[str, str]:
    """This environment without the user's pyiceberg/pipeline-output/Dagster settings, a fresh
    HOME and PIPELINE_OUTPUT_HOME under `tmp_path`, and the test database as the control plane."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("PYICEBERG_", "PIPELINE_OUTPUT_", "DAGSTER_"))
    }
    (tmp_path / "user").mkdir(exist_ok=True)
    env.update(
        HOME=str(tmp_path / "user"),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PIPELINE_OUTPUT_HOME=str(tmp_path / "home"),
        PIPELINE_OUTPUT_PG_URL=pg_url,
    )
    return env


def runner(*, env: Mapping[str, str], cwd: Path, timeout_s: float = 300) -> Run:
    """`run(*args, cwd=None, env=None)`: the CLI with `args`, in `cwd` (default the runner's),
    with `env` added to the runner's environment; never raises on a non-zero exit."""

    def run(
        *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, *args],
            env={**base, **(env or {})},
            cwd=cwd or home,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    base, home = dict(env), cwd
    return run
