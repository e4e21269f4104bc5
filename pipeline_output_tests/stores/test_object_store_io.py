"""The tables' FileIO on a real S3 (SeaweedFS), counted by the server (`file_io.py`).

A commit's new files go through `file_io.Uploads` (`uploading`): each upload starts when its
file is closed, so they run at the same time; a created file's length is known without asking
the store; a failed upload fails the block only after every other upload ended; deleting a file
whose upload is under way waits for it. A whole object (a manifest, a manifest list, a candidate
file fetched whole: `read_whole`) is one signed GET, without pyarrow's HEAD first, and a file
written whole (`write_whole`) one signed PUT, for keys that need URL encoding too; a missing
object is `FileNotFoundError`, a wrong secret `PermissionError`; a file larger than
`SIGNED_PUT_BYTES` is pyarrow's upload.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline_output.stores.iceberg.table import file_io
from pipeline_output.stores.iceberg.table.file_io import (
    ObjectStoreFileIO,
    read_whole,
    uploading,
    write_whole,
)
from pipeline_output_tests.seaweed import SeaweedFS


@pytest.fixture(scope="module")
def bucket(seaweedfs: SeaweedFS) -> str:
    name = f"io-{uuid.uuid4().hex[:12]}"
    seaweedfs.s3_client().create_bucket(Bucket=name)
    return name


def _io(seaweedfs: SeaweedFS, **extra: str) -> ObjectStoreFileIO:
    return ObjectStoreFileIO({**seaweedfs.s3_properties(), **extra})


def _exists(seaweedfs: SeaweedFS, bucket: str, key: str) -> bool:
    found = seaweedfs.s3_client().list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
    return any(o["Key"] == key for o in found)


class _GatedIO(ObjectStoreFileIO):
    """Its uploads (`put_whole`, called by `Uploads` when it sends a file) first wait until
    `parties` of them are under way at once, or until `release` is set; the upload to `refuse`
    fails as a refused PUT does."""

    def __init__(self, properties: dict[str, str], *, parties: int = 0, refuse: str = "") -> None:
        super().__init__(properties)
        self.barrier = threading.Barrier(parties) if parties else None
        self.release = threading.Event()
        self.refuse = refuse

    def put_whole(self, location: str, data: bytes) -> bool:
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # broken (an error) unless the uploads overlap
        elif not self.release.wait(timeout=10):
            raise TimeoutError("not released")
        if location == self.refuse:
            raise OSError(f"PUT {location}: refused")
        return super().put_whole(location, data)


@pytest.fixture
def count(seaweedfs: SeaweedFS) -> Iterator[Any]:
    def sent(since: Any) -> dict[str, int]:
        return {k: v for k, v in (seaweedfs.s3_requests() - since).items() if v}

    yield sent


def test_a_commits_files_upload_at_the_same_time_and_their_lengths_need_no_head(
    seaweedfs: SeaweedFS, bucket: str, count: Any
) -> None:
    inner = _GatedIO(seaweedfs.s3_properties(), parties=3)
    paths = [f"s3://{bucket}/same-time/{n}.avro" for n in range(3)]
    before = seaweedfs.s3_requests()
    with uploading(inner) as io:
        lengths = []
        for n, path in enumerate(paths):
            out = io.new_output(path)
            with out.create(overwrite=True) as stream:
                stream.write(b"x" * (10 + n))
            lengths.append(len(out))  # its bytes' length: no HEAD, its upload still waiting
        io.wait()  # every upload under way at once: none waited for the one before
    assert lengths == [10, 11, 12]
    assert count(before) == {"PUT": 3}
    assert [read_whole(inner, p) for p in paths] == [b"x" * 10, b"x" * 11, b"x" * 12]


def test_a_failed_upload_fails_the_commit_once_every_other_upload_has_ended(
    seaweedfs: SeaweedFS, bucket: str
) -> None:
    bad = f"s3://{bucket}/fails/{uuid.uuid4()}.avro"
    good = f"s3://{bucket}/fails/{uuid.uuid4()}.avro"
    inner = _GatedIO(seaweedfs.s3_properties(), refuse=bad)
    with pytest.raises(OSError, match="refused"), uploading(inner) as io:
        for path in (bad, good):
            with io.new_output(path).create(overwrite=True) as stream:
                stream.write(b"data")
        threading.Timer(0.3, inner.release.set).start()
        io.wait()
    assert _exists(seaweedfs, bucket, good.split(f"{bucket}/", 1)[1])  # ended, not abandoned


def test_deleting_a_file_whose_upload_is_under_way_waits_for_the_upload(
    seaweedfs: SeaweedFS, bucket: str
) -> None:
    inner = _GatedIO(seaweedfs.s3_properties())
    key = f"deleted/{uuid.uuid4()}.avro"
    with uploading(inner) as io:
        with io.new_output(f"s3://{bucket}/{key}").create(overwrite=True) as stream:
            stream.write(b"data")
        deleting = threading.Thread(target=io.delete, args=(f"s3://{bucket}/{key}",))
        deleting.start()
        time.sleep(0.3)
        assert deleting.is_alive()  # waiting for the upload: deleting first would leave it
        inner.release.set()
        deleting.join(timeout=10)
    assert not _exists(seaweedfs, bucket, key)


def test_a_whole_object_is_one_get_without_a_head_also_for_keys_that_need_encoding(
    seaweedfs: SeaweedFS, bucket: str, count: Any
) -> None:
    keys = [
        "meta/snap-1-0-abc.avro",
        "data/day=2024-01-01/a b+c%41~ü.metadata.json",
        "data/x/00000-0-abc.parquet",
    ]
    client = seaweedfs.s3_client()
    for n, key in enumerate(keys):
        client.put_object(Bucket=bucket, Key=key, Body=f"body {n}".encode())
    io = _io(seaweedfs)
    before = seaweedfs.s3_requests()
    got = [read_whole(io, f"s3://{bucket}/{key}") for key in keys]
    assert got == [b"body 0", b"body 1", b"body 2"]
    # metadata files (read whole by every reader) opened through the FileIO: one GET too
    with io.new_input(f"s3://{bucket}/{keys[0]}").open() as stream:
        assert stream.read() == b"body 0"
    assert count(before) == {"GET": 4}  # pyarrow: a HEAD and a GET each


def test_manifests_this_process_uploaded_are_read_back_without_a_get_until_deleted_or_evicted(
    seaweedfs: SeaweedFS, bucket: str, count: Any
) -> None:
    io = _io(seaweedfs)
    run = uuid.uuid4().hex
    manifest, data = f"s3://{bucket}/{run}/m0.avro", f"s3://{bucket}/{run}/d.parquet"
    write_whole(io, manifest, b"manifest bytes")
    write_whole(io, data, b"data bytes")
    before = seaweedfs.s3_requests()
    assert read_whole(io, manifest) == b"manifest bytes"
    assert len(io.new_input(manifest)) == len(b"manifest bytes")  # its length: no HEAD either
    assert count(before) == {}
    assert read_whole(io, data) == b"data bytes"  # a data file is not kept: read from the store
    assert count(before) == {"GET": 1}
    # bounded: uploading more than the budget's worth evicts the oldest
    chunk = b"x" * (file_io.KEPT_WRITTEN_BYTES // 8)
    for n in range(1, 10):
        write_whole(io, f"s3://{bucket}/{run}/m{n}.avro", chunk)
    before = seaweedfs.s3_requests()
    assert read_whole(io, manifest) == b"manifest bytes"
    assert count(before) == {"GET": 1}
    # a deleted manifest is not read back from memory
    io.delete(f"s3://{bucket}/{run}/m9.avro")
    with pytest.raises(FileNotFoundError):
        read_whole(io, f"s3://{bucket}/{run}/m9.avro")


def test_a_missing_object_is_not_found_and_a_wrong_secret_is_refused(
    seaweedfs: SeaweedFS, bucket: str
) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_whole(_io(seaweedfs), f"s3://{bucket}/missing/{uuid.uuid4()}.avro")
    seaweedfs.s3_client().put_object(Bucket=bucket, Key="secret.avro", Body=b"x")
    wrong = _io(seaweedfs, **{"s3.secret-access-key": "not-the-secret"})
    with pytest.raises(PermissionError, match="HTTP 403") as refused:
        read_whole(wrong, f"s3://{bucket}/secret.avro")
    # the server's error code and message, not its XML
    assert "HTTP 403 SignatureDoesNotMatch: The request signature" in str(refused.value)
    assert "<" not in str(refused.value)


def test_a_file_written_whole_is_one_signed_put_and_a_large_one_pyarrows_upload(
    seaweedfs: SeaweedFS, bucket: str, count: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    io = _io(seaweedfs)
    key = "data/day=2024-01-01/a b+c%41~ü.parquet"
    before = seaweedfs.s3_requests()
    write_whole(io, f"s3://{bucket}/{key}", b"small")
    assert count(before) == {"PUT": 1}
    got = seaweedfs.s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert got == b"small"
    monkeypatch.setattr(file_io, "SIGNED_PUT_BYTES", 4)
    assert not io.put_whole(f"s3://{bucket}/large.parquet", b"large")
    write_whole(io, f"s3://{bucket}/large.parquet", b"large")
    with io.new_input(f"s3://{bucket}/large.parquet").open() as stream:
        assert stream.read() == b"large"
    local = tmp_path / "x.parquet"
    assert not io.put_whole(str(local), b"x")  # not S3: nothing done, the FileIO's own write
    write_whole(io, str(local), b"x")
    assert local.read_bytes() == b"x"


def test_closing_a_file_beyond_the_upload_budget_waits_for_earlier_uploads(
    seaweedfs: SeaweedFS, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_io, "UPLOAD_BUDGET_BYTES", 10)
    inner = _GatedIO(seaweedfs.s3_properties())
    keys = [f"budget/{uuid.uuid4()}.parquet" for _ in range(2)]

    def write(key: str) -> None:
        with io.new_output(f"s3://{bucket}/{key}").create(overwrite=True) as stream:
            stream.write(b"8 bytes!")

    with uploading(inner) as io:
        write(keys[0])  # handed over: its upload waits for `release`
        second = threading.Thread(target=write, args=(keys[1],))
        second.start()
        time.sleep(0.3)
        assert second.is_alive()  # 8 + 8 bytes > 10: waits for the first upload to end
        inner.release.set()
        second.join(timeout=10)
        assert not second.is_alive()
    assert all(_exists(seaweedfs, bucket, key) for key in keys)


def test_a_configuration_the_signed_requests_do_not_cover_reads_through_pyarrow(
    seaweedfs: SeaweedFS, bucket: str, count: Any
) -> None:
    seaweedfs.s3_client().put_object(Bucket=bucket, Key="other/m.avro", Body=b"body")
    io = _io(seaweedfs, **{"s3.retry-strategy-impl": "pyarrow.fs.AwsStandardS3RetryStrategy"})
    before = seaweedfs.s3_requests()
    assert read_whole(io, f"s3://{bucket}/other/m.avro") == b"body"
    assert count(before) == {"GET": 2}  # pyarrow's HEAD, then its GET
