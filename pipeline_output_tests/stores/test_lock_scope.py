"""What the per-table writer lock covers: data files of as-is writes are written before it.

Each test takes the table's advisory lock itself (a second Postgres session, as another writer
would), starts a write in a thread, and watches what the blocked writer has already done: for
append, replace, append_new and the model node's streaming replace the data files exist (and the
batches were computed) before the lock is granted; upsert writes nothing until it holds the lock.
When the table changed under the pre-written files, the write falls back (or refuses) and leaves
no files behind. The window apply lock likewise finds the window's files already written; a run
that loses the race for a window deletes its files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest

from pipeline_output import DatasetSpec, Delta, IcebergStore, WriteConflict
from pipeline_output.contract.plan import WriteResult
from pipeline_output.infra.locks import AdvisoryLock, lock_key
from pipeline_output.services.doctor import find_orphans
from pipeline_output_tests.oracle import assert_same_multiset

NS = "datasets"


def _rows(ids: range, tag: str) -> pl.DataFrame:
    return pl.DataFrame({"id": list(ids), "v": [f"{tag}{i}" for i in ids]})


def _data_files(tmp_path: Path, name: str) -> set[str]:
    return {p.name for p in (tmp_path / "warehouse" / NS / name / "data").glob("*.parquet")}


class HeldLock:
    """The table's writer lock, held by this test on its own session until `release()`."""

    def __init__(self, url: str, table: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("SELECT pg_advisory_lock(%s)", (lock_key(f"iceberg:{NS}.{table}"),))

    def release(self) -> None:
        self.conn.close()


def _in_thread(fn: Callable[[], WriteResult]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _blocked_on_advisory_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("strategy", ["append_always", "replace", "append_new"])
def test_as_is_writes_put_their_data_files_down_before_taking_the_lock(
    strategy: str, catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="t", primary_key="id", strategy=strategy)  # type: ignore[arg-type]
    base, batch = _rows(range(0, 100), "a"), _rows(range(100, 150), "b")
    store.write(spec, base)
    before = _data_files(tmp_path, "t")

    held = HeldLock(pg_db_url, "t")
    thread, out = _in_thread(lambda: store.write(spec, batch))
    try:
        assert _wait_for(lambda: _blocked_on_advisory_lock(pg_db_url)), "writer never blocked"
        new_files = _data_files(tmp_path, "t") - before
        assert len(new_files) == 1, "the blocked writer had not written its data file yet"
        table = fresh_catalog().load_table((NS, "t"))
        assert len(table.snapshots()) == 1  # written, not committed
    finally:
        held.release()
    thread.join(60)
    assert "error" not in out, out.get("error")
    result = out["result"]
    assert result.lock_held_s > 0 and result.lock_held_s < result.duration_s

    table = fresh_catalog().load_table((NS, "t"))
    live = {Path(t.file.file_path).name for t in table.scan().plan_files()}
    assert new_files <= live  # the pre-written file is the one committed
    assert _data_files(tmp_path, "t") - before == new_files  # and nothing else was written
    expected = batch if strategy == "replace" else pl.concat([base, batch])
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected)


def test_sync_merge_writes_no_data_file_before_it_holds_the_lock(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="u", primary_key="id", strategy="sync")
    store.write(spec, _rows(range(0, 100), "a"))
    before = _data_files(tmp_path, "u")

    held = HeldLock(pg_db_url, "u")
    thread, out = _in_thread(lambda: store.write(spec, _rows(range(50, 150), "b")))
    try:
        assert _wait_for(lambda: _blocked_on_advisory_lock(pg_db_url))
        time.sleep(0.3)
        assert _data_files(tmp_path, "u") == before  # the merge depends on the files: inside
    finally:
        held.release()
    thread.join(60)
    assert "error" not in out, out.get("error")
    got = pl.from_arrow(fresh_catalog().load_table((NS, "u")).scan().to_arrow())
    assert_same_multiset(got, _rows(range(50, 150), "b"))  # sync: absent keys deleted


def test_append_whose_table_gained_a_column_meanwhile_is_rewritten_inside_the_lock(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="e", primary_key="id", strategy="append_always")
    store.write(spec, _rows(range(0, 10), "a"))
    before = _data_files(tmp_path, "e")

    held = HeldLock(pg_db_url, "e")
    thread, out = _in_thread(lambda: store.write(spec, _rows(range(10, 20), "b")))
    try:
        assert _wait_for(lambda: _blocked_on_advisory_lock(pg_db_url))
        assert _wait_for(lambda: len(_data_files(tmp_path, "e") - before) == 1)
        # another writer (holding the lock) evolves the schema before our commit
        other = fresh_catalog().load_table((NS, "e"))
        from pyiceberg.types import StringType

        with other.update_schema() as update:
            update.add_column("note", StringType())
    finally:
        held.release()
    thread.join(60)
    assert "error" not in out, out.get("error")
    table = fresh_catalog().load_table((NS, "e"))
    got = pl.from_arrow(table.scan().to_arrow())
    assert got.columns == ["id", "v", "note"]
    assert got.get_column("note").null_count() == 20
    assert_same_multiset(
        got.drop("note"), pl.concat([_rows(range(0, 10), "a"), _rows(range(10, 20), "b")])
    )
    live = {Path(t.file.file_path).name for t in table.scan().plan_files()}
    assert _data_files(tmp_path, "e") == live  # the stale pre-written file was deleted
    assert find_orphans(catalog, NS, grace_s=0) == []


def _scored(batches: int, *, seen: list[int]) -> Iterator[pl.DataFrame]:
    for i in range(batches):
        seen.append(i)
        yield pl.DataFrame({"id": list(range(i * 10, i * 10 + 10)), "score": [float(i)] * 10})


def test_streaming_replace_computes_and_writes_every_batch_before_taking_the_lock(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="m", primary_key="id", strategy="replace")
    store.replace_streaming(spec, _scored(2, seen=[]))
    before = _data_files(tmp_path, "m")

    seen: list[int] = []
    held = HeldLock(pg_db_url, "m")
    thread, out = _in_thread(lambda: store.replace_streaming(spec, _scored(5, seen=seen)))
    try:
        assert _wait_for(lambda: _blocked_on_advisory_lock(pg_db_url))
        assert seen == [0, 1, 2, 3, 4]  # every batch was scored while another writer held the lock
        assert len(_data_files(tmp_path, "m") - before) == 5
    finally:
        held.release()
    thread.join(60)
    assert "error" not in out, out.get("error")
    got = pl.from_arrow(fresh_catalog().load_table((NS, "m")).scan().to_arrow())
    assert_same_multiset(got, pl.concat(list(_scored(5, seen=[]))))


def test_streaming_replace_refuses_when_the_schema_changed_meanwhile_and_cleans_up(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="r", primary_key="id", strategy="replace")
    first = store.replace_streaming(spec, _scored(2, seen=[]))
    held = HeldLock(pg_db_url, "r")
    thread, out = _in_thread(lambda: store.replace_streaming(spec, _scored(3, seen=[])))
    try:
        assert _wait_for(lambda: _blocked_on_advisory_lock(pg_db_url))
        from pyiceberg.types import StringType

        with fresh_catalog().load_table((NS, "r")).update_schema() as update:
            update.add_column("note", StringType())
    finally:
        held.release()
    thread.join(60)
    assert isinstance(out.get("error"), WriteConflict), out
    assert "'r'" in str(out["error"]) and "nothing was committed" in str(out["error"])
    table = fresh_catalog().load_table((NS, "r"))
    assert table.current_snapshot().snapshot_id == first.snapshot_id
    assert pl.from_arrow(table.scan().to_arrow()).height == 20
    assert find_orphans(catalog, NS, grace_s=0) == []  # the refused write removed its files


# -- the window apply lock -------------------------------------------------------------------------


def _window_setup(pg_db_url: str, catalog: Any) -> tuple[Any, Any, DatasetSpec]:
    from pipeline_output.ledger import Ledger
    from pipeline_output.ledger.window_ledger import WindowLedger
    from pipeline_output.services.publish import Publisher

    Ledger(pg_db_url).migrate()
    ledger = WindowLedger(pg_db_url)
    publisher = Publisher(iceberg=IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url)))
    spec = DatasetSpec(
        name="w",
        primary_key="id",
        strategy="append_always",
        delta=Delta(source="ev", watermark="seq"),
    )
    return publisher, ledger, spec


