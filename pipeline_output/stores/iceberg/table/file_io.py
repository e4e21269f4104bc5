"""`ObjectStoreFileIO`: the FileIO of every table of a catalog the project opens — pyiceberg's
pyarrow FileIO, with fewer object-store requests and round trips per write; and `Uploads`, the
FileIO a commit writes its new files through.

pyiceberg 0.12 opens every S3 output stream as a multipart upload (pyarrow's `S3FileSystem`
without `allow_delayed_open`): each file a write adds — data file, delete file, manifests, manifest
list — costs three requests (create, one part, complete) where one PUT does. With
`allow_delayed_open` a file smaller than one part is one PUT (a larger one is still a multipart
upload, started when its first part is full).

pyiceberg also builds a new `S3FileSystem` (a new AWS client and connection pool) for every table
it loads, so each write's first requests open new connections. Here one file system serves every
table of the process whose FileIO has the same `s3.*` / `client.*` properties (the only ones the
file system is built from): its connections are reused from write to write (a forked child
process builds its own).

pyarrow (26) sends a HEAD before every read it opens, even of a file whose size is known. A file
every reader reads whole — a manifest list, a manifest, a `metadata.json`, and a candidate data
file the key scan fetches whole (`read_whole`) — is instead one GET, signed (SigV4) with the
FileIO's static S3 credentials on a pooled keep-alive connection (`_SignedS3`), where the
configuration is one it covers (an explicit path-style `s3.endpoint`, a region, an access key and
secret; no role, proxy or anonymous access); otherwise pyarrow reads it. A file written whole
(`write_whole`: data and delete files, manifests, manifest lists) is likewise one signed PUT.

A commit's new files go through `Uploads` (`uploading`): each is held in memory until it is
closed and then uploaded in the background, so a write's data file, delete files, manifests and
manifest list are uploaded at the same time, not one round trip after the other, and a new
manifest's length is its bytes' (pyiceberg asks the store: a HEAD).

The manifests and manifest lists a process uploads it also keeps (`_Written`, the last 4 MiB of
them, each at most 512 KiB): an Iceberg manifest or manifest list is never rewritten in place, so
the bytes this process sent are what the object holds, and its own next reads of them — the
checks right after a write (`table_health` reads the new snapshot's manifests), the next write
of the same table by a long-lived process — need no GET.

Local files, and every other scheme, are read and written exactly as by `PyArrowFileIO`.
`open_catalog` (`catalog.py`) gives a catalog this FileIO unless its configuration names one
(`py-io-impl`).
"""

from __future__ import annotations

import io
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast
from urllib.parse import quote, urlsplit

import pyarrow as pa
from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from pipeline_output.stores.iceberg.table import sigv4

if TYPE_CHECKING:  # urllib3 (with ssl ~9 MB resident) is imported by the signed S3 client only
    import urllib3

IMPL = f"{__name__}.ObjectStoreFileIO"  # the `py-io-impl` value naming it
_CACHED = 8  # file systems kept (credentials vended per table make new ones)
_shared: OrderedDict[tuple[Any, ...], FileSystem] = OrderedDict()
_guard = threading.Lock()
UPLOAD_THREADS = 8  # uploads of a commit at the same time (and pooled S3 connections)
SIGNED_PUT_BYTES = 64 * 1024 * 1024  # a larger file is uploaded by pyarrow (in parts)
UPLOAD_BUDGET_BYTES = 256 * 1024 * 1024  # a commit's bytes waiting or being uploaded at once
_READ_WHOLE = (".avro", ".metadata.json")  # files every reader reads whole
_IMMUTABLE = (".avro",)  # manifests and manifest lists: never rewritten in place
KEPT_WRITTEN_BYTES = 4 * 1024 * 1024  # the uploaded manifests' bytes a process keeps (`_Written`)


class ObjectStoreFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose S3 file system uploads a small file as one PUT and is shared by
    every FileIO of the process with the same S3 properties, and whose reads of a whole object
    (manifest lists, manifests, metadata JSON, `read_whole`) are one GET without a HEAD first
    where the S3 configuration allows (`_SignedS3`)."""

    def new_input(self, location: str) -> PyArrowFile:
        get = self._whole_get(location) if location.endswith(_READ_WHOLE) else None
        if get is None:
            return super().new_input(location)
        _, _, path = self.parse_location(location, self.properties)
        return _FetchedWhole(location, path, get, self)

    def put_whole(self, location: str, data: bytes) -> bool:
        """Write `data` as the object at `location` with one signed PUT; False (nothing done)
        when the location or configuration is not one the signed PUT covers, or the file is
        larger than `SIGNED_PUT_BYTES` (pyarrow then uploads it, a large one in parts)."""
        target = self._signed_target(location) if len(data) <= SIGNED_PUT_BYTES else None
        if target is None:
            return False
        client, bucket, key = target
        client.send("PUT", bucket, key, location, body=data)
        if location.endswith(_IMMUTABLE):
            _written.keep((client, location), data)
        return True

    def _whole_get(self, location: str) -> Callable[[], bytes] | None:
        """One signed GET of the object at `location`, or None (not S3, or a configuration the
        signed GET does not cover: then pyarrow reads it)."""
        target = self._signed_target(location)
        if target is None:
            return None
        client, bucket, key = target
        sent = _written.get((client, location)) if location.endswith(_IMMUTABLE) else None
        if sent is not None:
            return _Sent(sent)
        return lambda: client.send("GET", bucket, key, location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        target = self._signed_target(path) if path.endswith(_IMMUTABLE) else None
        if target is not None:
            _written.drop((target[0], path))
        super().delete(location)

    def _signed_target(self, location: str) -> tuple[_SignedS3, str, str] | None:
        scheme, netloc, path = self.parse_location(location, self.properties)
        if scheme not in ("s3", "s3a", "s3n") or not netloc:
            return None
        client = _SignedS3.of(self.properties)
        if client is None:
            return None
        return client, netloc, path[len(netloc) :].lstrip("/")

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        key = (
            os.getpid(),  # a forked child builds its own (an AWS client is not fork-safe)
            netloc,
            *_s3_settings(self.properties),
        )
        with _guard:
            found = _shared.get(key)
            if found is not None:
                _shared.move_to_end(key)
                return found
        made = _delayed_open(super()._initialize_s3_fs(netloc), self.properties)
        with _guard:
            _shared[key] = made
            while len(_shared) > _CACHED:
                _shared.popitem(last=False)
        return made


class _Written:
    """The bytes of the manifests and manifest lists this process uploaded, by (client, location):
    the most recent `max_bytes` of them, each at most an eighth of it."""

    def __init__(self, *, max_bytes: int = KEPT_WRITTEN_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[tuple[Any, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, key: tuple[Any, str], data: bytes) -> None:
        if len(data) > self.max_bytes // 8:
            return
        with self._lock:
            old = self._kept.pop(key, None)
            self._bytes += len(data) - (len(old) if old is not None else 0)
            self._kept[key] = data
            while self._bytes > self.max_bytes:
                self._bytes -= len(self._kept.popitem(last=False)[1])

    def get(self, key: tuple[Any, str]) -> bytes | None:
        with self._lock:
            return self._kept.get(key)

    def drop(self, key: tuple[Any, str]) -> None:
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= len(old)


_written = _Written()


def read_whole(io: FileIO, location: str) -> bytes:
    """The bytes of the file at `location`: one GET on S3 through `ObjectStoreFileIO` (no HEAD
    first), else the FileIO's own open and read."""
    get = io._whole_get(location) if isinstance(io, ObjectStoreFileIO) else None
    if get is not None:
        return get()
    with io.new_input(location).open() as stream:
        return stream.read()


def write_whole(io: FileIO, location: str, data: bytes) -> None:
    """Write `data` as the file at `location`: one signed PUT on S3 through `ObjectStoreFileIO`
    (`put_whole`), else the FileIO's own create and write."""
    if isinstance(io, ObjectStoreFileIO) and io.put_whole(location, data):
        return
    with io.new_output(location).create(overwrite=True) as stream:
        stream.write(data)


