"""Orphan removal beside writes in progress (issue 30, item 3), all writers real processes.

A writer process is paused inside its commit (`PIPELINE_OUTPUT_FAULT=in_commit:pause:<gate>`):
its data files, manifests and manifest list are written, the catalog has not swapped. This process
then removes orphans — at grace 0, and at the default grace with every file of the table
back-dated two hours (a write that has run that long) — and lets the writer go on. The table must
stay readable, the write must land with all its files, the sweep must still remove a real orphan,
and the rows must equal the polars oracle.

A writer outside the project's locks (`lock=None`, or one whose lock's session was terminated) is
not protected from the sweep: its commit must then fail cleanly — `FilesRemoved` or `LockLost`,
nothing committed — never reference a file that is gone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.errors import LockUnavailable
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.services import doctor
from pipeline_output.stores.iceberg.maintenance.orphans import (
    DEFAULT_GRACE_S,
    norm,
    referenced,
    table_orphans,
)
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output_tests.oracle import assert_same_multiset
from pipeline_output_tests.reliability.report import record

NS = "datasets"
NAME = "busy"
TIMEOUT_S = 120
KEYED = DatasetSpec(name=NAME, primary_key=("id",), strategy="snapshot_replace")
APPENDED = DatasetSpec(name=NAME, primary_key=("id",), strategy="append_always")


def rows(ids: range, version: int) -> pl.DataFrame:
    return pl.DataFrame(
        {"id": pl.Series(list(ids), dtype=pl.Int64), "v": pl.Series([version] * len(ids))}
    )


def last_wins(*frames: pl.DataFrame) -> pl.DataFrame:
    """The oracle of upserts: every key once, with the last frame's row (plain polars)."""
    return pl.concat(frames).unique(subset="id", keep="last", maintain_order=True)


# -- what each kind of writer does, before (main process) and paused (writer process) ----------


def _setup(kind: str, store: IcebergStore) -> pl.DataFrame:
    """Write the table the paused writer will change; the rows it holds."""
    if kind == "compact":  # six small files for the compaction to rewrite
        for n in range(6):
            store.write(APPENDED, rows(range(n * 10, n * 10 + 10), 0))
        return rows(range(60), 0)
    store.write(KEYED, rows(range(100), 0))
    return rows(range(100), 0)


def _write(kind: str, store: IcebergStore) -> None:
    """The write that pauses in its commit (in the writer process)."""
    if kind == "upsert":  # merges and rewrites files under the table's lock
        store.write(KEYED, rows(range(50, 150), 1))
    elif kind == "append":  # data files written before the lock (pre-written)
        store.write(APPENDED, rows(range(100, 150), 1))
    elif kind == "stream":  # batches streamed to files before the lock
        store.replace_streaming(KEYED, iter([rows(range(200, 250), 2), rows(range(250, 300), 2)]))
    elif kind == "branch":  # an audited write: committed to its branch, main unchanged
        store.write(KEYED, rows(range(50, 150), 1), branch="audit-orphans")
    elif kind == "compact":
        result = store.compact(APPENDED, min_input_files=2, max_attempts=1)
        assert result.files_added == 1, result
    else:
        raise AssertionError(kind)


def _expected(kind: str, before: pl.DataFrame) -> pl.DataFrame:
    """What main reads after the paused write landed (plain polars)."""
    if kind == "upsert":
        return last_wins(before, rows(range(50, 150), 1))
    if kind == "append":
        return pl.concat([before, rows(range(100, 150), 1)])
    if kind == "stream":
        return pl.concat([rows(range(200, 250), 2), rows(range(250, 300), 2)])
    return before  # compact: the same rows; branch: main unchanged


def _writer(
    kind: str, catalog_name: str, props: dict[str, str], url: str, guard: str, gate: str, out: Any
) -> None:
    """A writer process paused in its commit until `gate` exists. `guard`: `lock` (the project's
    advisory lock) or `none` (`lock=None`: outside the project's locks)."""
    os.environ["PIPELINE_OUTPUT_FAULT"] = f"in_commit:pause:{gate}"
    try:
        import warnings

        from pipeline_output.stores.iceberg.table.catalog import FlatSqlCatalog

        lock = AdvisoryLock(url) if guard == "lock" else None
        store = IcebergStore(FlatSqlCatalog(catalog_name, **props), NS, lock=lock)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lock=None warns that it is unsafe: it is the point
            _write(kind, store)
        out.put((kind, None))
    except BaseException as exc:
        out.put((kind, f"{type(exc).__name__}: {exc}"))


# -- the harness ------------------------------------------------------------------------------


