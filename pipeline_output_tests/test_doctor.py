"""Orphan data files from a failed write are found by the doctor and removed only with --fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.doctor import find_orphans, remove_orphans
from pipeline_output.locks import AdvisoryLock


def _batches(fail_after: int) -> Iterator[pl.DataFrame]:
    for i in range(5):
        if i == fail_after:
            raise RuntimeError("predict blew up")
        yield pl.DataFrame({"id": list(range(i * 10, i * 10 + 10)), "v": [float(i)] * 10})


def test_failed_streaming_replace_leaves_table_unchanged_and_orphans_are_found_then_fixed(
    catalog: Any, fresh_catalog: Any, pg_db_url: str
) -> None:
    store = IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))
    spec = DatasetSpec(name="scores", primary_key="id", strategy="replace")
    first = store.replace_streaming(spec, _batches(fail_after=99))
    assert first.rows_in == 50
    with pytest.raises(RuntimeError, match="predict blew up"):
        store.replace_streaming(spec, _batches(fail_after=3))
    table = fresh_catalog().load_table(("datasets", "scores"))
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # no partial replace
    assert pl.from_arrow(table.scan().to_arrow()).height == 50

    assert find_orphans(catalog, "datasets", grace_s=3600) == []  # too young: never touched
    orphans = find_orphans(catalog, "datasets", grace_s=0)
    assert len(orphans) == 3  # batches 0..2 of the failed write
    assert all(o.table == "datasets.scores" for o in orphans)
    assert remove_orphans(orphans) == 3
    assert find_orphans(catalog, "datasets", grace_s=0) == []
    again = fresh_catalog().load_table(("datasets", "scores"))
    assert pl.from_arrow(again.scan().to_arrow()).height == 50  # referenced files untouched