def _s3_settings(properties: Any) -> tuple[tuple[str, str], ...]:
    """The properties an S3 client is built from (`s3.*`, `client.*`)."""
    return tuple(
        sorted((k, str(v)) for k, v in properties.items() if k.startswith(("s3.", "client.")))
    )


class _FetchedWhole(PyArrowFile):
    """A pyarrow input file read whole by one GET (its length and existence still asked of
    pyarrow, whose file system is made only then: `_FileSystemWhenUsed`)."""

    def __init__(
        self, location: str, path: str, get: Callable[[], bytes], io: PyArrowFileIO
    ) -> None:
        scheme, netloc, _ = io.parse_location(location, io.properties)
        fs = _FileSystemWhenUsed(lambda: io.fs_by_scheme(scheme, netloc))
        super().__init__(location, path, cast(FileSystem, fs))
        self._get = get

    def open(self, seekable: bool = True) -> InputStream:
        return pa.BufferReader(self._get())  # type: ignore[no-any-return]

    def __len__(self) -> int:
        if isinstance(self._get, _Sent):  # the bytes this process uploaded: no HEAD
            return len(self._get.data)
        return super().__len__()


class _FileSystemWhenUsed:
    """A pyarrow file system made when an attribute of it is first used. A file read by one
    signed GET needs none, and making pyarrow's S3 file system initializes the AWS SDK: ~30 ms
    of a process's first write on S3, when it reads its table's manifest list."""

    def __init__(self, make: Callable[[], FileSystem]) -> None:
        self._make = make
        self._made: FileSystem | None = None

    def __getattr__(self, name: str) -> Any:
        if self._made is None:
            self._made = self._make()  # (`fs_by_scheme` shares one per configuration)
        return getattr(self._made, name)


@dataclass(frozen=True)
class _Sent:
    """A whole-object read answered by the bytes this process uploaded (`_Written`)."""

    data: bytes

    def __call__(self) -> bytes:
        return self.data


