"""Acceptance: maintenance beside concurrent writers, all real processes — compaction and expiry
lose nothing, duplicate nothing and delete no live file; a compaction killed in its commit leaves
the table as it was.

Two writer processes upsert into one table (each round: new keys, plus updates of keys it wrote
in an earlier round, which rewrites files the compaction is compacting) while a third process
compacts the table in a loop. Compactions that lose a race re-plan (or give up cleanly); the
table at the end equals the oracle over the union of every write: each key once, with the last
version its writer wrote.

A compaction SIGKILLed inside its commit (its output files, manifests and manifest list written,
the catalog not swapped: `PIPELINE_OUTPUT_FAULT=in_commit`) leaves the table as it was; its
writer lock dies with it, the next compaction runs at once, and orphan removal deletes exactly
the killed one's files.

Expiry in a loop (every snapshot but the head, older_than 0) beside two upserting writer
processes: every file the final table references still exists, and its rows equal the oracle.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path
from typing import Any

import polars as pl

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output_tests.oracle import assert_same_multiset

NS = "datasets"
SPEC = DatasetSpec(name="busy", primary_key=("id",), strategy="snapshot_replace")
ROUNDS = 10
NEW_PER_ROUND = 20
UPDATED_PER_ROUND = 5


def _writes(writer: int) -> list[pl.DataFrame]:
    """Writer `writer`'s rounds: new keys, and (from round 1) the first keys of the previous
    round updated to this round's version."""
    out = []
    base = 100_000 * (writer + 1)
    for r in range(ROUNDS):
        ids = list(range(base + r * NEW_PER_ROUND, base + (r + 1) * NEW_PER_ROUND))
        if r:
            prev = base + (r - 1) * NEW_PER_ROUND
            ids += list(range(prev, prev + UPDATED_PER_ROUND))
        out.append(
            pl.DataFrame(
                {
                    "id": pl.Series(ids, dtype=pl.Int64),
                    "writer": pl.Series([writer] * len(ids), dtype=pl.Int64),
                    "version": pl.Series([r] * len(ids), dtype=pl.Int64),
                }
            )
        )
    return out


def _oracle(writers: int) -> pl.DataFrame:
    """The union of every write, the last write of a key winning (plain polars)."""
    every = pl.concat([f for w in range(writers) for f in _writes(w)])
    return every.group_by("id").agg(pl.all().sort_by("version").last())


def _store(catalog_name: str, props: dict[str, str], lock_url: str) -> IcebergStore:
    from pyiceberg.catalog.sql import SqlCatalog

    return IcebergStore(SqlCatalog(catalog_name, **props), NS, lock=AdvisoryLock(lock_url))


def _writer(
    writer: int, name: str, props: dict[str, str], url: str, barrier: Any, out: Any
) -> None:
    try:
        store = _store(name, props, url)
        barrier.wait(timeout=120)
        for n, frame in enumerate(_writes(writer)):
            store.write(SPEC, frame, run_id=f"w{writer}-{n}")
            time.sleep(0.02)
        out.put(("writer", writer, None))
    except BaseException as exc:
        barrier.abort()
        out.put(("writer", writer, f"{type(exc).__name__}: {exc}"))


def _maintaining(
    kind: str,
    step: Any,
    tally: dict[str, int],
    url_args: tuple[str, dict[str, str], str],
    *rest: Any,
) -> None:
    """A maintenance process: `step(store, tally)` in a loop from the barrier until `stop`
    exists, then `(kind, tally, error or None)` reported on `out`."""
    stop, barrier, out = rest
    try:
        store = _store(*url_args)
        barrier.wait(timeout=120)
        while not Path(stop).exists():
            step(store, tally)
        out.put((kind, tally, None))
    except BaseException as exc:
        barrier.abort()
        out.put((kind, tally, f"{type(exc).__name__}: {exc}"))


def _compact_once(store: IcebergStore, stats: dict[str, int]) -> None:
    from pipeline_output.errors import MaintenanceConflict

    try:
        result = store.compact(SPEC, min_input_files=2, max_attempts=3)
    except MaintenanceConflict:
        stats["gave_up"] += 1
        return
    stats["noop" if result.noop else "committed"] += 1
    stats["retried"] += result.attempts - 1


def _compactor(name: str, props: dict[str, str], url: str, *rest: Any) -> None:
    stats = {"committed": 0, "retried": 0, "gave_up": 0, "noop": 0}
    _maintaining("compactor", _compact_once, stats, (name, props, url), *rest)


def _expire_once(store: IcebergStore, tally: dict[str, int]) -> None:
    from datetime import timedelta

    result = store.expire_snapshots(SPEC, older_than=timedelta(0), retain_last=1)
    tally["expired"] += result.snapshots_expired
    time.sleep(0.01)


def _expirer(name: str, props: dict[str, str], url: str, *rest: Any) -> None:
    _maintaining("expirer", _expire_once, {"expired": 0}, (name, props, url), *rest)


def _beside_writers(
    maintainer: Any, catalog: Any, pg_db_url: str, tmp_path: Path
) -> tuple[IcebergStore, Any]:
    """Two `_writer` processes and one `maintainer(name, props, url, stop, barrier, out)` process
    started together (a barrier); the maintainer stopped once both writers are done. The store
    (its table seeded with one row, id -1) and what the maintainer reported."""
    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    store.write(SPEC, _writes(0)[0].head(1).with_columns(id=pl.lit(-1, dtype=pl.Int64)))
    props = {k: str(v) for k, v in catalog.properties.items()}
    stop = str(tmp_path / "stop")
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [
        *(
            ctx.Process(target=_writer, args=(w, catalog.name, props, pg_db_url, barrier, out))
            for w in range(2)
        ),
        ctx.Process(target=maintainer, args=(catalog.name, props, pg_db_url, stop, barrier, out)),
    ]
    for p in procs:
        p.start()
    errors: list[str] = []
    reported: Any = None
    try:
        for _ in range(2):
            _, _, err = out.get(timeout=300)
            if err:
                errors.append(err)
        Path(stop).touch()
        _, reported, err = out.get(timeout=120)
        if err:
            errors.append(err)
    except queue.Empty:
        errors.append("a process did not report in time")
    finally:
        Path(stop).touch()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not errors, errors
    return store, reported


