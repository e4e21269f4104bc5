"""Orphan data files (a writer killed before its commit) are found by the doctor and removed only with
--fix; a write that fails in-process removes its own files."""

from __future__ import annotations

import uuid
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.services.doctor import find_orphans, remove_orphans
from pipeline_output.stores.iceberg.snapshot.files import DataFileWriter
from pipeline_output_tests.iceberg_harness import scored_batches


def test_failed_streaming_replace_leaves_table_unchanged_and_deletes_its_files(
    catalog: Any, fresh_catalog: Any, pg_db_url: str
) -> None:
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="scores", primary_key="id", strategy="replace")
    first = store.replace_streaming(spec, scored_batches(fail_after=99))
    assert first.rows_in == 50
    with pytest.raises(RuntimeError, match="predict blew up"):
        store.replace_streaming(spec, scored_batches(fail_after=3))
    table = fresh_catalog().load_table(("datasets", "scores"))
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # no partial replace
    assert pl.from_arrow(table.scan().to_arrow()).height == 50
    # batches 0..2 had been written to files before batch 3 raised: the write removed them
    assert find_orphans(catalog, "datasets", grace_s=0) == []


def test_files_of_a_writer_killed_before_its_commit_are_found_then_fixed(
    catalog: Any, fresh_catalog: Any, pg_db_url: str
) -> None:
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="scores", primary_key="id", strategy="replace")
    store.replace_streaming(spec, scored_batches(fail_after=99))
    table = fresh_catalog().load_table(("datasets", "scores"))
    # what a writer killed between writing its data files and its commit leaves behind
    writer = DataFileWriter(table.metadata, table.io, write_id=uuid.uuid4())
    for i in range(3):
        writer.write(pl.DataFrame({"id": [1000 + i], "v": [0.5]}))
    assert len(writer.written) == 3

    assert find_orphans(catalog, "datasets", grace_s=3600) == []  # too young: never touched
    orphans = find_orphans(catalog, "datasets", grace_s=0)
    written = sorted(p.removeprefix("file://") for p in writer.written)
    assert sorted(o.path.removeprefix("file://") for o in orphans) == written
    assert all(o.table == "datasets.scores" for o in orphans)
    assert remove_orphans(orphans, store=store) == 3
    assert find_orphans(catalog, "datasets", grace_s=0) == []
    again = fresh_catalog().load_table(("datasets", "scores"))
    assert pl.from_arrow(again.scan().to_arrow()).height == 50  # referenced files untouched
