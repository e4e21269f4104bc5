"""The windows a delta dataset has yet to apply, as `pipeline-output plan` shows them.

The ledger's planned and failed windows, then the windows a sensor tick would plan now from the
source's high-water mark (`window_sensor.windows_now`) — shown, not recorded — each with the
number of source rows it holds (counted in the source; a delta over another dataset has no
source to count in).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.dagster_layer.delta_sources import delta_source
from pipeline_output.dagster_layer.window_sensor import windows_now
from pipeline_output.dagster_layer.window_upstreams import source_upstream
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.sources import SourceSpec

NOT_PLANNED = "not yet planned"


@dataclass(frozen=True)
class PendingWindow:
    """One window still to apply."""

    window: Window
    state: str  # planned | failed | not yet planned
    seq: int | None  # its ledger number (None: not planned yet)
    rows: int | None = None  # source rows in it (None: not counted)


@dataclass(frozen=True)
class Pending:
    """A delta dataset's pending windows; `rows`: the source rows in all of them."""

    windows: list[PendingWindow]
    rows: int | None

    def describe(self) -> str:
        if not self.windows:
            return "no pending window: nothing to write"
        states: dict[str, int] = {}
        for w in self.windows:
            states[w.state] = states.get(w.state, 0) + 1
        what = ", ".join(f"{n} {state}" for state, n in states.items())
        rows = "" if self.rows is None else f", {self.rows} source row(s)"
        noun = "window" if len(self.windows) == 1 else "windows"
        return f"{len(self.windows)} pending {noun}{rows} ({what})"


def pending_windows(
    spec: DatasetSpec, source: SourceSpec | None, *, runtime: Runtime, count: int = 200
) -> Pending:
    """`spec`'s pending windows, each counted in the source (up to `count` windows: a longer
    backlog is listed uncounted)."""
    from pipeline_output.dagster_layer.source_assets import window_count

    ledger = runtime.windows
    out = [PendingWindow(w.window, w.state, w.seq) for w in ledger.pending(spec.name)]
    if source is None:
        return Pending(out, None)
    upstream = source_upstream(spec, source, runtime=lambda: runtime)
    new = windows_now(spec, upstream, last=ledger.last(spec.name), seen=upstream.read())
    out += [PendingWindow(w, NOT_PLANNED, None) for w in new]
    if len(out) > count:
        return Pending(out, None)
    windowed = delta_source(spec, source)
    counted = [replace(p, rows=window_count(windowed, p.window, runtime=runtime)) for p in out]
    return Pending(counted, sum(p.rows or 0 for p in counted))