class _SignedS3:
    """GETs and PUTs of whole S3 objects outside pyarrow, signed with AWS Signature V4 from the
    FileIO's static credentials, on pooled keep-alive connections: pyarrow (26) sends a HEAD
    before every read it opens, even when the size is known, and its PUT took ~1.5x as long on
    SeaweedFS (benchmarks/results/rest-catalog.md). Only for an explicit
    `s3.endpoint` addressed path-style, a configured region, an access key and secret (a session
    token too) and no role, proxy, retry strategy, region resolving or anonymous access; any
    other configuration goes through pyarrow."""

    _made: ClassVar[dict[tuple[Any, ...], _SignedS3 | None]] = {}

    def __init__(
        self,
        *,
        endpoint: str,
        region: str,
        access_key: str,
        secret_key: str,
        token: str | None,
        timeout: urllib3.Timeout,
    ) -> None:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        self.scheme, self.host = parts.scheme, parts.netloc
        self.prefix = parts.path.rstrip("/")
        self.region = region
        self.credentials = sigv4.Credentials(access_key, secret_key, token)
        import urllib3  # (on first use: a local table's process never loads it)

        retries = urllib3.Retry(
            total=3,
            backoff_factor=0.1,
            status_forcelist=(500, 502, 503, 504),
            raise_on_status=False,
        )
        self.http = urllib3.PoolManager(maxsize=UPLOAD_THREADS, retries=retries, timeout=timeout)

    @classmethod
    def of(cls, properties: Any) -> _SignedS3 | None:
        key = (os.getpid(), *_s3_settings(properties))
        with _guard:
            if key in cls._made:
                return cls._made[key]
        made = cls._build(properties)
        with _guard:
            return cls._made.setdefault(key, made)

    @classmethod
    def _build(cls, properties: Any) -> _SignedS3 | None:
        def first(*names: str) -> str | None:
            for name in names:
                value = properties.get(name)
                if value:
                    return str(value)
            return None

        endpoint = first("s3.endpoint")
        access = first("s3.access-key-id", "client.access-key-id")
        secret = first("s3.secret-access-key", "client.secret-access-key")
        unsupported = first(
            "s3.role-arn", "client.role-arn", "s3.proxy-uri", "s3.retry-strategy-impl"
        )
        region = first("s3.region", "client.region")
        anonymous, virtual, resolve = (
            str(properties.get(name, "false")).lower() in ("true", "1", "yes")
            for name in ("s3.anonymous", "s3.force-virtual-addressing", "s3.resolve-region")
        )
        if not (endpoint and access and secret and region) or unsupported:
            return None
        if anonymous or virtual or resolve:
            return None
        connect, read = first("s3.connect-timeout"), first("s3.request-timeout")
        import urllib3

        return cls(
            endpoint=endpoint,
            region=region,
            access_key=access,
            secret_key=secret,
            token=first("s3.session-token", "client.session-token"),
            timeout=urllib3.Timeout(
                connect=float(connect) if connect else 30.0, read=float(read) if read else 120.0
            ),
        )

    def send(
        self, method: str, bucket: str, key: str, location: str, *, body: bytes | None = None
    ) -> bytes:
        """A GET's object bytes (a PUT's: none); `FileNotFoundError` when there is no object,
        `PermissionError` when refused, `OSError` otherwise."""
        host = self.host  # path-style: /bucket/key
        path = f"{self.prefix}/{quote(bucket, safe='')}/{quote(key, safe='/-_.~')}"
        headers = self._signed(method, host, path)
        verb = "read" if method == "GET" else "write"
        import urllib3

        try:
            response = self.http.request(
                method, f"{self.scheme}://{host}{path}", body=body, headers=headers
            )
        except urllib3.exceptions.HTTPError as exc:
            raise OSError(f"cannot {verb} {location}: {exc}") from exc
        if response.status == 200:
            return bytes(response.data) if method == "GET" else b""
        if response.status == 404:
            raise FileNotFoundError(f"cannot {verb} {location}: it does not exist")
        detail = f"HTTP {response.status} {_s3_error(bytes(response.data))}"
        if response.status in (401, 403):
            raise PermissionError(f"cannot {verb} {location}: {detail}")
        raise OSError(f"cannot {verb} {location}: {detail}")

    def _signed(self, method: str, host: str, path: str) -> dict[str, str]:
        """The headers of a SigV4-signed `method` request of `path` on `host` (payload
        unsigned)."""
        headers = {"host": host, "x-amz-content-sha256": sigv4.UNSIGNED_PAYLOAD}
        return headers | sigv4.signed(
            method,
            sigv4.canonical_uri(path, service="s3"),
            "",
            headers,
            sigv4.UNSIGNED_PAYLOAD,
            credentials=self.credentials,
            service="s3",
            region=self.region,
        )


def _s3_error(body: bytes) -> str:
    """An S3 error response's `<Code>: <Message>` (its first 200 bytes when it has neither)."""
    text = body.decode("utf-8", "replace")
    code, message = (re.search(f"<{tag}>(.*?)</{tag}>", text, re.S) for tag in ("Code", "Message"))
    if code is None and message is None:
        return repr(body[:200])
    return ": ".join(m.group(1).strip() for m in (code, message) if m is not None)


def _delayed_open(fs: FileSystem, properties: Any) -> FileSystem:
    """`fs` (pyiceberg's S3 file system) with `allow_delayed_open`, every other option kept
    (pyarrow's own reconstruction arguments); as it is when a retry strategy was configured (the
    one option those arguments do not carry)."""
    if not isinstance(fs, S3FileSystem) or properties.get("s3.retry-strategy-impl"):
        return fs
    rebuild, (options,) = fs.__reduce__()
    made: FileSystem = rebuild({**options, "allow_delayed_open": True})
    return made


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _upload_pool() -> ThreadPoolExecutor:
    """The process's upload threads (started as needed and kept; a forked child gets its own)."""
    global _POOL
    with _guard:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(UPLOAD_THREADS, "po-upload"))
        return _POOL[1]


def is_local(location: str) -> bool:
    """Whether `location` is a local file (a `file:` URI or an absolute path), not an object."""
    return location.startswith(("file:", "/"))


