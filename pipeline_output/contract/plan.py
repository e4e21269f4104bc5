"""Planning a write: (spec, target state, window or partition) -> write plan. Pure; no I/O, no Dagster.

The decision table is the strategy registry (`spec.STRATEGIES`): for each strategy and situation
(first deploy, re-deploy, a delta window, a Dagster partition) the write mode and the scope of its
deletes; docs/concepts.md shows it as a table, checked against the registry. Every strategy's first
deploy is a replace; a delta window's deletes are limited to the window.

A Dagster partition (`contract/slices.py`) is the fourth situation: its write makes the target's
slice exactly the compute's rows — `snapshot_replace` and `sync` by key (update matched, insert
new, delete the slice's rows whose key is absent: every change counted), `replace` by dropping
the slice's rows (whole files on Iceberg when its partition spec matches) — while `append_always`
and `append_new` append into the slice. Rows outside the slice are refused by every strategy.

A dry run before the run's partitions are known (`pipeline-output plan`) plans the partition
situation with `partitioned_by=` (the partition columns) instead of a slice, and describes the
effect on "each partition's slice"; a partitioned dataset's first deploy is described as the
target's first write of the partition's rows (never "every target row").

A situation a strategy has no decision for raises `UnsupportedWrite` before any I/O.

`WriteResult`: what one write did, in numbers. Shared by every arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from pipeline_output.contract.slices import PartitionSlice
from pipeline_output.contract.spec import (
    STRATEGIES,
    WRITE_MODES,
    Arm,
    DatasetSpec,
    DeleteScope,
    Situation,
    Strategy,
    WriteMode,
)
from pipeline_output.contract.windows import Window
from pipeline_output.errors import UnsupportedWrite


@dataclass(frozen=True)
class TargetState:
    """What the freshness oracle found: does the target exist, and has it a committed write?"""

    exists: bool
    has_snapshot: bool
    snapshot_id: int | None = None
    total_rows: int | None = None

    @property
    def first_deploy(self) -> bool:
        """First deploy iff the target has no committed write yet."""
        return not (self.exists and self.has_snapshot)


@dataclass(frozen=True)
class WritePlan:
    """The primitive to execute and why."""

    dataset: str
    strategy: Strategy
    write_mode: WriteMode
    first_deploy: bool
    window: Window | None
    delete_scope: DeleteScope
    partition: PartitionSlice | None = None  # the Dagster partition written (None: none)
    # a Dagster-partitioned dataset planned before its run's partitions are known: the
    # partition columns (a dry run only; `partition` is None then)
    partitioned_by: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        """Why this write mode: first deploy, re-deploy, the window or the partition."""
        if self.first_deploy:
            return "first deploy"
        if self.window is not None:
            return f"window {self.window}"
        if self.partition is not None:
            return f"partition {self.partition.key}"
        if self.partitioned_by:
            return "per partition"
        return "re-deploy"

    def describe(self) -> str:
        """The expected effect, in one sentence (used by dry runs)."""
        mode = WRITE_MODES.get(self.write_mode)
        if mode is None:  # no longer registered: an arm refuses it (`Capabilities.check_plan`)
            return f"{self.write_mode} ({self.reason}): an unknown write mode"
        effect = mode.effect
        scope = self._slice()
        if self.window is not None and not self.first_deploy and mode.window_effect:
            effect = mode.window_effect.format(self.window)
        elif scope is not None and self.first_deploy:
            effect = f"the target's first write: the compute's rows of {scope}"
        elif scope is not None:
            effect = mode.slice_effect.format(scope)
        return f"{self.write_mode} ({self.reason}): {effect}"

    def _slice(self) -> str | None:
        """The rows a Dagster-partitioned write is about, in words (None: not partitioned)."""
        if self.partition is not None:
            return str(self.partition)
        if not self.partitioned_by:
            return None
        columns = " and ".join(self.partitioned_by)
        verb = "lies" if len(self.partitioned_by) == 1 else "lie"
        return f"each partition's slice (the rows whose {columns} {verb} in that partition)"


def plan_write(
    spec: DatasetSpec,
    target: TargetState,
    window: Window | None = None,
    *,
    partition: PartitionSlice | None = None,
    partitioned_by: Sequence[str] = (),
) -> WritePlan:
    """Decide the write mode for `spec` given the target's state and an optional delta window
    or Dagster partition slice (never both). `partitioned_by`: a dry run of a Dagster-partitioned
    dataset whose partitions are not known yet (its partition columns): planned as a partition."""
    if (partition is not None or partitioned_by) and (window is not None or spec.delta is not None):
        raise UnsupportedWrite(
            f"dataset {spec.name!r}: a delta dataset is written by window, not by Dagster "
            f"partition ({partition or ', '.join(partitioned_by)}); nothing was written"
        )
    if window is not None and spec.delta is None:
        raise UnsupportedWrite(
            f"dataset {spec.name!r}: a window {window} was given but the dataset has no Delta "
            "settings (no watermark column to scope it)"
        )
    situation: Situation
    if target.first_deploy:
        situation = "first_deploy"
    elif window is not None:
        situation = "window"
    elif partition is not None or partitioned_by:
        situation = "partition"
    else:
        situation = "re_deploy"
    strategy = STRATEGIES.get(spec.strategy)
    decision = strategy.decide(situation) if strategy is not None else None
    if decision is None:
        raise UnsupportedWrite(
            f"dataset {spec.name!r}: strategy {spec.strategy!r} has no implemented write for "
            f"{situation.replace('_', ' ')}; nothing was written"
        )
    return WritePlan(
        dataset=spec.name,
        strategy=spec.strategy,
        write_mode=decision.write_mode,
        first_deploy=target.first_deploy,
        window=window,
        delete_scope=decision.delete_scope,
        partition=partition,
        partitioned_by=() if partition is not None else tuple(partitioned_by),
    )


@dataclass
class RowCounts:
    """The row counters a write collects while it runs (they become `WriteResult.rows_*`)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    preserved: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class WriteResult:
    """The outcome of one write (one arm).

    `rows_unchanged` are matched rows identical to the target's; `rows_preserved` are target rows the
    compute did not mention and that were kept; `rows_skipped` are append_new key collisions.
    `snapshot_id` is None for a no-op (nothing changed, nothing committed). `lock_wait_s` is how
    long the write waited for its table's writer lock, `lock_held_s` how long it held it (the
    serialized part of the write). `plan` is the plan the write executed, decided under the
    table's lock (the one a dry run reports may be older). `merge_path` (Iceberg upsert, sync,
    append_new) names the merge that compared the rows and why, e.g. `key_scan (1 candidate
    file(s), ...)` or `frame (fallback: column 'x' was renamed ...)`; empty when none did.
    """

    dataset: str
    write_mode: WriteMode
    first_deploy: bool
    rows_in: int
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    rows_unchanged: int = 0
    rows_preserved: int = 0
    rows_skipped: int = 0
    rows_total_after: int = 0
    snapshot_id: int | None = None
    files_rewritten: int = 0
    files_added: int = 0
    files_merged_on_read: int = 0  # data files kept, with a positional delete file (Iceberg)
    duration_s: float = 0.0
    lock_wait_s: float = 0.0
    lock_held_s: float = 0.0
    table: str = ""
    arm: Arm = "iceberg"
    plan: WritePlan | None = None
    merge_path: str = ""  # Iceberg: `key_scan.choose_merge_path`'s choice, as text

    @classmethod
    def of(
        cls,
        plan: WritePlan,
        counts: RowCounts,
        *,
        rows_in: int,
        total_before: int,
        arm: Arm,
        **extra: Any,
    ) -> WriteResult:
        """The result of executing `plan`: its mode and situation, the counters, the new total."""
        return cls(
            dataset=plan.dataset,
            write_mode=plan.write_mode,
            first_deploy=plan.first_deploy,
            rows_in=rows_in,
            **{f"rows_{f.name}": getattr(counts, f.name) for f in fields(RowCounts)},
            rows_total_after=total_before + counts.inserted - counts.deleted,
            arm=arm,
            plan=plan,
            **extra,
        )

    @classmethod
    def inserts(cls, plan: WritePlan, rows: int, *, arm: Arm, **extra: Any) -> WriteResult:
        """The result of writing `rows` into a table that had none (a first deploy): all inserts."""
        return cls.of(
            plan, RowCounts(inserted=rows), rows_in=rows, total_before=0, arm=arm, **extra
        )

    @property
    def noop(self) -> bool:
        """True when nothing was committed."""
        return self.snapshot_id is None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for metadata and JSON); the plan as its one-sentence description."""
        out = asdict(self)
        out["plan"] = self.plan.describe() if self.plan is not None else None
        return out
