"""Running real processes in a test: writers (start them, collect one report each, end them) and
`pipeline-output dev` (`running_dev`: the UI on a free port, queried with `graphql`, stopped with
every child it started).

Each worker puts one tuple on the queue when it is done: its writer number first, its error (or
None) last. `run_workers` fails the test naming every writer that erred or did not report, and
never leaves a process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

DEV_START_TIMEOUT_S = 180


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


def _running_under(root: Path) -> list[Any]:
    """The processes (psutil) running in `root`: their working directory or command line."""
    import psutil

    mine = str(root)
    found = []
    for process in psutil.process_iter(["pid", "cwd", "cmdline"]):
        cwd = process.info.get("cwd") or ""
        cmdline = " ".join(process.info.get("cmdline") or [])
        if process.pid != os.getpid() and (cwd.startswith(mine) or mine in cmdline):
            found.append(process)
    return found


def processes_under(root: Path) -> list[str]:
    """Command lines of the processes still running in `root`."""
    return [" ".join(p.info.get("cmdline") or []) for p in _running_under(root)]


def end_leftovers(tmp_path: Path) -> None:
    """End every process still running in `tmp_path` (a code server Dagster started in a session of
    its own outlives the webserver's process group), so no test leaves a server behind."""
    import psutil

    leftovers = _running_under(tmp_path)
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(leftovers, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()


def graphql(
    port: int, query: str, variables: dict[str, Any] | None = None, *, timeout: float = 30
) -> dict[str, Any]:
    """The `data` of one GraphQL request to the webserver on `port` (its errors fail the test)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]  # type: ignore[no-any-return]


@contextlib.contextmanager
def running_dev(
    command: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path, root: Path
) -> Iterator[int]:
    """`command` (`pipeline-output dev ...`) with `-h 127.0.0.1 -p <free port>` added, run in
    `cwd` until its UI serves assets; yields the port. Afterwards it is stopped (SIGINT to its
    process group, as Ctrl-C) and every process still running under `root` is ended."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "-h", "127.0.0.1", "-p", str(port)],
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + DEV_START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"dev exited ({proc.returncode}):\n{log.read_text()}"
            try:
                if graphql(port, "{ assetNodes { id } }")["assetNodes"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"UI not up:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        graphql(port, "mutation { setNuxSeen }")  # no "join the community" modal over the UI
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # dagster dev shuts its children down on SIGINT
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        end_leftovers(root)