def _every_write() -> pl.DataFrame:
    """The table's oracle after `_beside_writers`: both writers' rows, last wins, and the seed."""
    seed = pl.DataFrame({"id": [-1], "writer": [0], "version": [0]}, schema=_oracle(2).schema)
    return pl.concat([_oracle(2), seed])


def test_compaction_beside_concurrent_writer_processes_loses_and_duplicates_nothing(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    store, stats = _beside_writers(_compactor, catalog, pg_db_url, tmp_path)
    assert sum(stats.values()) > 0, stats  # the compactor ran while the writers wrote

    final = store.compact(SPEC, min_input_files=2)  # and once more, alone
    table = pl.from_arrow(fresh_catalog().load_table((NS, SPEC.name)).scan().to_arrow())
    assert isinstance(table, pl.DataFrame)
    expected = _every_write()
    assert table.group_by("id").len().filter(pl.col("len") > 1).height == 0  # no duplicate
    assert_same_multiset(table.select(expected.columns), expected)  # nothing lost, last wins
    ops = [
        s.summary.operation.value for s in fresh_catalog().load_table((NS, SPEC.name)).snapshots()
    ]
    assert ops.count("replace") == stats["committed"] + (0 if final.noop else 1)


APPENDED = DatasetSpec(name="appended", primary_key=("id",), strategy="append_always")


def _killed_compactor(name: str, props: dict[str, str], url: str) -> None:
    """Compacts the table and is SIGKILLed inside its commit: its output files, manifests and
    manifest list written, the catalog not swapped (`PIPELINE_OUTPUT_FAULT=in_commit`)."""
    import os

    os.environ["PIPELINE_OUTPUT_FAULT"] = "in_commit"
    result = _store(name, props, url).compact(APPENDED, min_input_files=2)
    raise SystemExit(f"not killed: {result}")  # not reached: the fault point kills the process


def test_a_compaction_killed_in_its_commit_changes_nothing_and_the_next_one_compacts(
    catalog: Any, fresh_catalog: Any, pg_db_url: str
) -> None:
    from pipeline_output.stores.iceberg.maintenance.orphans import norm, referenced

    store = IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url))
    frames = [f.head(NEW_PER_ROUND) for f in _writes(0)[:6]]  # six appends: six small files
    for frame in frames:
        store.write(APPENDED, frame)
    expected = pl.concat(frames)
    before = fresh_catalog().load_table((NS, APPENDED.name))
    head = before.current_snapshot().snapshot_id
    location = Path(before.location().removeprefix("file://"))

    def unreferenced() -> list[Path]:
        known = referenced(fresh_catalog().load_table((NS, APPENDED.name)))
        return [p for p in location.rglob("*") if p.is_file() and norm(str(p)) not in known]

    assert unreferenced() == []
    props = {k: str(v) for k, v in catalog.properties.items()}
    killed = mp.get_context("spawn").Process(
        target=_killed_compactor, args=(catalog.name, props, pg_db_url)
    )
    killed.start()
    killed.join(timeout=120)
    assert killed.exitcode == -9  # SIGKILL, in its commit

    table = fresh_catalog().load_table((NS, APPENDED.name))
    assert table.current_snapshot().snapshot_id == head  # nothing committed
    assert_same_multiset(pl.from_arrow(table.scan().to_arrow()), expected)  # type: ignore[arg-type]
    left = unreferenced()
    assert any(p.suffix == ".parquet" for p in left)  # its output files: orphans now

    result = store.compact(APPENDED, min_input_files=2)  # its lock died with it: no wait
    assert not result.noop and result.files_added >= 1
    assert_same_multiset(store.read(APPENDED), expected)
    swept = store.remove_orphans(APPENDED, grace_s=0)
    assert swept.files == len(left)  # exactly the killed compaction's files
    assert unreferenced() == []
    assert_same_multiset(
        pl.from_arrow(fresh_catalog().load_table((NS, APPENDED.name)).scan().to_arrow()),  # type: ignore[arg-type]
        expected,
    )


def test_expiry_in_a_loop_beside_concurrent_writer_processes_deletes_no_live_file(
    catalog: Any, fresh_catalog: Any, pg_db_url: str, tmp_path: Path
) -> None:
    """Two writer processes upsert (rewriting each other's files) while a third expires every
    snapshot but the head in a loop and deletes what only those referenced: every file the table
    references still exists, and the rows equal the oracle."""
    from pipeline_output.stores.iceberg.maintenance.orphans import norm, referenced

    _, tally = _beside_writers(_expirer, catalog, pg_db_url, tmp_path)
    assert tally["expired"] > 0  # the expirer removed snapshots while the writers wrote
    table = fresh_catalog().load_table((NS, SPEC.name))
    location = Path(table.location().removeprefix("file://"))
    on_disk = {norm(str(p)) for p in location.rglob("*") if p.is_file()}
    assert referenced(table) <= on_disk  # no file a snapshot references was deleted
    expected = _every_write()
    rows = pl.from_arrow(table.scan().to_arrow())
    assert_same_multiset(rows.select(expected.columns), expected)  # type: ignore[union-attr]
