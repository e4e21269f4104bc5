"""Figures of the reliability tests (docs/reliability.md): each scenario appends one JSON line to the
file named by `PIPELINE_OUTPUT_RELIABILITY_REPORT` when it is set (benchmarks/reliability.py sets
it and renders the table); otherwise recording is a no-op.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

REPORT_ENV = "PIPELINE_OUTPUT_RELIABILITY_REPORT"
PROFILE_ENV = "PIPELINE_OUTPUT_HYPOTHESIS_PROFILE"
# Read at import: the `settings_env` fixture clears every PIPELINE_OUTPUT_* variable during a test.
_REPORT = os.environ.get(REPORT_ENV)
_PROFILE = os.environ.get(PROFILE_ENV)


def profile() -> str:
    """`ci` (default) or `deep`."""
    value = os.environ.get(PROFILE_ENV) or _PROFILE or "ci"
    if value not in ("ci", "deep"):
        raise ValueError(f"{PROFILE_ENV} must be 'ci' or 'deep', got {value!r}")
    return value


def record(scenario: str, **figures: Any) -> None:
    """Append one scenario's figures to the report file (if one is configured)."""
    path = os.environ.get(REPORT_ENV) or _REPORT
    if not path:
        return
    line = {"scenario": scenario, "profile": profile(), "at": time.time(), **figures}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, default=str) + "\n")
