"""Materialisation metadata: a publish result as Dagster metadata (what the UI shows).

Keys, grouped so that related ones sit together and numbers stay numbers (plottable across runs):

- Dagster's standard keys (`table_metadata`): `dagster/row_count` (rows in the table after the
  write), `dagster/partition_row_count` (a window run: rows the window wrote), `dagster/table_name`
  (`<catalog>.<namespace>.<table>`), `dagster/uri` (the table's location) and
  `dagster/column_schema` (Iceberg type names, the primary key as constraints, descriptions);
- what this write did, whatever the arm: `mode` (and where it came from), `arms`, `write_mode`,
  `why`, `noop`, `note`, the row counts `rows_in`, `rows_inserted`, `rows_updated`,
  `rows_deleted`, `rows_unchanged`, `rows_preserved`, `rows_skipped`, and the timings
  `duration_s`, `lock_wait_s`, `lock_held_s` (window runs add `windows`, `windows_applied`, …);
- `iceberg/…` the native table: `snapshot_id` (none on a no-op), `files_rewritten`, `files_added`, `data_files`,
  `delete_files`, `snapshots`, `last_maintenance`, `rows_total_after`, `audit_branch`;
- `pg/…` the legacy arm: `deploy_id`, `rows_total_after`, `uri` (`dual` only);
- a `dual` write also puts each arm's `write_mode`, `rows_in`, `rows_inserted`, `rows_updated`,
  `rows_deleted` under its prefix (the unprefixed figures are the primary arm's).

The dataset's spec is not among them (it rides on the asset's compute: `dataset.py`).

Dagster's standard table metadata for a dataset, as the UI understands it.

- `dagster/column_schema`: the columns with their Iceberg type names (`long`, `string`,
  `timestamptz`, `decimal(10, 2)`, `list<string>` …) — the native table's schema, or for the legacy
  arm the schema the native arm would create from the same frame; the primary key as constraints
  (its columns not nullable; a single-column key unique; the key itself a table constraint) and
  each column's description (`@dataset(columns={...})`, else a `Columns:` section of the docstring);
- `dagster/table_name`: `<catalog>.<namespace>.<table>` (legacy arm: `<database>.<schema>.dataset_rows`);
- `dagster/uri`: the Iceberg table's location (legacy arm: the control plane's URL without
  credentials, with the table and the dataset as parameters).

The truth per window: what each window partition of a run records as its materialisation.

A run that applies several windows (a range run) materialises one partition per window. Dagster
merges the step's metadata (every partition) under each partition's own (`add_asset_metadata(...,
partition_key=...)`), so the run-wide part holds only what is true of every window — the mode,
the arms, how many windows were applied or skipped, the table after the run — and each window's
figures (rows in / inserted / updated / deleted, `dagster/partition_row_count`, its snapshot or
deploy id, the write mode) go to its own partition. A window the run skipped (already applied)
says so, with the run and snapshot that applied it, never another window's figures.

Keys each window records (besides the write's own metadata, `metadata.publish_metadata`):
`window` (`(low, high]`), `window_action` (`applied`, `staged`, `skipped`, `repaired`) and
`dagster/partition_row_count` (the rows the window holds: the rows it read from the source).
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import dagster as dg
import polars as pl
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from pipeline_output.contract.plan import WriteResult
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.contract.windows import Window
from pipeline_output.services.publish import PublishResult, ResolvedMode
from pipeline_output.services.runtime import Runtime
from pipeline_output.services.window_apply import WindowOutcome
from pipeline_output.stores.iceberg.maintenance.health import file_counts

_SECTION = re.compile(r"^(?P<indent>[ \t]*)Columns:[ \t]*$")
_ENTRY = re.compile(
    r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)[ \t]*(\([^)]*\))?[ \t]*:[ \t]*(?P<text>.*)$"
)


def docstring_columns(doc: str | None) -> dict[str, str]:
    """Column descriptions from a `Columns:` section of a docstring (Google style):

    Columns:
        sale_id: the sale's id
        total: quantity times unit price,
            in the sale's currency
    """
    out: dict[str, str] = {}
    lines = (doc or "").splitlines()
    for i, line in enumerate(lines):
        header = _SECTION.match(line)
        if header is None:
            continue
        base = len(header.group("indent").expandtabs())
        entry_indent: int | None = None
        name: str | None = None
        for raw in lines[i + 1 :]:
            if not raw.strip():
                continue
            indent = len(raw) - len(raw.lstrip())
            if indent <= base:
                break
            entry = _ENTRY.match(raw.strip())
            if entry is not None and (entry_indent is None or indent <= entry_indent):
                entry_indent = indent
                name = entry.group("name")
                out[name] = entry.group("text").strip()
            elif name is not None:
                out[name] = f"{out[name]} {raw.strip()}".strip()
        break
    return out


def column_schema(
    schema: Schema, spec: DatasetSpec, *, descriptions: Mapping[str, str] | None = None
) -> dg.TableSchema:
    """`dagster/column_schema` of an Iceberg schema: Iceberg type names, the key as constraints."""
    docs = dict(spec.columns) if descriptions is None else dict(descriptions)
    pk = tuple(spec.primary_key)
    columns = []
    for f in schema.fields:
        in_key = f.name in pk
        columns.append(
            dg.TableColumn(
                name=f.name,
                type=str(f.field_type),
                description=docs.get(f.name) or f.doc or None,
                constraints=dg.TableColumnConstraints(
                    nullable=not (f.required or in_key),
                    unique=pk == (f.name,),
                ),
            )
        )
    constraints = dg.TableConstraints(other=[f"primary key ({', '.join(pk)})"]) if pk else None
    return dg.TableSchema(columns=columns, constraints=constraints)


def frame_column_schema(spec: DatasetSpec, frame_schema: pl.Schema) -> dg.TableSchema:
    """The column schema of a frame (the legacy arm): the Iceberg schema the native arm creates."""
    from pipeline_output.stores.schema import initial_schema

    empty = pl.DataFrame(schema=frame_schema)
    schema, _ = initial_schema(spec, empty)
    return column_schema(schema, spec)


def iceberg_table_name(runtime: Runtime, spec: DatasetSpec) -> str:
    """`<catalog>.<namespace>.<table>` of the native table."""
    return f"{runtime.catalog.name}.{runtime.iceberg.table_name(spec)}"


def iceberg_table_metadata(runtime: Runtime, spec: DatasetSpec, table: Table) -> dict[str, Any]:
    """`dagster/table_name`, `dagster/uri` (a link) and `dagster/column_schema` of the native
    table."""
    return {
        "dagster/table_name": iceberg_table_name(runtime, spec),
        "dagster/uri": dg.MetadataValue.url(table.location()),
        "dagster/column_schema": column_schema(table.schema(), spec),
    }


def legacy_table_metadata(runtime: Runtime, spec: DatasetSpec) -> dict[str, Any]:
    """`dagster/table_name` and `dagster/uri` of the legacy arm's rows of `spec`."""
    table = runtime.postgres.table_name(spec)
    parts = urlsplit(runtime.pg_url)
    database = parts.path.lstrip("/") or "postgres"
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("password", "user", "passfile")]
    query += [("table", table), ("dataset", spec.name)]
    netloc = parts.netloc.rsplit("@", 1)[-1]  # no user, no password
    # written out: urlunsplit drops the `//` of an empty host (a unix-socket URI)
    uri = f"{parts.scheme}://{netloc}{parts.path}?{urlencode(query, safe='/.:')}"
    return {"dagster/table_name": f"{database}.{table}", "dagster/uri": dg.MetadataValue.url(uri)}


