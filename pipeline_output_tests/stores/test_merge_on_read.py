"""Merge-on-read on the native arm: tables that carry positional delete files.

Every strategy x re-deploy (x window), each write run twice against the polars oracle, on a table
that already carries delete files, with each merge mode; the per-file choice (hint, table
property, cost); delete files folded or removed with their data file; every reader — the store,
a fresh pyiceberg scan, `pl.scan_iceberg`, lazy reads, another process — sees the same rows.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import uuid
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFileContent, ManifestContent

from pipeline_output import DatasetSpec
from pipeline_output.errors import UnsupportedWrite
from pipeline_output.infra.settings import to_sqlalchemy_url
from pipeline_output.services.reads import scan_table
from pipeline_output.stores.iceberg.snapshot.commit import write_files
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter, DeleteFileWriter
from pipeline_output_tests.iceberg_harness import (
    NS,
    WINDOW,
    base,
    customers,
    redeploy_rows,
    spec_for,
    window_rows,
)
from pipeline_output_tests.oracle import IDEMPOTENT, KEYED_NOOP, STRATEGIES, assert_same_multiset

HINTS = ("merge-on-read", "copy-on-write", "auto")


def _hinted(spec: DatasetSpec, hint: str) -> DatasetSpec:
    return dataclasses.replace(spec, write_strategy_hint=hint)  # type: ignore[arg-type]


def _delete_files(h: Any, spec: DatasetSpec) -> list[Any]:
    return [d for t in h.table(spec).scan().plan_files() for d in t.delete_files]


def _with_delete_files(h: Any, spec: DatasetSpec) -> None:
    """base() deployed, then ids 1..3 changed and 4..5 deleted by position: a table whose one data
    file carries one delete file (written through the oracle-checked harness)."""
    upsert = _hinted(spec_for("snapshot_replace", delta=spec.delta is not None), "merge-on-read")
    h.write_and_check(upsert, base(), run_id="b0")
    changed = customers(range(1, 4), version=9)
    res, _ = h.write_and_check(upsert, changed, run_id="b1")
    assert res.files_merged_on_read == 1 and res.files_rewritten == 0
    kept = pl.concat([changed, base().filter(pl.col("id") > 5)])
    sync = _hinted(spec_for("sync", delta=spec.delta is not None), "merge-on-read")
    h.write_and_check(sync, kept, run_id="b2")
    assert len(_delete_files(h, spec)) >= 1


@pytest.mark.parametrize("hint", HINTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_redeploys_a_table_carrying_delete_files_and_reruns_safely(
    h: Any, strategy: str, hint: str
) -> None:
    spec = _hinted(spec_for(strategy), hint)
    _with_delete_files(h, spec)
    data = redeploy_rows()
    _, exp1 = h.write_and_check(spec, data, run_id="r1")
    res2, _ = h.write_and_check(spec, data, run_id="r2")
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.raw(spec), exp1.table)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


@pytest.mark.parametrize("hint", HINTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_writes_a_window_into_a_table_carrying_delete_files_and_reruns_safely(
    h: Any, strategy: str, hint: str
) -> None:
    spec = _hinted(spec_for(strategy, delta=True), hint)
    _with_delete_files(h, spec)
    data = window_rows()
    _, exp1 = h.write_and_check(spec, data, window=WINDOW, run_id="w1")
    res2, _ = h.write_and_check(spec, data, window=WINDOW, run_id="w2")
    if strategy in IDEMPOTENT:
        assert_same_multiset(h.raw(spec), exp1.table)
    if strategy in KEYED_NOOP:
        assert res2.snapshot_id is None


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_first_deploy_with_a_merge_on_read_hint_is_a_replace_and_its_rerun_a_redeploy(
    h: Any, strategy: str
) -> None:
    spec = _hinted(spec_for(strategy, delta=True), "merge-on-read")
    res, _ = h.write_and_check(spec, window_rows(), window=WINDOW, run_id="w1")
    assert (res.write_mode, res.first_deploy) == ("replace", True)
    res2, _ = h.write_and_check(spec, window_rows(), window=WINDOW, run_id="w2")
    assert res2.first_deploy is False


def test_merge_on_read_keeps_the_file_and_writes_one_delete_file_with_the_union_of_deletes(
    h: Any,
) -> None:
    spec = _hinted(spec_for("snapshot_replace"), "merge-on-read")
    h.write_and_check(spec, base())
    original = {t.file.file_path for t in h.table(spec).scan().plan_files()}
    h.write_and_check(spec, customers([1, 2], version=3), run_id="a")
    res, _ = h.write_and_check(spec, customers([3, 4], version=3), run_id="b")
    # the first write's 2-row file (ids 1, 2) is folded into this write's new file
    assert res.files_merged_on_read == 1 and res.files_rewritten == 1
    tasks = list(h.table(spec).scan().plan_files())
    assert len(tasks) == 2
    kept = [t for t in tasks if t.file.file_path in original]
    assert len(kept) == 1  # the 40-row file is still there...
    (deletes,) = kept[0].delete_files  # ...with ONE delete file: ids 1..4's positions
    assert deletes.record_count == 4 and deletes.content == DataFileContent.POSITION_DELETES
    every_delete_file = [
        e.data_file
        for m in h.table(spec).current_snapshot().manifests(h.table(spec).io)
        if m.content == ManifestContent.DELETES
        for e in m.fetch_manifest_entry(h.table(spec).io, discard_deleted=True)
    ]
    assert len(every_delete_file) == 1  # the first write's delete file was replaced


def _set(h: Any, spec: DatasetSpec, **props: str) -> None:
    with h.store().load(spec).transaction() as tx:
        tx.set_properties(props)


def test_auto_rewrites_while_the_changed_files_fit_the_copy_on_write_budget(h: Any) -> None:
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, customers(range(20_000)))
    res, _ = h.write_and_check(spec, customers(range(100), version=1), run_id="small")
    assert (res.files_merged_on_read, res.files_rewritten) == (0, 1)  # ~0.3 MB: rewritten
    assert _delete_files(h, spec) == []


def test_auto_keeps_a_large_file_for_a_small_change_and_rewrites_it_past_a_fifth_deleted(
    h: Any,
) -> None:
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, customers(range(20_000)))
    _set(h, spec, **{"pipeline-output.merge.copy-on-write-max-bytes": "0"})  # as if files were big
    res, _ = h.write_and_check(spec, customers(range(100), version=1), run_id="small")
    assert (res.files_merged_on_read, res.files_rewritten) == (1, 0)
    assert len(_delete_files(h, spec)) == 1
    # with 4,100 more deleted rows the file would pass 20%: it is rewritten, its deletes folded
    res, _ = h.write_and_check(spec, customers(range(100, 4_200), version=1), run_id="big")
    assert (res.files_merged_on_read, res.files_rewritten) == (0, 1)
    assert _delete_files(h, spec) == []


def _narrow(ids: range, *, version: int = 0) -> pl.DataFrame:
    """id + a float that compresses like measurements do (~7.5 stored bytes a row)."""
    frame = pl.DataFrame({"id": pl.Series(list(ids), dtype=pl.Int64)})
    noise = (pl.col("id").hash(seed=7) % (1 << 52)).cast(pl.Float64)
    return frame.with_columns(value=noise + version)


def test_auto_keeps_many_mid_size_files_when_an_upsert_changes_a_hundredth_of_each(
    h: Any,
) -> None:
    """Under the budget, rewriting six ~0.43 MB files to change 1 % of each costs more than twice
    the write keeping them (delete files + the changed rows' new versions): auto keeps them."""
    spec = spec_for("snapshot_replace", name="narrow")
    per = 50_000
    for j in range(6):  # six files: one append each
        h.write_and_check(
            spec_for("append_always", name="narrow"), _narrow(range(j * per, (j + 1) * per))
        )
    changed = pl.concat(
        [_narrow(range(0, 6 * per, 100), version=1), _narrow(range(10**6, 10**6 + 50))]
    )
    res, _ = h.write_and_check(spec, changed, run_id="spread")
    assert (res.files_merged_on_read, res.files_rewritten) == (6, 0)
    assert len(_delete_files(h, spec)) == 6


def test_the_hint_wins_over_the_table_property_and_the_property_over_the_cost(h: Any) -> None:
    spec = spec_for("snapshot_replace")
    h.write_and_check(spec, customers(range(20_000)))
    _set(h, spec, **{"write.merge.mode": "copy-on-write"})
    res, _ = h.write_and_check(spec, customers(range(10), version=1), run_id="p")
    assert (res.files_merged_on_read, res.files_rewritten) == (0, 1)  # the property
    forced = _hinted(spec, "merge-on-read")
    res, _ = h.write_and_check(forced, customers(range(10), version=2), run_id="h")
    assert (res.files_merged_on_read, res.files_rewritten) == (1, 0)  # the hint
    _set(h, spec, **{"write.merge.mode": "merge-on-read"})  # under the budget auto rewrites...
    res, _ = h.write_and_check(spec, customers(range(20, 30), version=2), run_id="m")
    assert res.files_merged_on_read == 1  # ...but the table asks for merge-on-read


def test_a_file_whose_every_row_goes_is_dropped_not_kept_with_deletes(h: Any) -> None:
    spec = _hinted(spec_for("sync"), "merge-on-read")
    spec = dataclasses.replace(spec, allow_empty=True)
    h.write_and_check(spec, base())
    res, _ = h.write_and_check(spec, customers([500]), run_id="gone")
    assert res.files_merged_on_read == 0 and res.files_rewritten == 1
    assert _delete_files(h, spec) == []


def test_a_full_replace_removes_the_delete_files_with_their_data_files(h: Any) -> None:
    spec = spec_for("replace")
    _with_delete_files(h, spec)
    h.write_and_check(spec, customers(range(100, 110)), run_id="all")
    assert _delete_files(h, spec) == []
    live = [
        m
        for m in h.table(spec).current_snapshot().manifests(h.table(spec).io)
        if m.content == ManifestContent.DELETES and (m.has_added_files() or m.has_existing_files())
    ]
    assert live == []  # no delete file outlives the rows it deleted


def test_append_new_reinserts_a_key_deleted_by_position(h: Any) -> None:
    spec = spec_for("append_new")
    _with_delete_files(h, spec)  # ids 4 and 5 deleted by position
    res, _ = h.write_and_check(spec, customers([3, 4, 5], version=4), run_id="n")
    assert (res.rows_inserted, res.rows_skipped) == (2, 1)


def test_a_version_1_table_is_copy_on_write_and_refuses_an_explicit_merge_on_read(
    h: Any,
) -> None:
    spec = spec_for("snapshot_replace")
    h.store().tables.ensure_namespace()
    h.catalog.create_table(
        (NS, spec.name),
        schema=customers([0]).to_arrow().schema,
        properties={"format-version": "1"},
    )
    h.store().write(dataclasses.replace(spec, strategy="append_always"), customers(range(40)))
    res = h.store().write(spec, customers([1], version=1))
    assert (res.files_merged_on_read, res.files_rewritten) == (0, 1)
    before = h.snapshot_ids(spec)
    with pytest.raises(UnsupportedWrite, match="format version 1"):
        h.store().write(_hinted(spec, "merge-on-read"), customers([2], version=1))
    assert h.snapshot_ids(spec) == before


def test_every_reader_sees_the_same_rows_of_a_table_with_delete_files(
    h: Any, pg_db_url: str, catalog_warehouse: str
) -> None:
    spec = spec_for("snapshot_replace")
    _with_delete_files(h, spec)
    expected = h.store().read(spec)
    assert expected.height == 38
    uri = to_sqlalchemy_url(pg_db_url, driver="psycopg")
    plain = SqlCatalog("default", uri=uri, warehouse=catalog_warehouse).load_table((NS, spec.name))
    assert_same_multiset(pl.from_arrow(plain.scan().to_arrow()), expected)  # type: ignore[arg-type]
    assert_same_multiset(pl.scan_iceberg(plain).collect(), expected)
    lazy = scan_table(plain).filter(pl.col("id") <= 10)  # projection and filter pushed down
    assert_same_multiset(lazy.collect(), expected.filter(pl.col("id") <= 10))
    assert scan_table(plain).select(pl.len()).collect().item() == expected.height
    # another process, with nothing of ours: pyiceberg's own catalog and scan, and polars'
    script = (
        "import json, sys, polars as pl\n"
        "from pyiceberg.catalog.sql import SqlCatalog\n"
        "t = SqlCatalog('default', uri=sys.argv[1], warehouse=sys.argv[2]).load_table(\n"
        "    (sys.argv[3], sys.argv[4]))\n"
        "a = sorted(pl.from_arrow(t.scan().to_arrow())['id'].to_list())\n"
        "b = sorted(pl.scan_iceberg(t).collect()['id'].to_list())\n"
        "print(json.dumps([a, b]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, uri, catalog_warehouse, NS, spec.name],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    scanned, polars_ids = json.loads(out.stdout.strip().splitlines()[-1])
    assert scanned == polars_ids == sorted(expected["id"].to_list())


def test_parity_holds_between_the_legacy_arm_and_a_table_carrying_delete_files(
    h: Any, pg_db_url: str
) -> None:
    from pipeline_output.services.parity import compare
    from pipeline_output.stores.postgres import PostgresStore

    legacy = PostgresStore(pg_db_url)
    for strategy, data in (("snapshot_replace", base()), ("sync", redeploy_rows())):
        spec = _hinted(spec_for(strategy), "merge-on-read")
        h.store().write(spec, data, run_id=strategy)
        legacy.write(spec, data, run_id=strategy)
    assert _delete_files(h, spec)
    report = compare(spec, legacy.read(spec), h.store().read(spec))
    assert report.passed, report.summary()
    assert report.iceberg_count == report.pg_count == redeploy_rows().height


class _DataAfterDeletesFileIO(PyArrowFileIO):
    """Opens a new data file only once a delete file has been opened (else fails after 10 s):
    proof that a commit's data and delete files are uploaded at the same time."""

    def __init__(self, properties: dict[str, str]) -> None:
        super().__init__(properties)
        self.delete_opened = threading.Event()

    def new_output(self, location: str) -> Any:
        if location.endswith("-deletes.parquet"):
            self.delete_opened.set()
        elif not self.delete_opened.wait(10):
            raise TimeoutError("the data file was written before its commit's delete file began")
        return super().new_output(location)


def test_a_commit_uploads_its_data_files_and_delete_files_at_the_same_time(tmp_path: Any) -> None:
    catalog = SqlCatalog(
        "t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'w'}"
    )
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([pa.field("id", pa.int64())]))
    frame = pl.DataFrame({"id": [1, 2, 3]})
    (target,) = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4()).write(frame)
    io = _DataAfterDeletesFileIO(dict(table.io.properties))
    write_id = uuid.uuid4()
    data = DataFileWriter(table.metadata, io, write_id=write_id)
    deletes = DeleteFileWriter(table.metadata, io, write_id=write_id)
    added, removing = write_files(
        data, [pl.DataFrame({"id": [4]})], deletes, [(target, pl.Series("pos", [0, 2]))]
    )
    assert [f.record_count for f in added] == [1]
    assert [(f.content, f.record_count) for f in removing] == [
        (DataFileContent.POSITION_DELETES, 2)
    ]
    assert io.delete_opened.is_set()


