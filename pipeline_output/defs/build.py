"""`build_definitions`: a user's whole `definitions.py` in a few lines.

Wires the IO manager, the datasets and sources, one job over every dataset, and whatever sensors,
schedules, checks and extra resources are passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from pipeline_output.defs.io_manager import DatasetIOManager
from pipeline_output.defs.keys import ALL_DATASETS_JOB, IO_MANAGER_KEY


def build_definitions(
    *,
    datasets: Sequence[dg.AssetsDefinition] = (),
    sources: Sequence[Any] = (),
    assets: Sequence[Any] = (),
    sensors: Sequence[dg.SensorDefinition] = (),
    schedules: Sequence[Any] = (),
    asset_checks: Sequence[dg.AssetChecksDefinition] = (),
    jobs: Sequence[Any] = (),
    resources: Mapping[str, Any] | None = None,
    executor: Any = None,
) -> dg.Definitions:
    """Definitions for pipeline-output datasets and their sources."""
    all_resources: dict[str, Any] = {IO_MANAGER_KEY: DatasetIOManager()}
    all_resources.update(resources or {})
    dataset_keys = [key for d in datasets for key in d.keys]
    all_jobs = list(jobs)
    if dataset_keys:
        all_jobs.append(
            dg.define_asset_job(ALL_DATASETS_JOB, selection=dg.AssetSelection.assets(*dataset_keys))
        )
    return dg.Definitions(
        assets=[*sources, *datasets, *assets],
        asset_checks=list(asset_checks),
        sensors=list(sensors),
        schedules=list(schedules),
        jobs=all_jobs,
        resources=all_resources,
        executor=executor,
    )
