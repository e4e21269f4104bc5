"""Publish: the one place that orders a dataset write across arms.

Owns mode resolution (run override -> persisted flip -> dataset default -> project default) and the
order of a write: for each arm the mode selects, lock -> probe -> plan -> write (inside the arm's
store), then the ledger record. For `dual` the Postgres transaction is opened first, kept open across
the Iceberg commit and committed last, so a failure of either arm before that point leaves both
unchanged. Pure core: no Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import polars as pl

from pipeline_output import lazy_reads
from pipeline_output.errors import InvalidSpec, PipelineOutputError, UnsupportedWrite
from pipeline_output.plan import WritePlan
from pipeline_output.result import WriteResult
from pipeline_output.spec import MODES, DatasetSpec, Mode
from pipeline_output.stores.iceberg import IcebergStore, PreparedWrite
from pipeline_output.windows import Window

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

ModeSource = Literal["run config", "flip", "dataset default", "project default"]
Arm = Literal["pg", "iceberg"]


class FlipSource(Protocol):
    """Where persisted flips come from (the ledger)."""

    def current_flip(self, dataset: str) -> str | None: ...


@dataclass(frozen=True)
class ResolvedMode:
    """The mode a run uses, and which rule chose it."""

    mode: Mode
    source: ModeSource

    @property
    def arms(self) -> tuple[Arm, ...]:
        """The arms this mode writes, in commit order (Iceberg before the Postgres commit)."""
        if self.mode == "dual":
            return ("iceberg", "pg")
        return (self.mode,)


def resolve_mode(
    spec: DatasetSpec,
    *,
    override: str | None,
    flips: FlipSource | None,
    project_default: Mode,
) -> ResolvedMode:
    """Asset config first, then the persisted flip, the dataset's default, the project default."""
    if override:
        if override not in MODES:
            raise InvalidSpec(
                f"dataset {spec.name!r}: unknown mode {override!r}; valid modes: {', '.join(MODES)}"
            )
        return ResolvedMode(override, "run config")  # type: ignore[arg-type]
    if flips is not None:
        flipped = flips.current_flip(spec.name)
        if flipped:
            return ResolvedMode(flipped, "flip")  # type: ignore[arg-type]
    if spec.mode:
        return ResolvedMode(spec.mode, "dataset default")
    return ResolvedMode(project_default, "project default")


@dataclass
class PublishResult:
    """What one publish did: the mode, and one `WriteResult` per arm written."""

    dataset: str
    mode: ResolvedMode
    results: dict[str, WriteResult] = field(default_factory=dict)
    plans: dict[str, WritePlan] = field(default_factory=dict)
    window: Window | None = None

    @property
    def primary(self) -> WriteResult:
        """The authoritative arm's result (Iceberg when it was written)."""
        return self.results.get("iceberg") or next(iter(self.results.values()))


