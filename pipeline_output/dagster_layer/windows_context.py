"""Windows from a Dagster context: partition keys (sorted) decoded into `Window`s."""

from __future__ import annotations

from typing import Any

import dagster as dg

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window


def windows_of(context: Any, spec: DatasetSpec) -> list[Window]:
    """The windows this step covers, in order; empty for an unpartitioned (non-delta) dataset.

    Uses `asset_partition_keys` — a single-run backfill of a range has several — sorted, because
    Dagster does not promise an order.
    """
    if spec.delta is None:
        return []
    if isinstance(context, (dg.OutputContext, dg.InputContext)):
        if not context.has_asset_partitions:
            return []
        keys = list(context.asset_partition_keys)
    else:
        if not (context.has_partition_key or context.has_partition_key_range):
            return []
        keys = list(context.partition_keys)
    return [Window.from_key(k) for k in sorted(keys)]