def files_under(location: str) -> list[Path]:
    return [p for p in Path(location.removeprefix("file://")).rglob("*") if p.is_file()]


def back_date(paths: list[Path], seconds: float) -> None:
    past = time.time() - seconds
    for path in paths:
        os.utime(path, (past, past))


def plant_orphan(store: IcebergStore, spec: DatasetSpec) -> Path:
    """What a writer killed before its commit leaves: a data file no snapshot has, 2 hours old."""
    table = store.load(spec)
    assert table is not None
    writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
    writer.write(rows(range(999_000, 999_001), 9))
    path = Path(writer.written[0].removeprefix("file://"))
    back_date([path], 7200)
    return path


def assert_whole(catalog: Any, spec: DatasetSpec, expected: pl.DataFrame, ref: str) -> None:
    """A fresh handle reads `ref` (every file it references exists) and it equals `expected`."""
    table = catalog.load_table((NS, spec.name))
    missing = [p for p in referenced(table) if not Path(p).exists()]
    assert missing == [], f"the table references {len(missing)} missing file(s): {missing[:3]}"
    got = pl.from_arrow(table.scan().use_ref(ref).to_arrow())
    assert isinstance(got, pl.DataFrame)
    assert_same_multiset(got, expected)


class Paused:
    """A writer process started and paused inside its commit; `release()` lets it finish."""

    def __init__(self, kind: str, catalog: Any, url: str, guard: str, tmp: Path) -> None:
        self.gate = tmp / f"gate-{uuid.uuid4().hex[:8]}"
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        props = {k: str(v) for k, v in catalog.properties.items()}
        self.proc = ctx.Process(
            target=_writer,
            args=(kind, catalog.name, props, url, guard, str(self.gate), self.out),
        )
        self.proc.start()
        deadline = time.monotonic() + TIMEOUT_S
        while not Path(f"{self.gate}.paused").exists():
            if not self.proc.is_alive() or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"the writer never reached its commit: {self.out.get(0.1)}")
            time.sleep(0.02)

    def release(self) -> str | None:
        """Let the writer commit; its error (None: it committed)."""
        self.gate.touch()
        try:
            _, error = self.out.get(timeout=TIMEOUT_S)
            return error  # type: ignore[no-any-return]
        finally:
            self.proc.join(timeout=30)
            if self.proc.is_alive():
                self.proc.kill()


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run `fn` in a thread now; the returned callable joins it and returns (or raises) its
    outcome."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(TIMEOUT_S)
        assert not thread.is_alive(), "the orphan sweep did not finish"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


# -- the scenarios ----------------------------------------------------------------------------

SLOW = pytest.mark.slow
# each kind of writer at grace 0 or at the default grace; the other grace of each is `slow`
BESIDE = [
    ("upsert", "zero"),
    ("upsert", "default"),
    ("append", "zero"),
    pytest.param("append", "default", marks=SLOW),
    pytest.param("stream", "zero", marks=SLOW),
    ("stream", "default"),
    ("compact", "zero"),
    pytest.param("compact", "default", marks=SLOW),
    pytest.param("branch", "zero", marks=SLOW),
    ("branch", "default"),
]


