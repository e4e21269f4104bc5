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

A configured resource's mistakes are one line naming the field, and its variable when the field
is a `dg.EnvVar` (`HELPDESK_PG (PipelineOutputResource.pg_url): ...`), in the CLI and inside a
Dagster run alike (a run's resource holds the resolved values: the names are recalled from the
definitions the run's process loaded, `_ENV_FIELDS`). A database that refuses the URL (no such
database or role, authentication failed) is a `SettingsError`, a server that is down
`PostgresUnavailable` (retryable). The catalog is opened on exactly `catalog`'s properties
(stores/iceberg/table/catalog.py `open_catalog`): no `PYICEBERG_*` variable reaches it.

The per-process runtimes of the Dagster layer and the CLI: `runtime.connect` built once per
configuration and cached for the process.

`get_runtime()` is the zero-config default: the settings (control plane, catalog, namespace,
default mode, the arm `dual` reads from) read from the environment when it is first called (never
at import time), with optional overrides (a Component's `namespace:` wins over
`PIPELINE_OUTPUT_NAMESPACE`). `cached_runtime(key, build)` caches any other runtime — the one a
`PipelineOutputResource` describes (`resource.py`) — so Dagster's run workers, the CLI and tests
each connect once per configuration.

`freeze_long_lived` moves what the process holds into the collector's permanent generation
(`gc.freeze()`), once when the definitions are built and once when the runtime is: the imported
libraries (Dagster, pyiceberg, pyarrow, polars, SQLAlchemy ...) are several hundred thousand
objects that live as long as the process, and every full garbage collection — during a run, and
the ones the interpreter runs at exit — walked them all: in a window run's worker process about
0.8 CPU-s of ~4.5 (benchmarks/results/cadence.md). Objects created later
are collected as usual. Before that, the first use of the public API imports the libraries with
the collector paused and freezes them too (`infra/collector.py`).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import suppress
from typing import Any, TypeVar, cast

import dagster as dg
from pydantic import Field

from pipeline_output.contract.spec import ARMS, MODES
from pipeline_output.errors import InvalidArgument, PipelineOutputError
from pipeline_output.infra.collector import imports_paused
from pipeline_output.infra.settings import (
    Settings,
    check_control_plane,
    check_libpq_url,
    check_namespace,
    default_mode,
    dual_read_arm,
    get_settings,
    validate_catalog_properties,
    variable,
)
from pipeline_output.services.runtime import Runtime, connect
from pipeline_output.stores.iceberg.table.catalog import open_catalog

_lock = threading.Lock()  # guards `_cache` and `_building`
_build_lock = threading.Lock()  # one runtime build at a time in the process
_cache: dict[str, Runtime] = {}
_building: dict[str, Future[Runtime]] = {}  # the build in flight per key, shared by its waiters
_frozen: set[str] = set()
_warming: set[int] = set()  # the processes (pids) whose runtime was warmed up
_warm_lock = threading.Lock()  # not `_lock`: a build in progress holds that one


INSTANCE_MODULES = (
    *("dagster._core.launcher", "dagster._core.run_coordinator", "dagster._core.scheduler"),
    *("dagster._core.secrets", "dagster._core.storage.compute_log_manager"),
    *("dagster._core.storage.defs_state", "dagster._core.storage.event_log"),
    *(
        "dagster._core.storage.root",
        "dagster._core.storage.runs",
        "dagster._core.storage.schedules",
    ),
)
"""The modules `dg.DagsterInstance.__init__` imports, whatever the instance's storage (Dagster
1.13): the run, event-log and schedule storages with SQLAlchemy, alembic and their templates —
~390 modules, ~54,000 objects the collector tracks."""


def freeze_long_lived(stage: str) -> None:
    """`gc.freeze()` once per process and `stage` (`definitions`, `runtime`): what the process
    holds now lives as long as it does, so no garbage collection walks it again. With the
    definitions, the modules every Dagster instance imports (`INSTANCE_MODULES`) are imported
    first, with the collector paused: the process will run the location's assets, and a
    deployed run worker opens its instance before it loads the code location; a process that
    loads the location first (`dg.materialize`, `execute_in_process`, a test) imported them
    with its first instance, after the freeze — tens of thousands of objects that the first
    full collection then walked, ~15-40 ms of CPU early in its first run
    (benchmarks/results/small-writes.md, "A fresh process's first run without a full
    collection")."""
    with _lock:
        if stage in _frozen:
            return
        _frozen.add(stage)
    if stage == "definitions":
        with imports_paused():  # frozen at its end
            for name in INSTANCE_MODULES:
                with suppress(ImportError):  # another Dagster's layout: imported when used
                    importlib.import_module(name)
    gc.freeze()


