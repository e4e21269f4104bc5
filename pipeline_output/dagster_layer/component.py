"""`PipelineOutputComponent`: pipeline-output datasets as a `dg` Component (`defs.yaml`).

`dg scaffold defs pipeline_output.PipelineOutputComponent <name>` writes `defs/<name>/defs.yaml`
and, when the module it names (default `<root_module>.datasets`) does not exist yet in the project,
that module with one working example `@dataset` for the user to edit, so `dg check defs` and `dg
launch` work right after scaffolding (a module that still cannot be found when the location loads
is one line naming it and the file to create). Its attributes are `module:` (the Python module — or
a list of modules — holding the `@dataset`s, sources, model nodes and any other definitions to
serve with them) and what `build_definitions` takes: where the datasets live (`namespace`,
`default_mode`, `dual_reads_from`, and `pg_url` + `catalog` for a configured
`PipelineOutputResource`: values, `{{ env.NAME }}` templates resolved when the location loads, or
`{env: NAME}` — a `dg.EnvVar` read when a run needs it, and never shown in the UI), the executor,
the sensors' interval, the parity checks, and table maintenance (the `maintenance` options,
`maintenance_schedule_cron`/`_running`, `maintenance_sensor_running`/`_interval_seconds`,
`health_thresholds`), and `asset_options`: Dagster's own asset options
(`asset_params.AssetOptions`: `group`, `pool`, …) for every dataset, model node and source of the
modules that does not set them.

Attributes given in `defs.yaml` win over environment variables (`namespace:` over
`PIPELINE_OUTPUT_NAMESPACE`, …). One Component per project: it owns the location's IO manager,
resource, jobs and maintenance schedule (several modules go in one `module:` list).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,  # what define_asset_job returns (not exported by dagster)
)
from pydantic import ConfigDict, Field

from pipeline_output.dagster_layer.asset_params import AssetOptions, with_defaults
from pipeline_output.dagster_layer.build import build_definitions
from pipeline_output.dagster_layer.dataset import spec_of
from pipeline_output.dagster_layer.maintenance_job import MaintenanceSettings
from pipeline_output.dagster_layer.resource import PipelineOutputResource
from pipeline_output.dagster_layer.source_assets import source_spec_of
from pipeline_output.errors import InvalidArgument
from pipeline_output.stores.iceberg.maintenance.health import HealthThresholds


class EnvRef(dg.Model):
    """`{env: NAME}`: the value of an environment variable, read when a run needs it
    (a `dg.EnvVar`: the UI shows the variable's name, never its value)."""

    env: str


class MaintenanceAttributes(MaintenanceSettings, dg.Model):
    """Defaults of the `table_maintenance` job (the same names as its run config)."""


class HealthAttributes(dg.Model):
    """Past these the `table_health` check warns."""

    max_small_files: int = HealthThresholds.max_small_files
    max_small_file_ratio: float = HealthThresholds.max_small_file_ratio
    max_delete_files: int = HealthThresholds.max_delete_files
    max_snapshots: int = HealthThresholds.max_snapshots
    max_metadata_bytes: int = HealthThresholds.max_metadata_bytes

    def thresholds(self) -> HealthThresholds:
        return HealthThresholds(**self.model_dump())


class ScaffoldParams(dg.Model):
    """`dg scaffold defs pipeline_output.PipelineOutputComponent <name> [--module M]`."""

    module: str | None = Field(
        default=None,
        description="The module holding the @datasets (default: <root_module>.datasets).",
    )


class PipelineOutputScaffolder(dg.Scaffolder[ScaffoldParams]):
    """Writes `defs.yaml` with `module:` and the other attributes commented out."""

    @classmethod
    def get_scaffold_params(cls) -> type[ScaffoldParams]:
        return ScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[ScaffoldParams]) -> None:
        module = request.params.module if request.params else None
        module = module or f"{_root_module(request.project_root)}.datasets"
        _scaffold_module(request.project_root, module)
        if request.scaffold_format != "yaml":
            dg.scaffold_component(request, {"module": module})
            return
        text = _DEFS_YAML.format(type=request.type_name, module=module)
        (request.target_path / "defs.yaml").write_text(text)


_DEFS_YAML = """\
type: {type}

attributes:
  # the module (or a list of modules) holding your @datasets, sources and model nodes
  module: {module}
  # Where the datasets live. Left out: the environment's settings (PIPELINE_OUTPUT_*, pyiceberg's
  # config, an embedded Postgres). `pg_url` with `catalog`: nothing is read from the environment.
  # namespace: datasets
  # default_mode: iceberg
  # pg_url: {{env: CONTROL_PLANE_URL}}
  # catalog:
  #   type: sql
  #   uri: {{env: CATALOG_URI}}
  #   warehouse: file:///srv/warehouse
  # executor: in_process
  # maintenance_schedule_cron: "0 3 * * *"
  # maintenance_schedule_running: false
  # maintenance_sensor_running: false  # maintenance of tables past their health thresholds
  # health_thresholds:
  #   max_snapshots: 500
"""


