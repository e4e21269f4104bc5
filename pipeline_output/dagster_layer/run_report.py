"""What a headless run did, for a person: one summary row per asset and arm, one line per failure.

`collect(result, ...)` reads one finished in-process run (run with `raise_on_error=False`, so a
failed asset does not stop the assets that do not depend on it) and returns its `RunOutcome`:

- a `MaterialisedAsset` row per asset the run selected and per arm it wrote — a `dual` write is
  two rows, the Iceberg write and the legacy (Postgres) one; a range run's windows are summed
  (each window partition records its own figures: `window_metadata`) and the note says which
  windows were applied or skipped; an asset whose step failed, or never ran because an upstream
  failed, still has its row (`status` `failed` / `not run`);
- a `Failure` per failure, as one line without a traceback: the first pipeline-output error in
  the step's error chain (else the innermost error), a failed check (ERROR severity) with its
  description, and for an audited dataset whose audit was not published: the check that failed,
  "main unchanged" and the branch kept;
- warnings: checks that failed with WARN severity.

`write_log` appends the run's full event log (levels, steps, messages, tracebacks) to a file, for
what the console leaves out; under each materialisation, what the write did — its partition and
its metadata's short facts (mode, write mode and why, row counts, commit, parity), as the UI
shows them: a write logs no line of its own (each line is an event in the run's storage).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from pipeline_output import errors
from pipeline_output.dagster_layer.failures import failure_retryable
from pipeline_output.dagster_layer.metadata import ACTION_KEY, WINDOW_KEY

WRITTEN = ("applied", "staged")
_CHECK_FAILED = "DagsterAssetCheckFailedError"  # a step that yielded a failed blocking check


@dataclass(frozen=True)
class MaterialisedAsset:
    """One line of the materialise summary: one asset, one arm."""

    asset: str
    run_id: str
    mode: str
    write_mode: str
    rows_in: int | None
    rows_inserted: int | None
    rows_updated: int | None
    rows_deleted: int | None
    snapshot: str
    note: str
    arm: str = ""
    status: str = "ok"  # ok | failed | not run


@dataclass(frozen=True)
class Failure:
    """One failure of a run, as one line (`message` names the dataset)."""

    asset: str
    run_id: str
    message: str
    retryable: bool = False


@dataclass
class RunOutcome:
    """Everything one run (or several) did."""

    rows: list[MaterialisedAsset] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def extend(self, other: RunOutcome) -> None:
        self.rows.extend(other.rows)
        self.failures.extend(other.failures)
        self.warnings.extend(other.warnings)
        self.run_ids.extend(other.run_ids)


def _value(meta: Mapping[str, Any], key: str) -> Any:
    raw = meta.get(key)
    return getattr(raw, "value", raw)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def error_line(error: Any, failure: Any = None) -> tuple[str, bool]:
    """(message, retryable) of a Dagster `SerializableErrorInfo`: a pipeline-output error as it
    reached Dagster (a `dg.Failure` whose metadata — `failure`, the step's `UserFailureData` —
    says whether it is retryable: `failures.as_failure`; after a retry policy's last attempt, the
    cause of Dagster's "exceeded max_retries") or as the first pipeline-output error in its cause
    chain, else the innermost error with its class name."""
    chain: list[Any] = []
    while error is not None and len(chain) < 20:
        chain.append(error)
        error = error.cause or error.context
    retryable = failure_retryable(getattr(failure, "metadata", None))
    for info in chain:
        if retryable is not None and info.cls_name == "Failure":  # under "max retries exceeded"
            return _strip(info), retryable
        cls = getattr(errors, info.cls_name or "", None)
        if isinstance(cls, type) and issubclass(cls, errors.PipelineOutputError):
            return _strip(info), issubclass(cls, errors.RetryableError)
    inner = chain[-1] if chain else None
    if inner is None:
        return "failed (no error recorded)", False
    if inner.cls_name in ("Failure", "DagsterExecutionStepExecutionError"):
        return _strip(inner), False
    return f"{inner.cls_name}: {_strip(inner)}", False


def _strip(info: Any) -> str:
    """The message without the `module.Class: ` prefix Dagster puts in front."""
    text = str(info.message or "").strip()
    head, sep, rest = text.partition(": ")
    if sep and head.split(".")[-1] == info.cls_name:
        text = rest
    return _one_line(text)


def _entities(defs: dg.Definitions) -> dict[str, list[Any]]:
    """Op name -> the asset keys and check keys its step materialises or evaluates."""
    out: dict[str, list[Any]] = {}
    for item in [*(defs.assets or []), *(defs.asset_checks or [])]:
        if isinstance(item, dg.AssetsDefinition):
            out[item.node_def.name] = [*item.keys, *item.check_keys]
    return out


def collect(
    result: dg.ExecuteInProcessResult,
    defs: dg.Definitions,
    selected: Sequence[dg.AssetKey],
    *,
    audits: Iterable[Any] = (),
) -> RunOutcome:
    """The outcome of one finished run (see the module docstring); `audits`: the audit records
    the run staged, already settled (published or failed)."""
    run_id = result.run_id
    outcome = RunOutcome(run_ids=[run_id])
    events = list(result.all_events)
    by_asset: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event.event_type_value == "ASSET_MATERIALIZATION":
            mat = event.event_specific_data.materialization  # type: ignore[union-attr]
            by_asset.setdefault(mat.asset_key.to_user_string(), []).append(dict(mat.metadata))
    failed_checks: dict[str, list[str]] = {}
    for event in events:
        if event.event_type_value != "ASSET_CHECK_EVALUATION":
            continue
        evaluation = event.event_specific_data
        if evaluation.passed:  # type: ignore[union-attr]
            continue
        asset = evaluation.asset_key.to_user_string()  # type: ignore[union-attr]
        text = f"check {evaluation.check_name!r} failed"  # type: ignore[union-attr]
        if evaluation.description:  # type: ignore[union-attr]
            text += f": {_one_line(evaluation.description)}"  # type: ignore[union-attr]
        if evaluation.severity == dg.AssetCheckSeverity.WARN:  # type: ignore[union-attr]
            outcome.warnings.append(f"{asset}: {text}")
        else:
            failed_checks.setdefault(asset, []).append(text)
    entities = _entities(defs)
    step_state: dict[str, str] = {}
    for event in events:
        kind = event.event_type_value
        if kind not in ("STEP_FAILURE", "STEP_SKIPPED") or event.step_key is None:
            continue
        keys = entities.get(event.step_key, [])
        assets = [k for k in keys if isinstance(k, dg.AssetKey)]
        if kind == "STEP_SKIPPED":
            for key in assets:
                step_state.setdefault(key.to_user_string(), "not run")
            continue
        error = event.step_failure_data.error
        checked = {k.asset_key.to_user_string() for k in keys if isinstance(k, dg.AssetCheckKey)}
        # a blocking check that failed — in a step of its own, or in the dataset's step after
        # the write (the dataset was written): its evaluation is the line
        by_check = not assets or (error is not None and error.cls_name == _CHECK_FAILED)
        if by_check and checked and all(a in failed_checks for a in checked):
            continue
        for key in assets:
            step_state[key.to_user_string()] = "failed"
        message, retryable = error_line(error, event.step_failure_data.user_failure_data)
        name = ", ".join(sorted(a.to_user_string() for a in assets) or sorted(checked))
        where = "" if assets else "check step: "
        outcome.failures.append(
            Failure(name, run_id, _named(name, f"{where}{message}"), retryable=retryable)
        )
    unpublished = {a.dataset: a for a in audits if a.state != "published"}
    notes = {
        a: f"staged on {u.branch}, not published: main unchanged" for a, u in unpublished.items()
    }
    for asset, checks in failed_checks.items():
        audit = unpublished.pop(asset, None)
        text = "; ".join(checks)
        if audit is not None:
            text += "; " + _audit_text(audit)
            step_state[asset] = "failed"
        outcome.failures.append(Failure(asset, run_id, _named(asset, text)))
    for asset, audit in unpublished.items():
        step_state[asset] = "failed"
        retryable = "main moved" in (audit.reason or "")
        text = f"{audit.reason or 'not every blocking check passed'}; {_audit_text(audit)}"
        outcome.failures.append(Failure(asset, run_id, _named(asset, text), retryable=retryable))
    for key in selected:
        name = key.to_user_string()
        metas = by_asset.get(name)
        status = step_state.get(name, "ok" if metas else "not run")
        if metas:
            rows = _rows(name, run_id, metas, status)
            if name in notes:
                rows = [replace(r, note=notes[name]) for r in rows]
            outcome.rows.extend(rows)
        else:
            outcome.rows.append(_missing(name, run_id, status))
    return outcome


def _named(asset: str, text: str) -> str:
    return text if text.startswith(f"dataset {asset!r}") else f"{asset}: {text}"


def _audit_text(audit: Any) -> str:
    return (
        f"audit not published: main unchanged, branch {audit.branch} kept "
        f"(pipeline-output audit show {audit.dataset})"
    )


def _missing(asset: str, run_id: str, status: str) -> MaterialisedAsset:
    note = "its step failed" if status == "failed" else "an upstream step failed"
    return MaterialisedAsset(
        asset, run_id, "", "-", None, None, None, None, "-", note, status=status
    )


def _arm_value(meta: Mapping[str, Any], arm: str, key: str, primary: bool) -> Any:
    value = _value(meta, f"{arm}/{key}")
    if value is None and primary:
        value = _value(meta, key)
    return value


def _sum(values: Iterable[Any]) -> int | None:
    numbers = [int(v) for v in values if isinstance(v, int)]
    return sum(numbers) if numbers else None


def _rows(
    asset: str, run_id: str, metas: list[dict[str, Any]], status: str
) -> list[MaterialisedAsset]:
    """One row per arm; a range run's windows summed (written windows only)."""
    first = metas[0]
    # a range run of a partitioned dataset says its mode and arms once, on its last partition
    shared = next((m for m in reversed(metas) if _value(m, "arms") is not None), first)
    arms = [a.strip() for a in str(_value(shared, "arms") or "").split(",") if a.strip()]
    arms = arms or [""]
    windowed = _value(first, ACTION_KEY) is not None
    written = [m for m in metas if _value(m, ACTION_KEY) in WRITTEN] if windowed else metas
    written.sort(key=lambda m: str(_value(m, WINDOW_KEY) or ""))
    note = str(_value(first, "run_windows") or "") if windowed else str(_value(first, "note") or "")
    if status == "failed" and not note:
        note = "failed"
    out = []
    for arm in arms:
        primary = arm == arms[0]
        modes = []
        for m in written:
            mode = str(_arm_value(m, arm, "write_mode", primary) or "")
            if mode and mode not in modes:
                modes.append(mode)
        snapshot = None
        for m in reversed(written):  # the last write's snapshot (Iceberg) or deploy (legacy)
            snapshot = _value(m, "pg/deploy_id" if arm == "pg" else "iceberg/snapshot_id")
            if snapshot is None and not arm:
                snapshot = _value(m, "iceberg/snapshot_id") or _value(m, "pg/deploy_id")
            if snapshot not in (None, "no-op"):
                break
        out.append(
            MaterialisedAsset(
                asset=asset,
                run_id=run_id,
                mode=str(_value(shared, "mode") or ""),
                write_mode=", ".join(modes) or "-",
                rows_in=_sum(_arm_value(m, arm, "rows_in", primary) for m in written),
                rows_inserted=_sum(_arm_value(m, arm, "rows_inserted", primary) for m in written),
                rows_updated=_sum(_arm_value(m, arm, "rows_updated", primary) for m in written),
                rows_deleted=_sum(_arm_value(m, arm, "rows_deleted", primary) for m in written),
                snapshot=str(snapshot or "no-op"),
                note=note,
                arm=arm,
                status=status,
            )
        )
    return out


def format_table(rows: Sequence[MaterialisedAsset]) -> str:
    """The summary as a plain-text table (the note column is never cut)."""
    header: tuple[str, ...] = ("dataset", "arm", "mode", "write mode", "in", "ins", "upd", "del")
    header += ("snapshot", "result", "note")
    body = [
        (
            r.asset,
            r.arm or "-",
            r.mode,
            r.write_mode,
            *(
                "" if v is None else str(v)
                for v in (r.rows_in, r.rows_inserted, r.rows_updated, r.rows_deleted)
            ),
            r.snapshot,
            r.status,
            r.note,
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False))
        for row in [header, *body]
    ]
    return "\n".join(line.rstrip() for line in lines)


