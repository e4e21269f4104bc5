"""The package is ruff-clean, ruff-formatted and type-checks under mypy --strict (pyproject)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_check_is_clean() -> None:
    out = _run(str(BIN / "ruff"), "check", "pipeline_output", "pipeline_output_tests", "benchmarks")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean() -> None:
    out = _run(str(BIN / "ruff"), "format", "--check", "pipeline_output", "pipeline_output_tests")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_is_clean_on_the_package() -> None:
    out = _run(str(BIN / "mypy"))
    assert out.returncode == 0, out.stdout + out.stderr
