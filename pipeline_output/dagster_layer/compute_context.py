"""Dagster's context as a `@dataset`'s compute sees it, when it takes one (`context`, as a Dagster
asset's function does).

The dataset's asset has more outputs than its rows (its checks' outputs), so Dagster's own
`context.add_output_metadata(...)` without an output name would raise; the compute's context
adds it to the rows' materialisation (`ComputeContext`). A partitioned compute is called once per
key — in a range run too, where Dagster's own `partition_key` raises — and each call's context is
that key's (`KeyContext`): its partition is the key, its metadata goes to that partition's
materialisation. Everything else (`log`, `run`, `instance`, `resources`, ...) is the run's
context's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

# the compute's parameter that takes the context
CONTEXT_PARAMETER = "context"


class ComputeContext:
    """The run's context as a compute sees it."""

    def __init__(self, context: dg.AssetExecutionContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def add_output_metadata(
        self,
        metadata: Mapping[str, Any],
        output_name: str | None = None,
        mapping_key: str | None = None,
    ) -> None:
        """Metadata on the rows' materialisation (Dagster's call, the output defaulting to the
        rows' rather than raising for the checks' outputs); a key's call: that key's only."""
        self._on_rows(dict(metadata), output_name, mapping_key)

    def _on_rows(self, metadata: dict[str, Any], output: str | None, mapping: str | None) -> None:
        rows = self._context.assets_def.get_output_name_for_asset_key(self._context.asset_key)
        self._context.add_output_metadata(metadata, output_name=output or rows, mapping_key=mapping)


class KeyContext(ComputeContext):
    """The run's context as the compute of one of its keys sees it: the partition
    (`partition_key`, `partition_keys`, `partition_key_range`, `partition_time_window`) is that
    key; metadata added goes to that partition's materialisation."""

    def __init__(self, context: dg.AssetExecutionContext, key: str, partitions_def: Any) -> None:
        super().__init__(context)
        self._key, self._partitions_def = key, partitions_def

    def _on_rows(self, metadata: dict[str, Any], output: str | None, mapping: str | None) -> None:
        # this key's materialisation only (a range run's step metadata would be copied onto
        # every partition's)
        self._context.add_asset_metadata(metadata, partition_key=self._key)

    def add_asset_metadata(
        self,
        metadata: Mapping[str, Any],
        asset_key: Any = None,
        partition_key: str | None = None,
    ) -> None:
        self._context.add_asset_metadata(
            dict(metadata), asset_key=asset_key, partition_key=partition_key or self._key
        )

    @property
    def has_partition_key(self) -> bool:
        return True

    @property
    def partition_key(self) -> str:
        if isinstance(self._partitions_def, dg.MultiPartitionsDefinition):  # as Dagster gives it
            multi: str = self._partitions_def.get_partition_key_from_str(self._key)
            return multi
        return self._key

    @property
    def partition_keys(self) -> list[str]:
        return [self._key]

    @property
    def partition_key_range(self) -> dg.PartitionKeyRange:
        return dg.PartitionKeyRange(self._key, self._key)

    @property
    def has_partition_key_range(self) -> bool:
        return True

    @property
    def partition_time_window(self) -> dg.TimeWindow:
        if not isinstance(self._partitions_def, dg.TimeWindowPartitionsDefinition):
            dagsters: dg.TimeWindow = self._context.partition_time_window  # Dagster's error
            return dagsters
        window: dg.TimeWindow = self._partitions_def.time_window_for_partition_key(self._key)
        return window
