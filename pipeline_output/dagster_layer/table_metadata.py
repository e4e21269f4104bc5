"""Dagster's standard table metadata for a dataset, as the UI understands it.

- `dagster/column_schema`: the columns with their Iceberg type names (`long`, `string`,
  `timestamptz`, `decimal(10, 2)`, `list<string>` …) — the native table's schema, or for the legacy
  arm the schema the native arm would create from the same frame; the primary key as constraints
  (its columns not nullable; a single-column key unique; the key itself a table constraint) and
  each column's description (`@dataset(columns={...})`, else a `Columns:` section of the docstring);
- `dagster/table_name`: `<catalog>.<namespace>.<table>` (legacy arm: `<database>.<schema>.dataset_rows`);
- `dagster/uri`: the Iceberg table's location (legacy arm: the control plane's URL without
  credentials, with the table and the dataset as parameters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import dagster as dg
import polars as pl
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.services.runtime import Runtime

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
