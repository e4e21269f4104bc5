"""Running real writer processes in a test: start them, collect one report each, end them.

Each worker puts one tuple on the queue when it is done: its writer number first, its error (or
None) last. `run_workers` fails the test naming every writer that erred or did not report, and
never leaves a process behind.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
from collections.abc import Sequence
from pathlib import Path
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def end_leftovers(tmp_path: Path) -> None:
    """End every process still running in `tmp_path` (a code server Dagster started in a session of
    its own outlives the webserver's process group), so no test leaves a server behind."""
    import psutil

    mine = str(tmp_path)
    leftovers = []
    for process in psutil.process_iter(["pid", "cwd", "cmdline"]):
        cwd = process.info.get("cwd") or ""
        cmdline = " ".join(process.info.get("cmdline") or [])
        if process.pid != os.getpid() and (cwd.startswith(mine) or mine in cmdline):
            leftovers.append(process)
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(leftovers, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
