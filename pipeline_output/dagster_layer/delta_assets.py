"""Delta datasets in Dagster: window partitions, windowed outputs, windowed source readers.

One `DynamicPartitionsDefinition` per delta dataset (`<dataset>__windows`), keys `low..high` from
`Window.to_key`; a run covers one window or a range of them (applied in window order). The sensor
that plans windows and requests their runs is `window_sensor.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg
import polars as pl

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.errors import (
    EmptyWindowRead,
    MissingKeyColumn,
    RowsOutsideWindow,
    UnsupportedWrite,
)
from pipeline_output.services.reads import projected_source

DEFAULT_SENSOR_INTERVAL_S = 30


def partitions_name(dataset: str) -> str:
    """The dynamic partitions definition name of a delta dataset."""
    return f"{dataset}__windows"


def window_partitions(spec: DatasetSpec) -> dg.DynamicPartitionsDefinition:
    """The partitions definition of a delta dataset."""
    return dg.DynamicPartitionsDefinition(name=partitions_name(spec.name))


@dataclass(frozen=True)
class WindowedOutput:
    """A delta dataset's output: per window (in order) a zero-argument compute, applied one by one."""

    items: tuple[tuple[Window, Any, Window], ...]  # (window, compute thunk, write window)
    restate: bool = False


def windowed_frame(spec: DatasetSpec, frame: pl.DataFrame, windows: list[Window]) -> WindowedOutput:
    """A delta dataset's output computed outside `@dataset` (a plain frame for the run's window
    partitions), as a `WindowedOutput`: each window's rows applied exactly once through the ledger
    like any other. Refused before any I/O when the run has no window partition (a whole-table
    write would bypass the ledger), or when a range's rows cannot be split by window."""
    assert spec.delta is not None
    if not windows:
        raise UnsupportedWrite(
            f"dataset {spec.name!r} is a delta dataset: its output is written per window "
            f"partition ({partitions_name(spec.name)}, planned by its sensor) through the window "
            "ledger; this run has no partition, so nothing was written"
        )
    if len(windows) == 1:
        parts = [frame]
    else:
        watermark = spec.delta.watermark
        if watermark not in frame.columns:
            raise MissingKeyColumn(
                f"dataset {spec.name!r}: the output of {len(windows)} windows has no watermark "
                f"column {watermark!r} to split it by window; nothing was written"
            )
        dtype = frame.schema[watermark]
        parts = [frame.filter(w.contains(watermark, dtype).fill_null(False)) for w in windows]
        outside = frame.height - sum(part.height for part in parts)
        if outside:
            raise RowsOutsideWindow(
                f"dataset {spec.name!r}: {outside} row(s) have {watermark} outside the windows "
                f"{windows[0]} .. {windows[-1]} of this run; nothing was written"
            )
    items = tuple((w, (lambda part=part: part), w) for w, part in zip(windows, parts, strict=True))
    return WindowedOutput(items)


class WindowReader:
    """What a delta dataset's compute receives for its delta source: read it window by window.

    It counts the rows each window's read returns (before the compute's own filters) so that a
    window whose read came back empty while the source holds rows in its range fails instead of
    being recorded as applied (`check_read`).
    """

    def __init__(
        self,
        name: str,
        scan: Callable[[Window | None], pl.LazyFrame],
        *,
        count: Callable[[Window], int] | None = None,
    ) -> None:
        self.name = name
        self._scan = scan
        self._count = count
        self._rows_read: dict[Window, int] = {}

    def scan(self, window: Window | None) -> pl.LazyFrame:
        """The source rows with `low < watermark <= high` (projection pushed down to the source)."""
        inner = self._scan(window)
        if window is None:
            return inner

        def read(columns: list[str]) -> pl.DataFrame:
            frame = inner.select(columns).collect()
            self._rows_read[window] = self._rows_read.get(window, 0) + frame.height
            return frame

        return projected_source(read, schema=inner.collect_schema(), name=f"window:{self.name}")

    def rows_read(self, window: Window) -> int | None:
        """Rows the reads of `window` returned so far (None: the compute never read it)."""
        return self._rows_read.get(window)

    def check_read(self, window: Window, *, dataset: str) -> None:
        """Raise `EmptyWindowRead` when `window` was read, returned no row, and the source holds
        rows in that range (counted by a separate query)."""
        if self._count is None or self.rows_read(window) != 0:
            return
        held = self._count(window)
        if held:
            raise EmptyWindowRead(
                f"dataset {dataset!r}: the read of window {window} from {self.name!r} returned 0 "
                f"rows but the source holds {held} row(s) in that range; nothing was written and "
                "the window stays unapplied"
            )
