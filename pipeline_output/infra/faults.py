"""Test-only fault injection: the one place a process stops or pauses at a named point of a write
(`PIPELINE_OUTPUT_FAULT`, read through `settings.fault_point`; points `before_commit`, `in_commit`,
`after_commit`). In normal use the variable is unset and `fault_injection` returns at once."""

from __future__ import annotations


def fault_injection(point: str) -> None:
    """Tests only: with PIPELINE_OUTPUT_FAULT=<point> the process kills itself here (SIGKILL);
    with `<point>:pause:<path>` it creates `<path>.paused` and waits (at most 10 minutes) until
    `<path>` exists, so a test can act while this write is exactly here."""
    from pipeline_output.infra.settings import fault_pause, fault_point

    if fault_point() != point:
        return
    gate = fault_pause()
    if gate is None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        return
    import time
    from pathlib import Path

    Path(f"{gate}.paused").touch()
    deadline = time.monotonic() + 600
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