_DATASETS_PY = '''\
"""The datasets of this project's PipelineOutputComponent (its defs.yaml names this module).

Each `@dataset` is a Dagster asset pipeline-output writes: the compute returns the rows (a polars,
pandas or Arrow frame); its parameters are the assets it reads (other datasets, or sources such as
`postgres_source(...)` declared here too). Edit this example or replace it with your own.
"""

import polars as pl

from pipeline_output import dataset


@dataset(primary_key="id", mode="iceberg")
def example() -> pl.DataFrame:
    """An example dataset (replace it): three rows; re-deploys upsert by `id`."""
    return pl.DataFrame({"id": [1, 2, 3], "name": ["a", "b", "c"]})
'''


def _module_file(project_root: Path, module: str) -> Path:
    """Where `module` lives in the project: under `src/` when it has one (as `dg` looks)."""
    base = project_root / "src" if (project_root / "src").is_dir() else project_root
    return base.joinpath(*module.split("."))


def _scaffold_module(project_root: Path | None, module: str) -> None:
    """Write `module` with an example dataset when its package is in the project and the module
    is not (neither `<name>.py` nor a package `<name>/`); never overwrite anything."""
    if project_root is None or "." not in module:
        return
    path = _module_file(Path(project_root), module)
    target = path.with_suffix(".py")
    if (path.parent / "__init__.py").is_file() and not target.exists() and not path.exists():
        target.write_text(_DATASETS_PY)


def _root_module(project_root: Any) -> str:
    """The dg project's `root_module` (pyproject `[tool.dg.project]`), else `my_project`."""
    import tomllib

    if project_root is None:
        return "my_project"
    pyproject = Path(project_root) / "pyproject.toml"
    if not pyproject.exists():
        return "my_project"
    data = tomllib.loads(pyproject.read_text())
    root = data.get("tool", {}).get("dg", {}).get("project", {}).get("root_module")
    return str(root) if root else "my_project"


@dg.scaffold_with(PipelineOutputScaffolder)
class PipelineOutputComponent(dg.Component, dg.Model, dg.Resolvable):
    """pipeline-output datasets (with their sources, model nodes, checks) from Python modules,
    written to Iceberg and the legacy Postgres arm by the pipeline-output IO manager."""

    module: str | list[str] = Field(
        description="The module (or list of modules) holding the @datasets, sources, model "
        "nodes and any other definitions to serve with them."
    )
    namespace: str | None = Field(
        default=None, description="Iceberg namespace (wins over PIPELINE_OUTPUT_NAMESPACE)."
    )
    default_mode: Literal["pg", "iceberg", "dual"] | None = Field(
        default=None, description="Mode of a dataset declared without one (default pg)."
    )
    dual_reads_from: Literal["pg", "iceberg"] | None = None
    pg_url: str | EnvRef | None = Field(
        default=None,
        description="Control-plane Postgres (libpq URI); with `catalog`, nothing is read from "
        "PIPELINE_OUTPUT_*/PYICEBERG_* variables.",
    )
    catalog: dict[str, str | EnvRef] | None = Field(
        default=None, description="pyiceberg catalog properties (any catalog type)."
    )
    catalog_name: str = "default"
    executor: Literal["in_process", "multiprocess"] | None = Field(
        default=None,
        description="Dagster's executor for the location's runs (default: in_process).",
    )
    max_concurrent: int | None = Field(
        default=None, description="multiprocess: the most steps running at once."
    )
    sensor_interval_seconds: int = 30
    with_parity_checks: bool = True
    with_maintenance: bool = True
    maintenance: MaintenanceAttributes | None = None
    maintenance_schedule_cron: str = "0 3 * * *"
    maintenance_schedule_running: bool = False
    maintenance_sensor_running: bool = False
    maintenance_sensor_interval_seconds: int = 600
    health_thresholds: HealthAttributes | None = None
    asset_options: AssetOptions | None = Field(
        default=None,
        description="Dagster's own asset options (group, owners, tags, kinds, pool, "
        "retry_policy, …) for the datasets, model nodes and sources of `module:` that do not "
        "set them (tags and metadata merged; key_prefix moves their reads among them too).",
    )

    # `asset_options` holds Dagster objects (an automation condition, a retry policy, …)
    model_config = ConfigDict(**dg.Model.model_config, arbitrary_types_allowed=True)

    def resource(self) -> PipelineOutputResource:
        """The location's `PipelineOutputResource` from these attributes."""
        return PipelineOutputResource(
            pg_url=_env_value(self.pg_url),
            catalog=(
                None
                if self.catalog is None
                else {k: _env_value(v) for k, v in self.catalog.items()}  # type: ignore[misc]
            ),
            namespace=self.namespace,
            catalog_name=self.catalog_name,
            default_mode=self.default_mode,
            dual_reads_from=self.dual_reads_from,
        )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        modules = [self.module] if isinstance(self.module, str) else list(self.module)
        # datasets=, sources=, assets=, ... by kind, and the attributes passed as they are
        found = collect(modules)
        if self.asset_options is not None:
            found = with_asset_options(found, self.asset_options)
        as_named: dict[str, Any] = {
            **found,
            **self.model_dump(include=_PASSED_AS_THEY_ARE),
        }
        return build_definitions(
            **as_named,
            resource=self.resource(),
            executor=self._executor(),
            maintenance=self.maintenance.options() if self.maintenance else None,
            health_thresholds=(
                self.health_thresholds.thresholds() if self.health_thresholds else None
            ),
        )

    def _executor(self) -> Any:
        if self.executor == "in_process":
            return dg.in_process_executor
        if self.executor == "multiprocess" or self.max_concurrent is not None:
            if self.max_concurrent is None:
                return dg.multiprocess_executor
            return dg.multiprocess_executor.configured({"max_concurrent": self.max_concurrent})
        return None