def arm_kinds(mode: str | None) -> set[str]:
    """The asset kinds of a dataset written in `mode`: its arms' storage (`iceberg`, `postgres`;
    `dual` and an undecided mode both)."""
    if mode == "iceberg":
        return {"iceberg"}
    if mode == "pg":
        return {"postgres"}
    return {"iceberg", "postgres"}


CODE_REFERENCES_KEY = "dagster/code_references"


def code_reference(fn: Any) -> dg.CodeReferencesMetadataValue | None:
    """Where the compute `fn` is written (its file, the line of its first decorator), for the
    UI's "Open in editor" (None: no source file, e.g. a function made at run time)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None or not os.path.isfile(code.co_filename):
        return None
    path: str = code.co_filename
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # Dagster's own references are beta too
        return dg.CodeReferencesMetadataValue(
            code_references=[
                dg.LocalFileCodeReference(
                    file_path=os.path.abspath(path), line_number=code.co_firstlineno
                )
            ]
        )


def definition_metadata(spec: DatasetSpec) -> dict[str, Any]:
    """What the asset definition shows of its spec (the spec itself stays out of sight)."""
    meta: dict[str, Any] = {
        "pipeline_output/strategy": spec.strategy,
        "pipeline_output/primary_key": ", ".join(spec.primary_key) or "(none)",
        "pipeline_output/mode": spec.mode or "project default",
    }
    if spec.delta is not None:
        meta["pipeline_output/delta"] = f"{spec.delta.source}.{spec.delta.watermark} windows"
    return meta


def _why(result: PublishResult) -> str:
    if result.primary.first_deploy:
        return "first deploy"
    if result.window is not None:
        return f"window {result.window}"
    return "re-deploy"


def publish_metadata(
    result: PublishResult,
    *,
    runtime: Runtime,
    spec: DatasetSpec,
    schema: pl.Schema | None = None,
) -> dict[str, Any]:
    """Everything a user looks for after a write: what the write did and why, each arm's own
    figures under its prefix (`write_metadata`), and Dagster's table keys (`table_metadata`)."""
    return {
        **write_metadata(result),
        **table_metadata(runtime, spec, arms=tuple(result.results), schema=schema),
    }


