"""Publish: the one place that orders a dataset write across arms.

Owns mode resolution (run override -> persisted flip -> the mode declared on the dataset
(`declared`) -> project default) and the order of a write (see `Publisher`): for each arm the mode selects, convert and check once -> lock ->
probe -> plan -> write (inside the arm's store), then the ledger record. For `dual` the Postgres transaction is opened first, kept open across
the Iceberg commit and committed last, so a failure of either arm before that point leaves both
unchanged. Pure core: no Dagster.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, Unpack

import polars as pl

from pipeline_output.contract.checked_input import CheckedInput, checked_input
from pipeline_output.contract.plan import WritePlan, WriteResult
from pipeline_output.contract.slices import PartitionSlice, check_in_partition
from pipeline_output.contract.spec import MODES, Arm, DatasetSpec, Mode
from pipeline_output.contract.store_protocol import (
    ReadOptions,
    Store,
    WindowRead,
    WriteOptions,
    WriteScope,
)
from pipeline_output.contract.windows import Window
from pipeline_output.errors import (
    InvalidArgument,
    InvalidSpec,
    PipelineOutputError,
    UnsupportedWrite,
)
from pipeline_output.ledger.control_plane import AuditRecord, Ledger
from pipeline_output.services import reads as lazy_reads
from pipeline_output.stores.iceberg import IcebergStore, PreparedWrite
from pipeline_output.stores.iceberg.write import range_write
from pipeline_output.stores.postgres import PostgresStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

# "declared": `mode=` on `@dataset` / `model_node` / `DatasetSpec`; "project default":
# PIPELINE_OUTPUT_DEFAULT_MODE (default `pg`)
ModeSource = Literal["run config", "flip", "declared", "project default"]


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
        return ResolvedMode(spec.mode, "declared")
    return ResolvedMode(project_default, "project default")


@dataclass
class PublishResult:
    """What one publish did: the mode, and one `WriteResult` per arm written (each carrying the
    plan it executed, decided under that arm's lock)."""

    dataset: str
    mode: ResolvedMode
    results: dict[str, WriteResult] = field(default_factory=dict)
    window: Window | None = None
    audit: AuditRecord | None = None  # an audited write: staged on this audit's branch

    @property
    def staged(self) -> bool:
        """Whether the write is staged on an audit branch (main moves at the publish)."""
        return self.audit is not None

    @property
    def plans(self) -> dict[str, WritePlan]:
        """The plan each arm executed (the plan a dry run reported may have been older)."""
        return {arm: r.plan for arm, r in self.results.items() if r.plan is not None}

    @property
    def primary(self) -> WriteResult:
        """The authoritative arm's result (Iceberg when it was written)."""
        return self.results.get("iceberg") or next(iter(self.results.values()))


@dataclass
class Prepared:
    """A write's input converted and checked once, and each arm's `prepare` of it (the Iceberg
    arm's data files pre-written where the strategy allows), ahead of any lock."""

    spec: DatasetSpec
    window: Window | None
    checked: CheckedInput
    arms: dict[Arm, Any]
    partition: PartitionSlice | None = None

    def fits(self, spec: DatasetSpec, window: Any, partition: Any) -> bool:
        """Whether this was prepared for that spec, window and partition."""
        return (self.spec, self.window, self.partition) == (spec, window, partition)

    def discard(self) -> None:
        """Delete pre-written files no commit took (a no-op once they went into a commit)."""
        iceberg = self.arms.get("iceberg")
        if isinstance(iceberg, PreparedWrite):
            iceberg.discard()


class Publisher:
    """The publish pipeline: writes a dataset to the arm(s) its mode selects, and reads it from
    the authoritative arm. Every write, the model node's included, goes through `publish` (or
    `publish_stream`) in one order: resolve the arms -> convert and check the input once, against
    every arm's declared capabilities (`prepare`, before any lock or I/O) -> each arm plans under
    its lock and writes (Postgres, in `dual`, commits last) -> the deploy is recorded
    (`DeployLog.record_write`, the one definition of a deploy record for both arms).
    """

    def __init__(
        self,
        *,
        iceberg: IcebergStore,
        postgres: PostgresStore | None = None,
        ledger: Ledger | None = None,
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
            spec,
            override=override,
            flips=self.ledger.flip_log if self.ledger is not None else None,
            project_default=self.project_default,
        )

    def store(self, arm: Arm, *, spec: DatasetSpec | None = None) -> Store:
        """The store of `arm`; refuses the legacy arm where this deployment has none."""
        if arm == "iceberg":
            return self.iceberg
        if self.postgres is None:
            what = f"dataset {spec.name!r}: " if spec is not None else ""
            raise UnsupportedWrite(
                f"{what}the legacy Postgres arm is not available in this deployment; nothing "
                "was written"
            )
        return self.postgres

    def _stores(self, spec: DatasetSpec, mode: ResolvedMode) -> dict[Arm, Store]:
        if "pg" in mode.arms and self.postgres is None:
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: mode {mode.mode!r} (from {mode.source}) needs the legacy "
                "Postgres arm, which is not available in this deployment; nothing was written"
            )
        return {arm: self.store(arm) for arm in mode.arms}

    def plan(
        self, spec: DatasetSpec, *, mode: ResolvedMode, **scope: Unpack[WriteScope]
    ) -> dict[str, WritePlan]:
        """The write plan per arm (a dry run: probes, writes nothing)."""
        return {arm: s.plan(spec, **scope) for arm, s in self._stores(spec, mode).items()}

    def prepare(
        self, spec: DatasetSpec, data: Any, *, mode: ResolvedMode, **scope: Unpack[WriteScope]
    ) -> Prepared:
        """Convert and check `data` once, refuse what any arm of `mode` cannot store (and, for a
        Dagster partition, any row outside its slice), and let each arm prepare (no lock taken;
        pass the result to `publish(prepared=...)`)."""
        stores = self._stores(spec, mode)
        checked = checked_input(spec, data)
        for store in stores.values():  # every arm's refusal before any arm's I/O
            store.capabilities.check_frame(spec, checked.frame)
        window, partition = scope.get("window"), scope.get("partition")
        if partition is not None:
            check_in_partition(spec, checked.frame, partition)
        arms = {arm: store.prepare(spec, checked, **scope) for arm, store in stores.items()}
        return Prepared(spec=spec, window=window, checked=checked, arms=arms, partition=partition)

    def publish(
        self,
        spec: DatasetSpec,
        data: Any,
        *,
        mode: ResolvedMode,
        prepared: Prepared | None = None,
        audit: bool = False,
        **options: Unpack[WriteOptions],
    ) -> PublishResult:
        """Write `data` to every arm of `mode`; Postgres (when dual) commits last.

        `summary` adds `pipeline-output.*` properties to the write (a window attempt's marker,
        found again by `Store.find_marker`); `prepared` (from `prepare`, same spec and window) is
        used instead of `data`. With `audit` (and a mode that writes the Iceberg arm) the write
        is staged on the run's audit branch instead (`audit.stage_write`): main, the legacy arm
        and the deploy log change only at `audit.publish_audit`.
        """
        stores = self._stores(spec, mode)
        window, partition = options.get("window"), options.get("partition")
        if prepared is not None and not prepared.fits(spec, window, partition):
            raise InvalidArgument(
                f"dataset {spec.name!r}: the prepared write is for another spec, window or "
                "partition"
            )
        if audit and partition is not None and mode.mode == "dual":
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: write-audit-publish of a Dagster partition in dual mode "
                "is not supported (audit it in iceberg mode); nothing was written"
            )
        prep = prepared or self.prepare(spec, data, mode=mode, window=window, partition=partition)
        out = PublishResult(dataset=spec.name, mode=mode, window=window)
        if self.ledger is not None and not (audit and "iceberg" in mode.arms):
            self.ledger.audit_log.note_unaudited(spec.name, options.get("run_id"))
        try:
            if audit and "iceberg" in mode.arms:
                from pipeline_output.services.audit import stage_write

                out.results["iceberg"], out.audit = stage_write(
                    self,
                    spec,
                    prep.checked,
                    mode=mode.mode,
                    prepared=prep.arms["iceberg"],
                    options=options,
                )
                return out
            if mode.mode == "dual":
                return self._publish_dual(spec, prep, out=out, options=options)
            (arm,) = mode.arms
            result = stores[arm].write(spec, prep.checked, prepared=prep.arms[arm], **options)
            out.results[arm] = self._record(spec, result, options)
            return out
        finally:
            prep.discard()

    def publish_range(
        self,
        spec: DatasetSpec,
        items: Iterable[tuple[PartitionSlice, Callable[[], Any]]],
        *,
        mode: ResolvedMode,
        run_id: str | None = None,
        audit: bool = False,
        ahead: range_write.LoadedAhead | None = None,
    ) -> list[tuple[PartitionSlice, PublishResult]]:
        """Write the partitions of a Dagster range run, each `items` entry a slice and a
        zero-argument compute of its rows, called in order. `ahead`: what `load_range_ahead`
        loaded while the caller computed the first partition.

        In `iceberg` mode, unaudited, for a dataset whose partition write is a replace
        (`range_write.combines`): at most one table load, one writer lock and one commit — one
        snapshot — for every partition, each computed and written to files in turn (a small
        bounded batch of partitions in memory: `range_write.ENCODE_FRAMES` frames, under
        `ENCODE_BYTES`), nothing committed when any fails (`IcebergStore.write_range`); each partition
        keeps its own result and deploy record (recorded in one ledger statement). Otherwise,
        and from a partition whose frame evolves the table's schema on: one `publish` (one
        commit) per partition."""
        pending = iter(items)
        done: list[tuple[PartitionSlice, PublishResult]] = []
        if self._one_commit(spec, mode=mode, audit=audit):
            if self.ledger is not None:
                self.ledger.audit_log.note_unaudited(spec.name, run_id)
            ranged = self.iceberg.write_range(spec, pending, run_id=run_id, ahead=ahead)
            for part, written in ranged.results:
                out = PublishResult(dataset=spec.name, mode=mode)
                out.results["iceberg"] = written
                done.append((part, out))
            if self.ledger is not None and ranged.results:  # one statement, every partition
                self.ledger.deploy_log.record_writes(
                    spec, [written for _, written in ranged.results], run_id=run_id
                )
            if ranged.stopped is not None:
                part, frame = ranged.stopped
                pending = itertools.chain([(part, lambda: frame)], pending)
        for part, compute in pending:
            one = self.publish(
                spec, compute(), mode=mode, run_id=run_id, partition=part, audit=audit
            )
            done.append((part, one))
        return done

    def load_range_ahead(
        self, spec: DatasetSpec, *, mode: ResolvedMode, audit: bool = False
    ) -> range_write.LoadedAhead | None:
        """What a range run of `spec` in `mode` loads before its first partition, loaded now:
        for a caller that computes that partition meanwhile, on another thread, and passes this
        to `publish_range` (the Dagster IO manager: issue 44). None when the run loads nothing
        ahead (it is not written as one commit: each partition is a `publish`)."""
        if not self._one_commit(spec, mode=mode, audit=audit):
            return None
        return self.iceberg.load_ahead(spec)

    def _one_commit(self, spec: DatasetSpec, *, mode: ResolvedMode, audit: bool) -> bool:
        """Whether a range run of `spec` is written as one commit (`publish_range`)."""
        return mode.mode == "iceberg" and not audit and range_write.combines(spec)

    def _publish_dual(
        self, spec: DatasetSpec, prep: Prepared, *, out: PublishResult, options: WriteOptions
    ) -> PublishResult:
        assert self.postgres is not None
        window, run_id = prep.window, options.get("run_id")
        pending = self.postgres.begin_write(spec, prep.checked, prepared=prep.arms["pg"], **options)
        try:
            iceberg = self.iceberg.write(
                spec, prep.checked, prepared=prep.arms["iceberg"], **options
            )
            out.results["iceberg"] = self._record(spec, iceberg, options)
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
                    error=f"Iceberg committed snapshot {iceberg.snapshot_id} but the Postgres "
                    f"commit failed: {type(exc).__name__}: {exc}",
                    window=window,
                    snapshot_id=iceberg.snapshot_id,
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
        self._stores(spec, mode)
        if mode.mode == "iceberg":
            out = PublishResult(dataset=spec.name, mode=mode)
            result = self.iceberg.replace_streaming(
                spec, frames, run_id=run_id, summary=summary, finalize_summary=finalize_summary
            )
            self._record(spec, result, {"run_id": run_id, "summary": summary})
            out.results["iceberg"] = result
            return out
        frame = pl.concat(list(frames))
        full = {**(summary or {}), **(finalize_summary() if finalize_summary else {})}
        return self.publish(spec, frame, mode=mode, run_id=run_id, summary=full)

    def _record(self, spec: DatasetSpec, result: WriteResult, options: WriteOptions) -> WriteResult:
        """The deploy record of an arm that commits outside the ledger's database (Iceberg); the
        legacy arm makes the same `record_write` call inside its own transaction."""
        if self.ledger is not None and result.arm == "iceberg":
            self.ledger.deploy_log.record_write(spec, result, **options)
        return result

    def read(
        self, spec: DatasetSpec, *, mode: ResolvedMode, **options: Unpack[ReadOptions]
    ) -> pl.DataFrame:
        """Read from the authoritative arm: Iceberg once flipped; in dual the configured arm
        (`options` as the arms' own `read`: `window`, `columns`, `watermark`)."""
        if self._reads_legacy(spec, mode):
            assert self.postgres is not None
            return self.postgres.read(spec, **options)
        return self.iceberg.read(spec, **options)

    def scan(
        self,
        spec: DatasetSpec,
        *,
        mode: ResolvedMode,
        as_of: int | datetime | None = None,
        **rows: Unpack[WindowRead],
    ) -> pl.LazyFrame:
        """A lazy read of the authoritative arm (the arm `read` uses), see `lazy_reads`.

        Only the columns the query selects are read, and its filters (`window` among them:
        `low < watermark <= high`, `watermark` defaulting to the spec's own) are pushed down: into
        polars' native Iceberg scan pinned to the table's current snapshot, or as SQL
        parameters of the legacy arm's SELECT. `as_of` (a snapshot id or an aware time) reads a
        past version of the Iceberg table — in any mode that writes it (the legacy arm keeps no
        history: refused in `pg`).
        """
        if as_of is not None:
            if mode.mode == "pg":
                raise InvalidArgument(
                    f"dataset {spec.name!r}: as_of reads a past version of the Iceberg table, "
                    f"but the dataset's mode is 'pg' (from {mode.source}) and the legacy arm "
                    "keeps no history"
                )
            return lazy_reads.scan_iceberg_dataset(self.iceberg, spec, as_of=as_of, **rows)
        if self._reads_legacy(spec, mode):
            assert self.postgres is not None
            return lazy_reads.scan_postgres_dataset(self.postgres, spec, **rows)
        return lazy_reads.scan_iceberg_dataset(self.iceberg, spec, **rows)

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