# the attributes `build_definitions` takes under the same names, as they are
_PASSED_AS_THEY_ARE = {
    "sensor_interval_seconds",
    "with_parity_checks",
    "with_maintenance",
    "maintenance_schedule_cron",
    "maintenance_schedule_running",
    "maintenance_sensor_running",
    "maintenance_sensor_interval_seconds",
}


def _env_value(value: str | EnvRef | None) -> str | None:
    if isinstance(value, EnvRef):
        return dg.EnvVar(value.env)
    return value


def collect(modules: Sequence[str]) -> dict[str, list[Any]]:
    """The definitions the modules hold, by kind (each object once, in module order)."""
    found: dict[str, list[Any]] = {
        k: []
        for k in ("datasets", "sources", "assets", "asset_checks", "sensors", "schedules", "jobs")
    }
    seen: set[int] = set()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
                raise InvalidArgument(  # the module itself is missing: say what to create
                    f"PipelineOutputComponent: module {name!r} not found; create "
                    f"{'/'.join(name.split('.'))}.py with your @datasets (or name another "
                    "module in defs.yaml's `module:`)"
                ) from None
            raise InvalidArgument(
                f"PipelineOutputComponent: module {name!r} cannot be imported: {exc}"
            ) from exc
        except ImportError as exc:
            raise InvalidArgument(
                f"PipelineOutputComponent: module {name!r} cannot be imported: {exc}"
            ) from exc
        for value in vars(module).values():
            if id(value) in seen:
                continue
            kind = _kind(value)
            if kind is not None:
                seen.add(id(value))
                found[kind].append(value)
    if not found["datasets"] and not found["assets"]:
        raise InvalidArgument(
            f"PipelineOutputComponent: no @dataset in {', '.join(modules)}; `module:` names the "
            "module(s) where the datasets are declared"
        )
    return found


def with_asset_options(found: dict[str, list[Any]], defaults: AssetOptions) -> dict[str, list[Any]]:
    """The definitions `collect` found, each asset pipeline-output built made again with
    `defaults` for the options it was not given (`asset_params.with_defaults`); an asset whose
    key moved (`key_prefix`) is read under its new key by the others."""
    built = {kind: [with_defaults(a, defaults) for a in items] for kind, items in found.items()}
    moved = {
        old.key: new.key
        for kind, items in found.items()
        for old, new in zip(items, built[kind], strict=True)
        if new is not old and isinstance(old, dg.AssetsDefinition) and old.key != new.key
    }
    if not moved:
        return built

    def follow(asset: Any) -> Any:
        if not isinstance(asset, dg.AssetsDefinition):
            return asset
        reads = {up for deps in asset.asset_deps.values() for up in deps}
        if reads.isdisjoint(moved):
            return asset
        return asset.with_attributes(asset_key_replacements=moved)

    return {kind: [follow(a) for a in items] for kind, items in built.items()}


def _kind(value: Any) -> str | None:
    if isinstance(value, dg.AssetChecksDefinition):
        return "asset_checks"
    if isinstance(value, (dg.AssetsDefinition, dg.SourceAsset)):
        if source_spec_of(value) is not None:
            return "sources"
        if isinstance(value, dg.AssetsDefinition) and spec_of(value) is not None:
            is_model = any("model_source" in m for m in value.metadata_by_key.values())
            return "assets" if is_model else "datasets"
        return "assets"
    if isinstance(value, dg.AssetSpec):
        return "assets"
    if isinstance(value, dg.SensorDefinition):
        return "sensors"
    if isinstance(value, dg.ScheduleDefinition):
        return "schedules"
    if isinstance(value, (dg.JobDefinition, UnresolvedAssetJobDefinition)):
        return "jobs"
    return None