class Uploads(FileIO):
    """`FileIO` over another one for the files of one commit: a file created on an object store
    is held in memory and its upload starts when it is closed, in the background — so a commit's
    data file, delete files, manifests and manifest list are uploaded at the same time (one round
    trip, not one after the other), and a created file's length is its bytes' (pyiceberg would
    ask the store: a HEAD). Local files are written as they are closed, as by the inner FileIO.

    At most `UPLOAD_BUDGET_BYTES` wait or are being sent at once: closing a file beyond that
    waits for earlier uploads to end (a large write's files are then uploaded as they are
    encoded, never all held). `wait()` returns once every upload has ended (raising the first
    failure); files created after it are uploaded as they are closed. Reading or deleting a file whose upload is under way waits
    for that upload first, so a cleanup never races its own upload. Use it through `uploading`,
    which waits for every upload on the way out, also when the block fails."""

    def __init__(self, inner: FileIO) -> None:
        super().__init__(inner.properties)
        self.inner = inner
        self._pending: dict[str, Future[None]] = {}
        self._sizes: dict[str, int] = {}
        self._held = 0  # bytes waiting or being sent
        self._lock = threading.Lock()
        self._settled = False

    def new_input(self, location: str) -> InputFile:
        self._settle(location)
        return self.inner.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        return _DeferredFile(location, self)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        self._settle(path)
        self.inner.delete(location)

    def wait(self) -> None:
        """Every upload ended; the first failure (in creation order) raised."""
        with self._lock:
            self._settled = True
            futures = list(self._pending.values())
        first: BaseException | None = None
        for future in futures:
            error = future.exception()
            if error is not None and first is None:
                first = error
        if first is not None:
            raise first

    def _settle(self, path: str) -> None:
        with self._lock:
            future = self._pending.get(path)
        if future is not None:
            wait([future])

    def _closed(self, location: str, data: bytes) -> None:
        """A created file was closed: upload its bytes now (locally, or after `wait`) or in the
        background."""
        size = len(data)
        with self._lock:
            self._sizes[location] = size
            later = not self._settled and not is_local(location)
            busy = [f for f in self._pending.values() if not f.done()]
        if not later:
            self._put(location, data)
            return
        while busy and self._held + size > UPLOAD_BUDGET_BYTES:
            wait(busy, return_when=FIRST_COMPLETED)
            busy = [f for f in busy if not f.done()]
        with self._lock:
            self._held += size
            future = _upload_pool().submit(self._put, location, data)
            self._pending[location] = future
        future.add_done_callback(lambda _: self._release(size))

    def _release(self, size: int) -> None:
        with self._lock:
            self._held -= size

    def _put(self, location: str, data: bytes) -> None:
        write_whole(self.inner, location, data)


class _DeferredFile(OutputFile):
    """An `OutputFile` of `Uploads`: its stream collects the bytes; closing it hands them over."""

    def __init__(self, location: str, owner: Uploads) -> None:
        super().__init__(location)
        self._owner = owner

    def __len__(self) -> int:
        size = self._owner._sizes.get(self.location)
        return size if size is not None else len(self._owner.inner.new_input(self.location))

    def exists(self) -> bool:
        return (
            self.location in self._owner._sizes
            or self._owner.inner.new_input(self.location).exists()
        )

    def to_input_file(self) -> InputFile:
        return self._owner.new_input(self.location)

    def create(self, overwrite: bool = False) -> OutputStream:
        if not overwrite and self.exists():
            raise FileExistsError(f"cannot create {self.location}: it already exists")
        return _Collected(self)


class _Collected(io.BytesIO):
    def __init__(self, file: _DeferredFile) -> None:
        super().__init__()
        self._file = file

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue()
            super().close()
            self._file._owner._closed(self._file.location, data)


@contextmanager
def uploading(inner: FileIO) -> Iterator[Uploads]:
    """`Uploads` over `inner` for a block: on the way out every upload has ended (a failure of
    one raised only if the block itself did not fail)."""
    uploads = Uploads(inner)
    try:
        yield uploads
    except BaseException:
        with suppress(BaseException):
            uploads.wait()
        raise
    uploads.wait()