def get_runtime(
    settings: Settings | None = None,
    *,
    namespace: str | None = None,
    mode: str | None = None,
    dual_reads_from: str | None = None,
) -> Runtime:
    """The runtime for `settings` (default: the environment now), built once per process; a given
    `namespace`, default `mode` or `dual_reads_from` wins over the environment's."""
    return cached_runtime(*_default_runtime(settings, namespace, mode, dual_reads_from))


def _default_runtime(
    settings: Settings | None,
    namespace: str | None,
    mode: str | None,
    dual_reads_from: str | None,
) -> tuple[str, Callable[[], Runtime]]:
    """`get_runtime`'s cache key and how to build it."""
    settings = settings or get_settings()
    if namespace is not None:
        check_namespace(namespace, setting="namespace")
        settings = dataclasses.replace(settings, namespace=namespace)
    project_mode = mode or default_mode()
    dual = dual_reads_from or dual_read_arm()
    key = repr(("settings", settings, project_mode, dual))

    def build() -> Runtime:
        # the catalog's opening probe also asks whether the namespace exists (a SQL catalog
        # handle then remembers it: `connect`'s check of it costs no second round trip)
        catalog = open_catalog(
            settings.catalog_name,
            settings.catalog_properties(),
            namespace=settings.namespace,
            where=settings.catalog_setting,
        )
        return connect(
            pg_url=settings.control_plane_url(),
            catalog=catalog,
            namespace=settings.namespace,
            catalog_name=settings.catalog_name,
            default_mode=project_mode,  # type: ignore[arg-type]
            dual_reads_from=dual,  # type: ignore[arg-type]
        )

    return key, build


def cached_runtime(key: str, build: Callable[[], Runtime]) -> Runtime:
    """The runtime cached under `key` in this process, built by `build` on first use. A caller
    arriving while another thread builds it (the warm-up a step's start began) waits for that
    build and takes its outcome — its runtime, or its error — instead of building again: a
    control plane that does not answer costs one connect timeout, not one per caller. A failed
    build is not remembered: the next caller builds again."""
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            return cached
        pending = _building.get(key)
        owner = pending is None
        if pending is None:
            pending = _building[key] = Future()
    if not owner:
        return pending.result()
    try:
        with _build_lock:
            runtime = build()
    except BaseException as exc:
        with _lock:
            del _building[key]
        pending.set_exception(exc)
        raise
    with _lock:
        _cache[key] = runtime
        del _building[key]
    pending.set_result(runtime)
    freeze_long_lived("runtime")
    return runtime


def reset_runtime() -> None:
    """Forget cached runtimes (tests that change the environment call this)."""
    with _lock:
        _cache.clear()
    with _warm_lock:
        _warming.clear()


