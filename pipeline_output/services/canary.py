"""The canary: per-dataset flips, parity between the arms, the drain at the end of a migration,
and the status board. Pure core over the ledger and the two stores (no Dagster).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pipeline_output.contract.spec import MODES, DatasetSpec
from pipeline_output.errors import DrainRefused, PipelineOutputError
from pipeline_output.services.parity import ParityReport, compare
from pipeline_output.services.publish import Publisher
from pipeline_output.stores.iceberg.maintenance.health import file_counts


def _read_or_empty(store: Any, spec: DatasetSpec) -> Any:
    import polars as pl

    try:
        return store.read(spec)
    except LookupError:
        return pl.DataFrame()


def check_parity(
    publisher: Publisher, spec: DatasetSpec, *, run_id: str | None = None
) -> ParityReport:
    """Compare the arms' contents and record the result in the ledger."""
    assert publisher.postgres is not None
    pg = _read_or_empty(publisher.postgres, spec)
    ice = _read_or_empty(publisher.iceberg, spec)
    report = compare(spec, pg, ice)
    report = _unwritten_arm(publisher, spec, report, {"pg": pg.height, "iceberg": ice.height})
    if publisher.ledger is not None:
        publisher.ledger.parity_log.record_parity(
            spec.name,
            passed=report.passed,
            pg_count=report.pg_count,
            iceberg_count=report.iceberg_count,
            differing_keys={
                "only_in_pg": report.only_in_pg,
                "only_in_iceberg": report.only_in_iceberg,
            },
            run_id=run_id,
            details={"detail": report.detail} if report.detail else None,
        )
    return report


def _unwritten_arm(
    publisher: Publisher, spec: DatasetSpec, report: ParityReport, heights: dict[str, int]
) -> ParityReport:
    """A mismatch because one arm was never written (just flipped to dual) says so."""
    if report.passed or publisher.ledger is None:
        return report
    for arm, height in heights.items():
        if height == 0 and not publisher.ledger.deploy_log.has_succeeded_deploy(spec.name, arm):
            name = "legacy (pg)" if arm == "pg" else "Iceberg"
            return replace(
                report,
                unwritten=arm,
                detail=f"the {name} arm holds no rows of {spec.name} yet: materialize it in "
                "dual mode first",
            )
    return report


def flip(
    publisher: Publisher,
    specs: dict[str, DatasetSpec],
    dataset: str,
    mode: str,
    *,
    who: str,
    reason: str | None = None,
) -> Any:
    """Persist a flip (with history); unknown datasets and modes are refused, listing valid ones."""
    validate_flip(specs, dataset, mode)
    assert publisher.ledger is not None
    return publisher.ledger.flip_log.flip(dataset, mode, who=who, reason=reason)


def validate_flip(specs: dict[str, DatasetSpec], dataset: str, mode: str) -> None:
    """Refuse an unknown dataset or mode, listing the valid ones."""
    if dataset not in specs:
        raise PipelineOutputError(
            f"unknown dataset {dataset!r}; known datasets: {', '.join(sorted(specs)) or '(none)'}"
        )
    if mode not in MODES:
        raise PipelineOutputError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")


def drain(publisher: Publisher, spec: DatasetSpec) -> int:
    """Delete the dataset's legacy rows — only when flipped to iceberg and last parity passed."""
    assert publisher.ledger is not None and publisher.postgres is not None
    flipped = publisher.ledger.flip_log.current_flip(spec.name)
    if flipped != "iceberg":
        mode = publisher.resolve(spec)
        raise DrainRefused(
            f"dataset {spec.name!r}: drain refused — it is not flipped to iceberg (mode "
            f"{mode.mode!r} from {mode.source}; a declared default is not a flip); flip it to "
            f"iceberg first: pipeline-output flip {spec.name} iceberg"
        )
    last = publisher.ledger.parity_log.last_parity(spec.name)
    if last is None or not last.passed:
        state = "never ran" if last is None else f"failed at {last.at:%Y-%m-%d %H:%M:%S}"
        raise DrainRefused(
            f"dataset {spec.name!r}: drain refused — the last parity check {state}; run it in dual "
            f"mode until it passes (pipeline-output parity {spec.name})"
        )
    removed: int = publisher.postgres.drain(spec)
    publisher.ledger.drain_log.record_drain(
        spec.name, rows=removed
    )  # a rollback past it is refused
    return removed


@dataclass(frozen=True)
class StatusRow:
    """One dataset on the status board."""

    dataset: str
    mode: str
    mode_source: str
    last_pg_deploy: str
    last_iceberg_deploy: str
    pg_rows: int | None
    iceberg_rows: int | None
    last_parity: str
    iceberg_files: str = "-"  # "<data files>/<delete files>" of the Iceberg table
    last_maintenance: str = "-"  # the later of the last compaction and the last expiry


def status(publisher: Publisher, specs: dict[str, DatasetSpec]) -> list[StatusRow]:
    """Every dataset: mode and where it came from, last deploy per arm, rows per arm, the
    Iceberg table's files and last maintenance, parity."""
    assert publisher.ledger is not None and publisher.postgres is not None
    rows = []
    for name in sorted(specs):
        spec = specs[name]
        mode = publisher.resolve(spec)
        deploys = {}
        for arm in ("pg", "iceberg"):
            last = publisher.ledger.deploy_log.last_deploy(name, arm)
            deploys[arm] = (
                f"{last.status} {last.write_mode or ''} {last.finished_at:%Y-%m-%d %H:%M:%S}".strip()
                if last is not None
                else "-"
            )
        state = publisher.iceberg.target_state(spec)
        table = publisher.iceberg.load(spec) if state.exists else None
        counts = file_counts(table) if table is not None else None
        parity = publisher.ledger.parity_log.last_parity(name)
        rows.append(
            StatusRow(
                dataset=name,
                mode=mode.mode,
                mode_source=mode.source,
                last_pg_deploy=deploys["pg"],
                last_iceberg_deploy=deploys["iceberg"],
                pg_rows=_legacy_rows(publisher, spec),
                iceberg_rows=state.total_rows if state.exists else None,
                last_parity=(
                    "-"
                    if parity is None
                    else f"{'PASS' if parity.passed else 'FAIL'} {parity.at:%Y-%m-%d %H:%M:%S}"
                ),
                iceberg_files=(
                    f"{counts.data_files}/{counts.delete_files}" if counts is not None else "-"
                ),
                last_maintenance=_when(counts.last_maintenance if counts else None),
            )
        )
    return rows


def _legacy_rows(publisher: Publisher, spec: DatasetSpec) -> int | None:
    """The legacy arm's rows; None when that arm was never written (no rows, no succeeded
    deploy): `-` on the board, not a misleading 0 (a drained dataset keeps its 0)."""
    assert publisher.ledger is not None and publisher.postgres is not None
    rows: int = publisher.postgres.count(spec)
    if rows or publisher.ledger.deploy_log.has_succeeded_deploy(spec.name, "pg"):
        return rows
    return None


def _when(last: str | None) -> str:
    """`2026-03-01T03:00:00+00:00 rewrote 9 file(s) into 1` -> `2026-03-01 03:00:00 UTC`."""
    if not last:
        return "-"
    stamp = last.split(" ", 1)[0]
    return stamp.replace("T", " ").replace("+00:00", " UTC")
