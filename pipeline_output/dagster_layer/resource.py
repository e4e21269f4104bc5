"""`PipelineOutputResource`: where a code location's datasets live — the control-plane Postgres, the
Iceberg catalog and the namespace — as a typed Dagster resource; and `runtime_of`, how every
Dagster entry point of this layer (IO manager, asset bodies, checks, sensors, hooks, ops) gets the
runtime of the resource bound in its code location.

Configured (`pg_url` and `catalog` given, as values or `dg.EnvVar`s), the resource is the whole
configuration: nothing is read from `PIPELINE_OUTPUT_*` / `PYICEBERG_*` variables and no embedded
server is started, so two code locations with different control planes and catalogs run side by
side. Left empty (`PipelineOutputResource()`, what `build_definitions` binds when given none), it
is the zero-config default: the environment's settings, with `namespace`, `default_mode` and
`dual_reads_from` winning over their variables when given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline_output.contract.spec import ARMS, MODES
from pipeline_output.dagster_layer.process_runtime import cached_runtime, get_runtime
from pipeline_output.errors import InvalidArgument
from pipeline_output.services.runtime import Runtime, connect

RESOURCE_KEY = "pipeline_output"
"""The resource key every pipeline-output definition requires (bound by `build_definitions`)."""


class PipelineOutputResource(dg.ConfigurableResource["PipelineOutputResource"]):
    """The control plane, the Iceberg catalog and the namespace of a code location's datasets."""

    pg_url: str | None = Field(
        default=None,
        description="The control-plane Postgres (ledger, legacy arm) as a libpq URI; with "
        "`catalog`, nothing is read from the environment.",
    )
    catalog: dict[str, str] | None = Field(
        default=None,
        description="pyiceberg catalog properties, any catalog type: "
        '{"type": "sql", "uri": ..., "warehouse": ...}, {"type": "rest", "uri": ...}, Glue ...',
    )
    namespace: str | None = Field(
        default=None, description="The Iceberg namespace of the datasets (default `datasets`)."
    )
    catalog_name: str = Field(
        default="default",
        description="The pyiceberg catalog name (part of every SQL-catalog key: every process "
        "of a deployment must use the same).",
    )
    default_mode: str | None = Field(
        default=None,
        description="The mode of a dataset declared without one: pg, iceberg or dual (default pg).",
    )
    dual_reads_from: str | None = Field(
        default=None, description="The arm downstream reads of a `dual` dataset use: pg or iceberg."
    )

    @property
    def configured(self) -> bool:
        """Whether this resource names the control plane and catalog itself (no environment)."""
        return self.pg_url is not None or self.catalog is not None

    def check(self, *, where: str = "PipelineOutputResource") -> None:
        """Refuse, before any I/O, what cannot work (one line naming the field): `pg_url` without
        `catalog` or the reverse, an unknown mode or arm. Values behind `dg.EnvVar`s are checked
        when the runtime is built."""
        if (self.pg_url is None) != (self.catalog is None):
            given, missing = (
                ("pg_url", "catalog") if self.catalog is None else ("catalog", "pg_url")
            )
            raise InvalidArgument(
                f"{where}: {given} is set but {missing} is not; give both (the control plane "
                "and the Iceberg catalog) or neither (the environment's settings)"
            )
        if self.default_mode is not None and self.default_mode not in MODES:
            raise InvalidArgument(
                f"{where}: default_mode {self.default_mode!r} is not one of {', '.join(MODES)}"
            )
        if self.dual_reads_from is not None and self.dual_reads_from not in ARMS:
            raise InvalidArgument(
                f"{where}: dual_reads_from {self.dual_reads_from!r} is not one of {', '.join(ARMS)}"
            )

    def runtime(self) -> Runtime:
        """The runtime this resource describes, connected once per process and configuration."""
        self.check()
        if not self.configured:
            return get_runtime(
                namespace=self.namespace,
                mode=self.default_mode,
                dual_reads_from=self.dual_reads_from,
            )
        pg_url = _value(self.pg_url)
        catalog = {str(k): _value(v) for k, v in (self.catalog or {}).items()}
        namespace = self.namespace or "datasets"
        mode = self.default_mode or "pg"
        dual = self.dual_reads_from or "pg"
        key = json.dumps(
            ["resource", pg_url, catalog, namespace, self.catalog_name, mode, dual], sort_keys=True
        )
        return cached_runtime(
            key,
            lambda: connect(
                pg_url=pg_url,
                catalog=catalog,
                namespace=namespace,
                catalog_name=self.catalog_name,
                default_mode=mode,  # type: ignore[arg-type]
                dual_reads_from=dual,  # type: ignore[arg-type]
            ),
        )


def _value(raw: Any) -> str:
    """A field's value: an `EnvVar` (outside a run Dagster has not resolved it yet) read now."""
    if isinstance(raw, dg.EnvVar):
        value = raw.get_value()
        if value is None:
            raise InvalidArgument(f"PipelineOutputResource: environment variable {raw} is not set")
        return str(value)
    return str(raw)


def resource_of(context: Any) -> PipelineOutputResource | None:
    """The `PipelineOutputResource` bound to `context`'s step, sensor or hook (None when the
    definition did not require it, or the context has no resources)."""
    try:
        resources = context.resources
    except (dg.DagsterInvariantViolationError, AttributeError):
        return None
    value = getattr(resources, RESOURCE_KEY, None)
    return value if isinstance(value, PipelineOutputResource) else None


def runtime_of(context: Any) -> Runtime:
    """The runtime of the code location `context` runs in: its `PipelineOutputResource`, else the
    zero-config default (the environment)."""
    resource = resource_of(context)
    return resource.runtime() if resource is not None else get_runtime()


def runtime_of_definitions(resources: Mapping[str, Any] | None) -> Runtime:
    """The runtime of a code location from its bound resources (the CLI's headless runs)."""
    resource = (resources or {}).get(RESOURCE_KEY)
    if isinstance(resource, PipelineOutputResource):
        return resource.runtime()
    return get_runtime()