@pytest.mark.parametrize(("kind", "grace"), BESIDE)
def test_orphan_removal_beside_a_writer_paused_in_its_commit_never_breaks_the_table(
    kind: str, grace: str, catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    spec = APPENDED if kind == "compact" else KEYED
    before = _setup(kind, store)
    orphan = plant_orphan(store, spec)
    location = store.load(spec).location()  # type: ignore[union-attr]
    writer = Paused(kind, catalog, pg_db_url, "lock", tmp_path)
    if grace == "default":  # the write has been running for two hours: older than the grace
        back_date(files_under(location), 7200)
    grace_s = 0.0 if grace == "zero" else DEFAULT_GRACE_S
    # the paused write's files: unreferenced and past the grace, they look like orphans
    at_risk = len(table_orphans(store.load(spec), grace_s=grace_s)) - 1  # type: ignore[arg-type]
    assert at_risk >= 3  # at least a data file, a manifest and the manifest list
    sweep = in_thread(lambda: store.remove_orphans(spec, grace_s=grace_s))
    time.sleep(0.5)  # the sweep lists the table while the writer is paused in its commit

    error = writer.release()
    result = sweep()

    assert error is None, error  # the write landed
    assert_whole(fresh_catalog(), spec, _expected(kind, before), "main")
    if kind == "branch":
        assert_whole(
            fresh_catalog(), spec, last_wins(before, rows(range(50, 150), 1)), "audit-orphans"
        )
    assert not orphan.exists() and result.files == 1  # the real orphan went, nothing else
    assert result.wait_s >= 0.3  # the sweep waited for the write in progress
    table = fresh_catalog().load_table((NS, spec.name))
    known = referenced(table)
    assert [p for p in files_under(location) if norm(str(p)) not in known] == []
    record(
        f"orphan removal beside a {kind} writer paused in its commit, grace {grace}",
        writer_files_kept=at_risk,
        sweep_wait_s=round(result.wait_s, 3),
        orphans_removed=result.files,
        rows=_expected(kind, before).height,
    )


@pytest.mark.parametrize("sweeper", ["remove_orphans", "doctor"])
def test_orphan_removal_gives_up_while_a_write_stays_in_progress_and_deletes_nothing(
    sweeper: str, catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    before = _setup("append", store)
    orphan = plant_orphan(store, KEYED)
    location = store.load(KEYED).location()  # type: ignore[union-attr]

    def sweep(wait_s: float) -> int:
        if sweeper == "doctor":  # `pipeline-output doctor --fix --grace 0`
            return doctor.remove_orphans(
                doctor.find_orphans(catalog, NS, grace_s=0), store=store, wait_s=wait_s
            )
        return store.remove_orphans(KEYED, grace_s=0, wait_s=wait_s).files

    writer = Paused("append", catalog, pg_db_url, "lock", tmp_path)
    try:
        back_date(files_under(location), 7200)
        listed = {Path(o.path.removeprefix("file://")) for o in doctor.find_orphans(catalog, NS)}
        assert len(listed) > 1  # the writer's pre-written files look like orphans, and are old
        with pytest.raises(LockUnavailable, match=f"dataset '{NAME}'.*in progress"):
            sweep(0.3)
        assert orphan.exists() and all(p.exists() for p in listed)  # nothing was deleted
    finally:
        error = writer.release()
    assert error is None, error
    assert_same_multiset(
        pl.from_arrow(store.load(KEYED).scan().to_arrow()),  # type: ignore[union-attr,arg-type]
        pl.concat([before, rows(range(100, 150), 1)]),
    )
    assert sweep(5) == 1 and not orphan.exists()  # afterwards: the orphan goes, nothing else


def test_a_metadata_file_newer_than_the_current_one_is_a_commit_under_way_never_an_orphan(
    catalog: Any, pg_db_url: str
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    _setup("upsert", store)
    metadata = Path(store.load(KEYED).location().removeprefix("file://")) / "metadata"  # type: ignore[union-attr]
    # a committer outside the project's locks wrote its next version and has not swapped yet
    committing = metadata / f"00099-{uuid.uuid4()}.metadata.json"
    stale = metadata / f"00000-{uuid.uuid4()}.metadata.json"  # a failed commit long ago
    for path in (committing, stale):
        path.write_text("{}")
    back_date([committing, stale], 7200)

    assert store.remove_orphans(KEYED).files == 1
    assert committing.exists() and not stale.exists()
    assert_same_multiset(
        pl.from_arrow(store.load(KEYED).scan().to_arrow()),  # type: ignore[union-attr,arg-type]
        rows(range(100), 0),
    )


def _terminate_lock_sessions(url: str) -> int:
    """Terminate every other session of the database holding an advisory lock (a failover, an
    idle-session killer); how many."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid <> pg_backend_pid() "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("kind", "guard"),
    [
        ("upsert", "none"),
        ("append", "none"),
        ("upsert", "lost"),
        pytest.param("append", "lost", marks=SLOW),
    ],
)
def test_a_writer_outside_the_locks_whose_files_were_swept_commits_nothing(
    kind: str, guard: str, catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    before = _setup(kind, store)
    snapshot = store.load(KEYED).current_snapshot().snapshot_id  # type: ignore[union-attr]
    writer = Paused(kind, catalog, pg_db_url, "none" if guard == "none" else "lock", tmp_path)
    if guard == "lost":
        assert _terminate_lock_sessions(pg_db_url) >= 1

    swept = store.remove_orphans(KEYED, grace_s=0)  # the writer's files are not protected
    error = writer.release()

    assert swept.files > 0
    expected = "FilesRemoved" if guard == "none" else "LockLost"
    assert error is not None and error.startswith(expected), error
    assert NAME in error and "nothing was committed" in error  # names the dataset (or table)
    table = fresh_catalog().load_table((NS, NAME))
    assert table.current_snapshot().snapshot_id == snapshot
    assert_whole(fresh_catalog(), KEYED, before, "main")
    record(
        f"a {kind} writer outside the locks ({guard}) whose files an orphan sweep removed",
        files_swept=swept.files,
        writer_error=error.split(":")[0],
    )
