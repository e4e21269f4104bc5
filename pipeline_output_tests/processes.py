"""Running real writer processes in a test: start them, collect one report each, end them.

Each worker puts one tuple on the queue when it is done: its writer number first, its error (or
None) last. `run_workers` fails the test naming every writer that erred or did not report, and
never leaves a process behind.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any


def run_workers(procs: Sequence[Any], out: Any, *, timeout: float) -> list[tuple[Any, ...]]:
    """Start `procs`, take one report per process from `out`, join them (killing stragglers)."""
    for p in procs:
        p.start()
    reports: list[tuple[Any, ...]] = []
    errors = []
    try:
        for _ in procs:
            report = out.get(timeout=timeout)
            reports.append(report)
            if report[-1]:
                errors.append(f"writer {report[0]}: {report[-1]}")
    except queue.Empty:
        errors.append("a writer did not report in time")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not errors, errors
    return reports