def write_log(path: Path, instance: dg.DagsterInstance, run_id: str) -> None:
    """Append the run's full event log (with tracebacks) to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(f"=== run {run_id}\n")
        for entry in instance.all_logs(run_id):
            at = datetime.fromtimestamp(entry.timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
            level = _level_name(entry.level)
            step = entry.step_key or "-"
            event = entry.dagster_event
            kind = entry.dagster_event_type.value if entry.dagster_event_type else "LOG"
            text = entry.user_message or (event.message if event is not None else "") or ""
            out.write(f"{at} {level:<8} {step} {kind}: {text}\n")
            data = getattr(event, "event_specific_data", None) if event is not None else None
            materialization = getattr(data, "materialization", None)
            if isinstance(materialization, dg.AssetMaterialization):
                out.write(f"    {_facts(materialization)}\n")
            error = getattr(data, "error", None)
            if error is not None:
                out.write("    " + error.to_string().replace("\n", "\n    ").rstrip() + "\n")


_FACT_TYPES = (
    dg.TextMetadataValue,
    dg.IntMetadataValue,
    dg.FloatMetadataValue,
    dg.BoolMetadataValue,
)
_FACT_WIDTH = 200  # longer text (a range run's per-partition lines) stays in the UI


def _facts(materialization: dg.AssetMaterialization) -> str:
    """A materialisation's short facts on one line: its partition, then each text, number or
    flag entry of its metadata (`key=value`, in the order the write recorded them; a value
    holding the separator is quoted)."""
    facts = [f"partition={materialization.partition}"] if materialization.partition else []
    for key, raw in materialization.metadata.items():
        if not isinstance(raw, _FACT_TYPES) or raw.value is None:
            continue
        value = _one_line(str(raw.value))
        if len(value) <= _FACT_WIDTH:
            facts.append(f"{key}={json.dumps(value) if '; ' in value else value}")
    return "; ".join(facts) or "(no metadata)"


def _level_name(level: Any) -> str:
    import logging

    return logging.getLevelName(level) if isinstance(level, int) else str(level)