DELETE_FILES_IN_A_FRESH_PROCESS = """
import json, sys, uuid
import polars as pl, pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter, DeleteFileWriter
catalog = SqlCatalog("t", uri=f"sqlite:///{sys.argv[1]}/c.db", warehouse=f"file://{sys.argv[1]}/w")
catalog.create_namespace("ns")
table = catalog.create_table("ns.t", schema=pa.schema([pa.field("id", pa.int64())]))
writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
targets = [f for i in range(3) for f in writer.write(pl.DataFrame({"id": [i, i + 10, i + 20]}))]
before = "pandas" in sys.modules
deletes = DeleteFileWriter(table.metadata, table.io, write_id=uuid.uuid4()).write_many(
    [(f, pl.Series("pos", [2, 0][: i + 1])) for i, f in enumerate(targets[:2])]
)
print(json.dumps({"pandas_before": before, "pandas_after": "pandas" in sys.modules,
                  "paths": [d.file_path for d in deletes],
                  "targets": [f.file_path for f in targets[:2]]}))
"""


def test_writing_delete_files_does_not_import_pandas(tmp_path: Any) -> None:
    """A fresh process's first merge-on-read commit writes its delete files without importing
    pandas (pyarrow's `pa.array` of Python values does: ~0.18 s of the write), and the files read
    back as every reader reads them: one row per removed position, naming its data file, under
    the spec's field ids, required, the path a plain (not large) string — iceberg-rust reads no
    other."""
    out = subprocess.run(
        [sys.executable, "-c", DELETE_FILES_IN_A_FRESH_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["pandas_before"] is False
    assert got["pandas_after"] is False
    for path, target, want in zip(got["paths"], got["targets"], ([2], [0, 2]), strict=True):
        read = pq.read_table(path.removeprefix("file://"))
        assert read.column("file_path").to_pylist() == [target] * len(want)
        assert read.column("pos").to_pylist() == want
        fields = {f.name: f for f in read.schema}
        assert fields["file_path"].metadata == {b"PARQUET:field_id": b"2147483546"}
        assert fields["pos"].metadata == {b"PARQUET:field_id": b"2147483545"}
        assert not fields["file_path"].nullable and not fields["pos"].nullable
        assert (fields["file_path"].type, fields["pos"].type) == (pa.string(), pa.int64())