def write_metadata(result: PublishResult) -> dict[str, Any]:
    """What one write did and why, with each arm's figures under its prefix; reads nothing."""
    primary = result.primary
    plan = result.plans.get("iceberg") or next(iter(result.plans.values()), None)
    meta: dict[str, Any] = {
        "dagster/row_count": primary.rows_total_after,
        "mode": f"{result.mode.mode} (from {result.mode.source})",
        "arms": ", ".join(result.results),
        "write_mode": primary.write_mode,
        "why": plan.reason if plan is not None else _why(result),
        "noop": primary.noop,
        "rows_in": primary.rows_in,
        "rows_inserted": primary.rows_inserted,
        "rows_updated": primary.rows_updated,
        "rows_deleted": primary.rows_deleted,
        "rows_unchanged": primary.rows_unchanged,
        "rows_preserved": primary.rows_preserved,
        "rows_skipped": primary.rows_skipped,
        "duration_s": round(primary.duration_s, 4),
        "lock_wait_s": round(primary.lock_wait_s, 4),
        "lock_held_s": round(primary.lock_held_s, 4),
    }
    if primary.noop:
        meta["note"] = "no-op: nothing changed, no snapshot committed"
    if result.audit is not None:
        audit = result.audit
        meta["audit"] = (
            f"staged on branch {audit.branch}; main moves when the blocking checks pass"
            + (" (the legacy arm is written then)" if audit.mode == "dual" else "")
        )
        meta["arms"] = "iceberg, pg" if audit.mode == "dual" else "iceberg"
    both = len(result.results) > 1
    for arm, res in result.results.items():
        meta.update(_arm_metadata(arm, res, both=both))
    if result.audit is not None:
        meta["iceberg/audit_branch"] = result.audit.branch
    return meta


def table_metadata(
    runtime: Runtime,
    spec: DatasetSpec,
    *,
    arms: Sequence[str],
    schema: pl.Schema | None = None,
) -> dict[str, Any]:
    """The dataset's table as the write left it, written to `arms`: Dagster's table keys (name,
    link, column schema) and the Iceberg table's file counts (the table as this process's write
    left it — no catalog request —, else one table load). `schema`: the written frame's, the
    legacy arm's column schema."""
    table = None
    if "iceberg" in arms:
        table = runtime.iceberg.tables.as_written(spec) or runtime.iceberg.load(spec)
    meta: dict[str, Any] = {}
    if table is not None:
        meta.update(iceberg_table_metadata(runtime, spec, table))
        meta.update(table_files_metadata(table))
    else:
        meta.update(legacy_table_metadata(runtime, spec))
        if schema is not None:
            meta["dagster/column_schema"] = frame_column_schema(spec, schema)
    if len(arms) > 1:
        meta["pg/uri"] = legacy_table_metadata(runtime, spec)["dagster/uri"]
    return meta


def _arm_metadata(arm: str, res: WriteResult, *, both: bool) -> dict[str, Any]:
    """One arm's figures under its prefix (its write mode and row counts only when two arms were
    written)."""
    if arm == "iceberg":
        meta: dict[str, Any] = {
            "iceberg/rows_total_after": res.rows_total_after,
            "iceberg/files_rewritten": res.files_rewritten,
            "iceberg/files_added": res.files_added,
        }
        if res.snapshot_id is not None:  # none on a no-op
            meta["iceberg/snapshot_id"] = str(res.snapshot_id)
        if res.merge_path:  # which merge compared the rows, and why
            meta["iceberg/merge_path"] = res.merge_path
    else:
        meta = {"pg/rows_total_after": res.rows_total_after}
        if res.snapshot_id is not None:
            meta["pg/deploy_id"] = str(res.snapshot_id)
    if both:  # each arm's own figures (the unprefixed ones are the primary arm's)
        meta[f"{arm}/write_mode"] = res.write_mode
        for count in ("rows_in", "rows_inserted", "rows_updated", "rows_deleted"):
            meta[f"{arm}/{count}"] = getattr(res, count)
    return meta