__all__ = ["Runtime", "cached_runtime", "freeze_long_lived", "get_runtime", "reset_runtime"]


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
        when the runtime is built. Also remembers which fields are `dg.EnvVar`s (`_ENV_FIELDS`):
        `build_definitions` calls this on the resource it binds, in every process that loads
        the location."""
        _remember_env_vars(self.pg_url, self.catalog)
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

    def _with_updated_values(self, values: Mapping[str, Any] | None) -> PipelineOutputResource:
        """Dagster's copy of the resource with `values` (its run config) put in: without a new
        validation when they change nothing (`unchanged_copy`)."""
        copy = unchanged_copy(self, values)
        if copy is None:
            copy = cast(PipelineOutputResource, super()._with_updated_values(values))
        return copy

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Dagster initialises the resource when a step that uses it starts: the process's
        first such step builds the runtime (control-plane session, migration check, catalog
        open) on a background thread while Dagster goes on starting the step, instead of on
        the first write's path (`warm_up`)."""
        warm_up(self)

    def runtime(self) -> Runtime:
        """The runtime this resource describes, connected once per process and configuration."""
        return cached_runtime(*self._runtime_build())

    def built_runtime(self) -> Runtime | None:
        """The runtime this resource describes if this process built it already (nothing is
        built, no connection is made; a configuration that cannot be read was never built)."""
        try:
            key, _ = self._runtime_build()
        except PipelineOutputError:
            return None
        with _lock:
            return _cache.get(key)

    def _runtime_build(self) -> tuple[str, Callable[[], Runtime]]:
        """The runtime's cache key and how to build it."""
        self.check()
        if not self.configured:
            return _default_runtime(None, self.namespace, self.default_mode, self.dual_reads_from)
        pg_url = _value(self.pg_url)
        catalog = {str(k).lower(): _value(v) for k, v in (self.catalog or {}).items()}
        namespace = self.namespace or "datasets"
        mode = self.default_mode or "pg"
        dual = self.dual_reads_from or "pg"
        key = json.dumps(
            ["resource", pg_url, catalog, namespace, self.catalog_name, mode, dual], sort_keys=True
        )

        def where(key: str) -> str:
            return self._setting("catalog", key)

        def build() -> Runtime:
            check_libpq_url(pg_url, setting=self._setting("pg_url"))
            check_control_plane(pg_url, setting=self._setting("pg_url"))
            validate_catalog_properties(self.catalog_name, catalog, where=where)
            return connect(
                pg_url=pg_url,
                catalog=open_catalog(self.catalog_name, catalog, where=where),
                namespace=namespace,
                catalog_name=self.catalog_name,
                default_mode=mode,  # type: ignore[arg-type]
                dual_reads_from=dual,  # type: ignore[arg-type]
            )

        return key, build

    def _setting(self, field: str, key: str | None = None) -> str:
        """How an error names a field (`catalog` with `key`): `PipelineOutputResource.pg_url`,
        preceded by the variable's name when the field is a `dg.EnvVar`."""
        raw: Any = self.pg_url if field == "pg_url" else (self.catalog or {}).get(key or "")
        if key is not None and raw is None:  # the user's spelling of a lowercased key
            matches = [v for k, v in (self.catalog or {}).items() if str(k).lower() == key]
            raw = matches[0] if matches else None
        label = f"PipelineOutputResource.{field}" + (f"[{key!r}]" if key is not None else "")
        name = (
            str(raw.env_var_name)
            if isinstance(raw, dg.EnvVar)
            else _env_var_of(field if key is None else f"{field}.{key}", raw)
        )
        return f"{name} ({label})" if name else label


_Resource = TypeVar("_Resource", bound="dg.ConfigurableResource[Any] | dg.ConfigurableIOManager")


def unchanged_copy(resource: _Resource, values: Mapping[str, Any] | None) -> _Resource | None:
    """A copy of `resource` with its own fields and Dagster's state for it when `values` change
    none of its fields (None: they do; Dagster constructs the copy then). Dagster 1.13 copies a
    resource several times a run, each time through `_with_updated_values` and a full
    construction — the config schema inferred again, the fields validated again (~1 ms for
    `PipelineOutputResource`): when it starts the run's copy of it, binds its nested resources,
    binds the init context and puts in the run's config, which are the values it already holds."""
    fields = type(resource).model_fields
    for name, value in (values or {}).items():
        if name not in fields:
            return None
        held = getattr(resource, name)
        if held is not value and held != value:
            return None
    copy = cast(
        _Resource,
        type(resource).model_construct(
            _fields_set=set(resource.model_fields_set),
            **{name: getattr(resource, name) for name in fields},
        ),
    )
    # the same config, schema, nested resources and init context (Dagster replaces the context
    # on the copy when it binds one)
    copy._state__internal__ = resource._state__internal__
    return copy


def warm_up(resource: PipelineOutputResource) -> None:
    """Build `resource`'s runtime on a daemon thread, once per process, when no runtime is
    built yet: its first user waits for that build (`cached_runtime` holds the lock while it
    builds) instead of starting its own. A failure is not raised there: the first use builds
    it again and raises."""
    pid = os.getpid()
    with _warm_lock:
        if _cache or pid in _warming:
            return
        _warming.add(pid)

    def build() -> None:
        with suppress(Exception):
            resource.runtime()

    threading.Thread(target=build, name="po-runtime-warm-up", daemon=True).start()