def _window_rows(lo: int, hi: int) -> pl.DataFrame:
    return pl.DataFrame({"id": list(range(lo + 1, hi + 1)), "seq": list(range(lo + 1, hi + 1))})


def test_racing_runs_of_one_window_write_files_before_the_apply_lock_and_the_loser_cleans_up(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    from pipeline_output import Window
    from pipeline_output.services.publish import ResolvedMode
    from pipeline_output.services.window_apply import ApplyRequest, apply_window

    publisher, ledger, spec = _window_setup(pg_db_url, catalog)
    mode = ResolvedMode("iceberg", "run config")
    first, second = Window(None, 100), Window(100, 200)
    ledger.plan("w", [first, second])
    apply_window(
        ApplyRequest(
            spec=spec,
            window=first,
            mode=mode,
            run_id="r0",
            compute=lambda: _window_rows(0, 100),
        ),
        publisher=publisher,
        ledger=ledger,
    )
    before = _data_files(tmp_path, "w")

    held = psycopg.connect(pg_db_url, autocommit=True)
    held.execute("SELECT pg_advisory_lock(%s)", (lock_key("windows:apply:w"),))

    def run(run_id: str) -> Any:
        return apply_window(
            ApplyRequest(
                spec=spec,
                window=second,
                mode=mode,
                run_id=run_id,
                compute=lambda: _window_rows(100, 200),
            ),
            publisher=publisher,
            ledger=ledger,
        )

    threads = [_in_thread(lambda rid=rid: run(rid)) for rid in ("ra", "rb")]
    try:
        # both runs computed and wrote their data file while the apply lock was held elsewhere
        assert _wait_for(lambda: len(_data_files(tmp_path, "w") - before) == 2)
    finally:
        held.close()
    outcomes = []
    for thread, out in threads:
        thread.join(60)
        assert "error" not in out, out.get("error")
        outcomes.append(out["result"].action)
    assert sorted(outcomes) == ["applied", "skipped"]
    table = fresh_catalog().load_table((NS, "w"))
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), _window_rows(0, 200))
    live = {Path(t.file.file_path).name for t in table.scan().plan_files()}
    assert _data_files(tmp_path, "w") == live  # the skipped run deleted its file
    assert find_orphans(catalog, NS, grace_s=0) == []
