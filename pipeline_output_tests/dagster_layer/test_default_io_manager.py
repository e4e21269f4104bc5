"""`build_definitions` binds Dagster's default `io_manager` built on first use (issue 44): a
dataset's run (whose check outputs require an `io_manager` but store nothing through it) never
builds the filesystem IO manager, while a plain asset's output still goes through it — pickled
under the instance's storage directory and read back by its downstream, as Dagster's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest
from dagster._core.storage.fs_io_manager import PickledObjectFilesystemIOManager

from pipeline_output import build_definitions, dataset


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every filesystem IO manager Dagster builds during the test."""
    made: list[Any] = []
    original = PickledObjectFilesystemIOManager.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(PickledObjectFilesystemIOManager, "__init__", counting)
    return made


def test_a_dataset_run_does_not_build_the_filesystem_io_manager(env, instance, built):
    @dataset(primary_key="id", mode="iceberg")
    def lean() -> pl.DataFrame:
        return pl.DataFrame({"id": [1, 2], "v": ["a", "b"]})

    defs = build_definitions(datasets=[lean], with_maintenance=False)
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("lean")]).success
    assert built == []


def test_a_plain_asset_still_goes_through_dagsters_filesystem_io_manager(env, tmp_path, built):
    @dg.asset
    def number() -> int:
        return 41

    @dg.asset
    def next_number(number: int) -> int:
        return number + 1

    defs = build_definitions(assets=[number, next_number], with_maintenance=False)
    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path)) as inst:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=inst)
        assert result.success
        assert result.output_for_node("next_number") == 42
        storage = Path(inst.storage_directory())
    assert (storage / "number").is_file() and (storage / "next_number").is_file()
    assert built  # Dagster's own, built when the first output was stored