def _value(raw: Any) -> str:
    """A field's value: an `EnvVar` (outside a run Dagster has not resolved it yet) read now."""
    if isinstance(raw, dg.EnvVar):
        value = raw.get_value()
        if value is None:
            raise InvalidArgument(f"PipelineOutputResource: environment variable {raw} is not set")
        return str(value)
    return str(raw)


_ENV_FIELDS: dict[str, set[str]] = {}
"""Field (`pg_url`, `catalog.<key>`) -> the `dg.EnvVar` names it was given in this process. A run
gets the resource with the values resolved (the IO manager's nested copy has no trace of the
variable); its process built the definitions, so the names are here."""


def _remember_env_vars(pg_url: Any, catalog: Any) -> None:
    fields = [("pg_url", pg_url)]
    if isinstance(catalog, Mapping):
        fields += [(f"catalog.{str(k).lower()}", v) for k, v in catalog.items()]
    for field, value in fields:
        if isinstance(value, dg.EnvVar):
            _ENV_FIELDS.setdefault(field, set()).add(str(value.env_var_name))


def _env_var_of(field: str, value: Any) -> str | None:
    """The one variable given for `field` in this process whose value is `value` now."""
    names = [n for n in _ENV_FIELDS.get(field, ()) if variable(n) == value]
    return names[0] if len(names) == 1 else None


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


def built_runtime_of(context: Any) -> Runtime | None:
    """`runtime_of(context)` if this process built it already, else None (nothing is built)."""
    resource = resource_of(context) or PipelineOutputResource()
    return resource.built_runtime()


def bound_resource(resource: PipelineOutputResource) -> Any:
    """`resource` as `build_definitions` binds it, under `pipeline_output` and inside the IO
    manager alike: the same values as Dagster's `configure_at_launch` copy of it (a `dg.EnvVar`
    as its `{"env": ...}` config, also inside `catalog`). Bound as a plain resource, the IO
    manager's copy counts as fully configured and Dagster initialises it again for every run —
    three more constructions of the resource, its config processed again, its
    `setup_for_execution` —, where a copy bound at launch is handed the run's initialised
    top-level resource. The UI shows it as before: the same class, fields and values, the IO
    manager using `pipeline_output`."""
    given = {name: _as_config(getattr(resource, name)) for name in resource.model_fields_set}
    return PipelineOutputResource.configure_at_launch(**given)


def _as_config(value: Any) -> Any:
    """A field's value as Dagster config: a `dg.EnvVar` as `{"env": name}`, also nested."""
    if isinstance(value, dg.EnvVar):
        return {"env": str(value.env_var_name)}
    if isinstance(value, Mapping):
        return {k: _as_config(v) for k, v in value.items()}
    return value


def _from_config(value: Any) -> Any:
    """`_as_config` undone: `{"env": name}` is a `dg.EnvVar` again (a field's value, or a
    `catalog` property's, is a string otherwise, never a mapping)."""
    if isinstance(value, Mapping):
        if set(value) == {"env"}:
            return dg.EnvVar(str(value["env"]))
        return {k: _from_config(v) for k, v in value.items()}
    return value


def resource_in(value: Any) -> PipelineOutputResource | None:
    """The `PipelineOutputResource` a definitions' `pipeline_output` binding describes: the
    resource itself, or the one `bound_resource` bound (None: something else)."""
    if isinstance(value, PipelineOutputResource):
        return value
    if getattr(value, "resource_cls", None) is not PipelineOutputResource:
        return None
    data = getattr(value, "data", None) or {}
    return PipelineOutputResource(**{k: _from_config(v) for k, v in data.items()})


def names_its_catalog(resources: Mapping[str, Any] | None) -> bool:
    """Whether a code location's bound `PipelineOutputResource` names its catalog (then the
    environment's catalog config is never read for it)."""
    resource = resource_in((resources or {}).get(RESOURCE_KEY))
    return resource is not None and resource.catalog is not None


def runtime_of_definitions(resources: Mapping[str, Any] | None) -> Runtime:
    """The runtime of a code location from its bound resources (the CLI's headless runs)."""
    resource = resource_in((resources or {}).get(RESOURCE_KEY))
    if resource is not None:
        return resource.runtime()
    return get_runtime()
