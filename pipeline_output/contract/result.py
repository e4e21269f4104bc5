"""`WriteResult`: what one write did, in numbers. Shared by every arm."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from pipeline_output.contract.plan import WritePlan
from pipeline_output.contract.spec import Arm, WriteMode


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
    table's lock (the one a dry run reports may be older).
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

    @property
    def noop(self) -> bool:
        """True when nothing was committed."""
        return self.snapshot_id is None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for metadata and JSON); the plan as its one-sentence description."""
        out = asdict(self)
        out["plan"] = self.plan.describe() if self.plan is not None else None
        return out