class Publisher:
    """Writes a dataset to the arm(s) its mode selects, and reads it from the authoritative arm."""

    def __init__(
        self,
        *,
        iceberg: IcebergStore,
        postgres: Any | None = None,
        ledger: Any | None = None,
        project_default: Mode = "pg",
        dual_reads_from: Arm = "pg",
    ) -> None:
        self.iceberg = iceberg
        self.postgres = postgres
        self.ledger = ledger
        self.project_default = project_default
        self.dual_reads_from = dual_reads_from

    def resolve(self, spec: DatasetSpec, *, override: str | None = None) -> ResolvedMode:
        """The mode for this run of `spec`."""
        return resolve_mode(
            spec, override=override, flips=self.ledger, project_default=self.project_default
        )

    def _require_arms(self, spec: DatasetSpec, mode: ResolvedMode) -> None:
        if "pg" in mode.arms and self.postgres is None:
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: mode {mode.mode!r} (from {mode.source}) needs the legacy "
                "Postgres arm, which is not available in this deployment; nothing was written"
            )

    def plan(
        self, spec: DatasetSpec, *, mode: ResolvedMode, window: Window | None = None
    ) -> dict[str, WritePlan]:
        """The write plan per arm (a dry run: probes, writes nothing)."""
        self._require_arms(spec, mode)
        plans: dict[str, WritePlan] = {}
        for arm in mode.arms:
            store: Any = self.iceberg if arm == "iceberg" else self.postgres
            plans[arm] = store.plan(spec, window=window)
        return plans

    def prepare(
        self, spec: DatasetSpec, data: Any, *, mode: ResolvedMode, window: Window | None = None
    ) -> PreparedWrite | None:
        """The Iceberg arm's `prepare` (data files ahead of any lock) when `mode` writes Iceberg."""
        if mode.mode == "pg":
            return None
        if isinstance(data, pl.LazyFrame):
            data = data.collect()
        return self.iceberg.prepare(spec, data, window=window)

    def publish(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        mode: ResolvedMode,
        window: Window | None = None,
        run_id: str | None = None,
        summary: dict[str, str] | None = None,
        prepared: PreparedWrite | None = None,
    ) -> PublishResult:
        """Write `data` to every arm of `mode`; Postgres (when dual) commits last.

        `summary` adds `pipeline-output.*` properties to the Iceberg snapshot (window markers);
        `prepared` (from `prepare`) carries the Iceberg arm's checked frame and pre-written files.
        """
        self._require_arms(spec, mode)
        out = PublishResult(dataset=spec.name, mode=mode, window=window)
        if isinstance(data, pl.LazyFrame):
            data = data.collect()
        if mode.mode == "iceberg":
            out.results["iceberg"] = self._write_iceberg(
                spec, data, window=window, run_id=run_id, summary=summary, prepared=prepared
            )
            return out
        if mode.mode == "pg":
            # the pg arm records its own deploy inside its transaction
            out.results["pg"] = self.postgres.write(spec, data, window=window, run_id=run_id)  # type: ignore[union-attr]
            return out
        return self._publish_dual(
            spec, data, out=out, window=window, run_id=run_id, summary=summary, prepared=prepared
        )

    def _publish_dual(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        out: PublishResult,
        window: Window | None,
        run_id: str | None,
        summary: dict[str, str] | None,
        prepared: PreparedWrite | None,
    ) -> PublishResult:
        assert self.postgres is not None
        pending = self.postgres.begin_write(spec, data, window=window, run_id=run_id)
        try:
            out.results["iceberg"] = self._write_iceberg(
                spec, data, window=window, run_id=run_id, summary=summary, prepared=prepared
            )
        except BaseException:
            pending.rollback()
            raise
        try:
            pending.commit()
        except Exception as exc:
            if self.ledger is not None:
                self.ledger.record_divergence(
                    spec.name,
                    run_id=run_id,
                    error=f"Iceberg committed snapshot {out.results['iceberg'].snapshot_id} but "
                    f"the Postgres commit failed: {type(exc).__name__}: {exc}",
                    window=window,
                    snapshot_id=out.results["iceberg"].snapshot_id,
                    strategy=spec.strategy,
                )
            raise PipelineOutputError(
                f"dataset {spec.name!r}: dual write diverged — Iceberg committed, the Postgres "
                f"commit failed ({type(exc).__name__}); recorded in the ledger"
            ) from exc
        out.results["pg"] = pending.result
        return out

    def publish_stream(
        self,
        spec: DatasetSpec,
        frames: Iterable[pl.DataFrame],
        *,
        mode: ResolvedMode,
        run_id: str | None = None,
        summary: dict[str, str] | None = None,
        finalize_summary: Callable[[], dict[str, str]] | None = None,
    ) -> PublishResult:
        """A whole-table `replace` produced batch by batch (the model node), through the same
        publish step as `publish`: in `iceberg` mode the batches stream to data files and commit
        as one snapshot (memory bounded by a batch); in `pg`/`dual` they are gathered and written
        by `publish`. Either way the deploy is recorded for every arm written.
        """
        if spec.strategy != "replace":
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: a streamed publish is a whole-table replace, but the "
                f"dataset's strategy is {spec.strategy!r}; nothing was written"
            )
        self._require_arms(spec, mode)
        if mode.mode == "iceberg":
            out = PublishResult(dataset=spec.name, mode=mode)
            result = self.iceberg.replace_streaming(
                spec, frames, run_id=run_id, summary=summary, finalize_summary=finalize_summary
            )
            self._record_iceberg(spec, result, window=None, run_id=run_id)
            out.results["iceberg"] = result
            return out
        frame = pl.concat(list(frames))
        full = {**(summary or {}), **(finalize_summary() if finalize_summary else {})}
        return self.publish(spec, frame, mode=mode, run_id=run_id, summary=full)

    def _write_iceberg(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        window: Window | None,
        run_id: str | None,
        summary: dict[str, str] | None,
        prepared: PreparedWrite | None,
    ) -> WriteResult:
        """The Iceberg arm's write, recorded in the ledger (when there is one) unless a no-op."""
        result = self.iceberg.write(
            spec, data, window=window, run_id=run_id, summary=summary, prepared=prepared
        )
        self._record_iceberg(spec, result, window=window, run_id=run_id)
        return result

    def _record_iceberg(
        self, spec: DatasetSpec, result: WriteResult, *, window: Window | None, run_id: str | None
    ) -> None:
        """The Iceberg arm's deploy record (the legacy arm records its own inside its transaction)."""
        if self.ledger is not None and not result.noop:
            self.ledger.record_deploy(
                spec.name,
                "iceberg",
                status="succeeded",
                run_id=run_id,
                strategy=spec.strategy,
                window=window,
                result=result,
                snapshot_id=result.snapshot_id,
            )

    def read(
        self,
        spec: DatasetSpec,
        *,
        mode: ResolvedMode,
        window: Window | None = None,
        columns: Sequence[str] | None = None,
    ) -> pl.DataFrame:
        """Read from the authoritative arm: Iceberg once flipped; in dual the configured arm."""
        if self._reads_legacy(spec, mode):
            assert self.postgres is not None
            return self.postgres.read(spec, window=window, columns=columns)  # type: ignore[no-any-return]
        return self.iceberg.read(spec, window=window, columns=columns)

    def scan(
        self,
        spec: DatasetSpec,
        *,
        mode: ResolvedMode,
        window: Window | None = None,
        watermark: str | None = None,
    ) -> pl.LazyFrame:
        """A lazy read of the authoritative arm (the arm `read` uses), see `lazy_reads`.

        Only the columns the query selects are read, and its filters (`window` among them:
        `low < watermark <= high`, `watermark` defaulting to the spec's own) are pushed down: as a
        pyiceberg row filter on a scan pinned to the table's current snapshot, or as SQL
        parameters of the legacy arm's SELECT.
        """
        if self._reads_legacy(spec, mode):
            assert self.postgres is not None
            return lazy_reads.scan_postgres_dataset(
                self.postgres, spec, window=window, watermark=watermark
            )
        return lazy_reads.scan_iceberg_dataset(
            self.iceberg, spec, window=window, watermark=watermark
        )

    def _reads_legacy(self, spec: DatasetSpec, mode: ResolvedMode) -> bool:
        """Whether reads of `spec` come from the legacy arm (`pg`, or `dual` reading from `pg`);
        refuses when that arm is not available."""
        arm = mode.mode if mode.mode != "dual" else self.dual_reads_from
        if arm == "pg" and self.postgres is None:
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: its authoritative arm is 'pg' (mode {mode.mode!r} from "
                f"{mode.source}) but the legacy arm is not available"
            )
        return arm == "pg"