def table_files_metadata(table: Table | None) -> dict[str, Any]:
    """The Iceberg table's file counts and last maintenance (snapshot summary and table
    properties only: no manifest is read)."""
    if table is None:
        return {}
    counts = file_counts(table)
    return {
        "iceberg/data_files": counts.data_files,
        "iceberg/delete_files": counts.delete_files,
        "iceberg/snapshots": counts.snapshots,
        "iceberg/last_maintenance": counts.last_maintenance or "never",
    }


WINDOW_KEY = "window"
ACTION_KEY = "window_action"
PARTITION_ROWS = "dagster/partition_row_count"


def run_metadata(outcomes: Sequence[WindowOutcome], mode: ResolvedMode) -> dict[str, Any]:
    """What is true of every window of the run (the step's output metadata)."""
    counts = {
        action: sum(o.action == action for o in outcomes)
        for action in ("applied", "staged", "skipped", "repaired")
    }
    meta: dict[str, Any] = {
        "mode": f"{mode.mode} (from {mode.source})",
        "arms": ", ".join(mode.arms),
        "run_windows": describe_windows(outcomes),
        "windows": ", ".join(f"{o.window} {o.action}" for o in outcomes),
        **{f"windows_{action}": n for action, n in counts.items() if n or action != "staged"},
    }
    return meta


def run_table_metadata(
    last: PublishResult, *, runtime: Runtime, spec: DatasetSpec
) -> dict[str, Any]:
    """The table after the run (its last write): total rows, name, link, column schema, files."""
    return {
        "dagster/row_count": last.primary.rows_total_after,
        "table": last.primary.table,
        **table_metadata(runtime, spec, arms=tuple(last.results)),
    }


def describe_windows(outcomes: Sequence[WindowOutcome]) -> str:
    """`4 windows (-inf, 2026-11-01T06:40:00+00:00]: 3 applied, 1 skipped` — the run's span and
    what happened, short enough for a summary line."""
    if not outcomes:
        return "no window"
    first, last = outcomes[0].window, outcomes[-1].window
    span = first if len(outcomes) == 1 else Window(low=first.low, high=last.high)
    actions: dict[str, int] = {}
    for outcome in outcomes:
        actions[outcome.action] = actions.get(outcome.action, 0) + 1
    what = ", ".join(f"{n} {action}" for action, n in actions.items())
    noun = "window" if len(outcomes) == 1 else "windows"
    return f"{len(outcomes)} {noun} {span}: {what}"


def window_metadata(outcome: WindowOutcome) -> dict[str, Any]:
    """One window's own metadata (it overrides the run-wide keys on its partition)."""
    meta: dict[str, Any] = {WINDOW_KEY: str(outcome.window), ACTION_KEY: outcome.action}
    row = outcome.row
    if outcome.result is not None:  # applied, or staged on the run's audit branch
        meta.update(write_metadata(outcome.result))  # the table itself is run-wide
        meta[PARTITION_ROWS] = outcome.result.primary.rows_in
        return meta
    where = row.iceberg_snapshot_id or row.pg_deploy_id
    by = (row.run_id or "?")[:8]
    if outcome.action == "skipped":
        meta["note"] = (
            f"no-op: skipped, already applied by run {by} (snapshot/deploy {where}); "
            "nothing written"
        )
    else:  # repaired: a crashed attempt had committed; the ledger was completed
        meta["note"] = (
            f"repaired: the attempt of run {by} had committed (snapshot/deploy {where}); "
            "ledger completed, nothing written"
        )
    meta["applied_by_run"] = row.run_id or ""
    meta["applied_snapshot_id"] = str(where) if where is not None else ""
    if row.rows_read is not None:
        meta[PARTITION_ROWS] = row.rows_read
    return meta


def record_window_metadata(
    context: dg.OutputContext,
    outcomes: Sequence[WindowOutcome],
) -> None:
    """Attach each window's metadata to its own partition of the step's materialisation."""
    try:
        step = context.step_context
    except dg.DagsterInvariantViolationError:  # a context built outside a run (a unit test)
        return
    targeted = set(context.asset_partition_keys) if context.has_asset_partitions else set()
    for outcome in outcomes:
        key = outcome.row.partition_key
        if key not in targeted:  # a window applied through another key spelling: run-wide only
            continue
        step.add_asset_metadata(
            window_metadata(outcome),
            asset_key=context.asset_key,
            partition_key=key,
        )
