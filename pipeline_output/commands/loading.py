"""Which code location a command serves, and loading its `dagster.Definitions`.

Owns the code-location options every command that needs datasets shares (`code_location_options`:
`-m/--module`, `-f/--python-file`, `-w/--workspace`, `-a/--attribute`, as `dagster` takes them)
and their precedence, first match wins:

1. the command line (`-m`, `-f` or `-w`);
2. `PIPELINE_OUTPUT_DEFINITIONS` (`module:attribute` or `module`, read by `settings`);
3. the nearest `pyproject.toml` from the working directory up: `[tool.dagster] module_name`
   (+ `attribute`, `working_directory`), else `[tool.dg.project] root_module` (its
   `code_location_target_module`, default `<root_module>.definitions`, imported from `src/` when
   the project has one, as `dg` does);
4. the demo (`pipeline_output.definitions:defs`).

`-a/--attribute` names the attribute of the module (or file) chosen by 1-3: with `-m`/`-f`, or
alone for the module `PIPELINE_OUTPUT_DEFINITIONS` or the pyproject names (`-w` and the demo
take none).

As `dagster` does, the working directory (or the location's `working_directory`) is put first on
`sys.path`, so a module beside the user's project imports without installing it. Without an
attribute, a module attribute `defs` holding a `Definitions` or a `@dg.definitions` function is
taken, else what `dagster` itself discovers (`dagster._core.workspace.autodiscovery`): the
module's only `@dg.definitions` function, else its only `Definitions`. A `@dg.definitions`
function (in dagster 1.13 a `LazyDefinitions` object, not a `Definitions`) is called once, when
the location loads; the `load_from_defs_folder(path_within_project=...)` it usually returns finds
the project from the module's own path, whatever the working directory.

Each location also carries the name Dagster shows it under (`location_name`, used by `dev`): a dg
project's location is named as `dg dev` names it — `[tool.dg.project] code_location_name`, else
the name of the directory holding its `pyproject.toml` (`DgContext.code_location_name` in
dagster-dg-core) — also when `-m` or `PIPELINE_OUTPUT_DEFINITIONS` name a module of that project's
`root_module`; any other name makes `load_from_defs_folder` warn that the project's name "does not
match". `[tool.dagster] code_location_name` and a workspace entry's `location_name` are kept, as
`dagster dev` keeps them; anything else is left to Dagster (the module, or the file's name).
A workspace with several locations loads each and merges them (`Definitions.merge`). A location
is validated as `dagster` validates it (`Definitions.validate_loadable`): what Dagster would refuse
(a duplicate asset key, a job over unknown assets, ...) fails when it loads, in one line.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import InvalidArgument, UnknownDataset
from pipeline_output.services.runtime import Runtime

DEFINITIONS = "pipeline_output.definitions:defs"
_DEMO_MODULE = "pipeline_output.definitions"
_META = "pipeline_output.code_location"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CodeLocation:
    """One code location: a module or a Python file, its attribute, where it was chosen."""

    module: str | None = None
    python_file: Path | None = None
    attribute: str | None = None
    working_directory: Path | None = None
    source: str = "demo"
    location_name: str | None = None

    @property
    def is_demo(self) -> bool:
        return self.python_file is None and self.module == _DEMO_MODULE

    def describe(self) -> str:
        target = str(self.python_file) if self.python_file is not None else str(self.module)
        return f"{target}:{self.attribute}" if self.attribute else target


DEMO = CodeLocation(module=_DEMO_MODULE, attribute="defs", source="demo")


def code_location_options(command: F) -> F:
    """Add `-m/--module`, `-f/--python-file`, `-w/--workspace`, `-a/--attribute` to `command`;
    the choice is kept on the click context for `load_definitions` / `dataset_specs`."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        module: str | None,
        python_file: str | None,
        workspace: str | None,
        attribute: str | None,
        **kwargs: Any,
    ) -> Any:
        locations = resolve_locations(
            module=module, python_file=python_file, workspace=workspace, attribute=attribute
        )
        click.get_current_context().meta[_META] = locations
        return command(*args, **kwargs)

    options = [
        click.option(
            "-m",
            "--module",
            "module",
            default=None,
            help="Python module of the code location (like `dagster -m`).",
        ),
        click.option(
            "-f",
            "--python-file",
            "python_file",
            default=None,
            help="Python file of the code location (like `dagster -f`).",
        ),
        click.option(
            "-w",
            "--workspace",
            "workspace",
            default=None,
            help="A Dagster workspace.yaml; every location in it is loaded.",
        ),
        click.option(
            "-a",
            "--attribute",
            "attribute",
            default=None,
            help="Attribute of -m/-f holding the Definitions (default: `defs`).",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def resolve_locations(
    *,
    module: str | None = None,
    python_file: str | None = None,
    workspace: str | None = None,
    attribute: str | None = None,
    cwd: Path | None = None,
) -> tuple[CodeLocation, ...]:
    """The code locations a command serves, by the precedence in the module docstring."""
    from pipeline_output.infra.settings import definitions_target

    here = (cwd or Path.cwd()).resolve()
    chosen = [o for o, v in (("-m", module), ("-f", python_file), ("-w", workspace)) if v]
    if len(chosen) > 1:
        raise InvalidArgument(f"give one of -m, -f, -w (got {', '.join(chosen)})")
    if attribute and workspace:
        raise InvalidArgument("-a names the attribute of -m or -f; a workspace names its own")
    if module:
        return (
            CodeLocation(
                module=module,
                attribute=attribute,
                working_directory=here,
                source="-m",
                location_name=_dg_location_name(here, module),
            ),
        )
    if python_file:
        path = (here / python_file).resolve()
        if not path.is_file():
            raise InvalidArgument(f"-f {python_file}: no such file")
        return (
            CodeLocation(
                python_file=path, attribute=attribute, working_directory=path.parent, source="-f"
            ),
        )
    if workspace:
        return _workspace(Path(workspace) if Path(workspace).is_absolute() else here / workspace)
    target = definitions_target()
    found: CodeLocation | None
    if target is not None:
        mod, _, attr = target.partition(":")
        found = CodeLocation(
            module=mod,
            attribute=attr or None,
            working_directory=here,
            source="PIPELINE_OUTPUT_DEFINITIONS",
            location_name=_dg_location_name(here, mod),
        )
    else:
        found = _from_pyproject(here)
    if attribute:
        if found is None:
            raise InvalidArgument(
                "-a needs a module: give -m or -f, PIPELINE_OUTPUT_DEFINITIONS, or run from a "
                "project whose pyproject.toml names one"
            )
        found = replace(found, attribute=attribute, source=f"{found.source}, -a")
    return (found,) if found is not None else (DEMO,)


def _nearest_pyproject(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest `pyproject.toml` from `start` up and its `[tool]` table."""
    for folder in (start, *start.parents):
        path = folder / "pyproject.toml"
        if not path.is_file():
            continue
        try:
            tool = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"{path}: not readable TOML ({exc})") from exc
        return path, tool if isinstance(tool, dict) else {}
    return None


def _dg_name(path: Path, project: dict[str, Any]) -> str:
    """A dg project's code location name, as `dg dev` computes it."""
    return str(project.get("code_location_name") or path.parent.name)


def _dg_location_name(start: Path, module: str) -> str | None:
    """The dg project's location name when `module` belongs to the nearest pyproject's dg
    project (its `root_module` or below), else None (Dagster's own default name)."""
    found = _nearest_pyproject(start)
    if found is None:
        return None
    path, tool = found
    project = (tool.get("dg") or {}).get("project") or {}
    root = str(project.get("root_module") or "")
    if root and (module == root or module.startswith(f"{root}.")):
        return _dg_name(path, project)
    return None


def _from_pyproject(start: Path) -> CodeLocation | None:
    found = _nearest_pyproject(start)
    if found is None:
        return None
    path = found[0]
    folder = path.parent
    tool = found[1]
    dagster = tool.get("dagster") or {}
    project = (tool.get("dg") or {}).get("project") or {}
    workdir = folder / str(dagster.get("working_directory", "."))
    if dagster.get("module_name"):
        return CodeLocation(
            module=str(dagster["module_name"]),
            attribute=dagster.get("attribute"),
            working_directory=workdir,
            source=f"{path} [tool.dagster]",
            location_name=dagster.get("code_location_name"),
        )
    if project.get("root_module"):
        target = project.get("code_location_target_module") or (
            f"{project['root_module']}.definitions"
        )
        src = folder / "src"
        return CodeLocation(
            module=str(target),
            working_directory=src if src.is_dir() else folder,
            source=f"{path} [tool.dg.project]",
            location_name=_dg_name(path, project),
        )
    return None  # the nearest pyproject.toml decides, as for dagster


def _workspace(path: Path) -> tuple[CodeLocation, ...]:
    import yaml  # type: ignore[import-untyped]  # PyYAML, as dagster reads workspace.yaml

    if not path.is_file():
        raise InvalidArgument(f"-w {path}: no such file")
    try:
        entries = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("load_from")
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise InvalidArgument(f"-w {path}: not a Dagster workspace ({exc})") from exc
    if not isinstance(entries, list) or not entries:
        raise InvalidArgument(f"-w {path}: no `load_from` entries")
    out = []
    for entry in entries:
        kind, value = next(iter(entry.items())) if isinstance(entry, dict) and entry else ("", None)
        spec = value if isinstance(value, dict) else {}
        workdir = path.parent / str(spec.get("working_directory", "."))
        if kind == "python_module":
            name = value if isinstance(value, str) else spec.get("module_name")
            if name:
                out.append(
                    CodeLocation(
                        module=str(name),
                        attribute=spec.get("attribute"),
                        working_directory=workdir,
                        source=f"-w {path}",
                        location_name=spec.get("location_name"),
                    )
                )
                continue
        if kind == "python_file":
            rel = value if isinstance(value, str) else spec.get("relative_path")
            if rel:
                file = (path.parent / str(rel)).resolve()
                out.append(
                    CodeLocation(
                        python_file=file,
                        attribute=spec.get("attribute"),
                        working_directory=workdir if "working_directory" in spec else file.parent,
                        source=f"-w {path}",
                        location_name=spec.get("location_name"),
                    )
                )
                continue
        raise InvalidArgument(
            f"-w {path}: unsupported entry {entry!r} (python_module or python_file)"
        )
    return tuple(out)


def current_locations() -> tuple[CodeLocation, ...]:
    """The locations the running command chose (resolved now when it took no options)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        for c in (ctx, *_parents(ctx)):
            if _META in c.meta:
                return tuple(c.meta[_META])
    return resolve_locations()


def _parents(ctx: click.Context) -> list[click.Context]:
    out = []
    while ctx.parent is not None:
        ctx = ctx.parent
        out.append(ctx)
    return out


@functools.lru_cache(maxsize=8)
def _load(location: CodeLocation) -> Any:
    import dagster as dg

    if location.working_directory is not None:
        workdir = str(location.working_directory)
        if workdir not in sys.path:
            sys.path.insert(0, workdir)
    where = location.describe()
    if location.python_file is not None:
        name = f"__pipeline_output_location_{location.python_file.stem}"
        spec = importlib.util.spec_from_file_location(name, location.python_file)
        if spec is None or spec.loader is None:
            raise InvalidArgument(f"code location {where}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        assert location.module is not None
        try:
            module = importlib.import_module(location.module)
        except ModuleNotFoundError as exc:
            raise InvalidArgument(
                f"code location {where} (from {location.source}): module {exc.name!r} not found "
                f"(working directory {location.working_directory})"
            ) from exc
    found = _definitions_of(module, location)
    if not isinstance(found, dg.Definitions) and callable(found):
        try:  # a `@dg.definitions` function (or a plain function returning Definitions)
            found = found()
        except dg.DagsterError as exc:
            message = " ".join(str(exc).split())
            raise InvalidArgument(f"code location {where} does not load: {message}") from exc
    if not isinstance(found, dg.Definitions):
        raise InvalidArgument(
            f"code location {where}: {type(found).__name__} is not a dagster Definitions"
        )
    try:  # what `dagster dev` would refuse, refused here when the location loads, in one line
        dg.Definitions.validate_loadable(found)
    except dg.DagsterError as exc:
        message = " ".join(str(exc).split())
        raise InvalidArgument(f"code location {where} does not load: {message}") from exc
    return found


def _definitions_of(module: Any, location: CodeLocation) -> Any:
    """The attribute of `module` holding the location's definitions: `-a`'s, else `defs`, else
    the only `@dg.definitions` function, else the only `Definitions` (as dagster discovers)."""
    import dagster as dg
    from dagster.components.definitions import LazyDefinitions

    where = location.describe()
    loadable = (dg.Definitions, LazyDefinitions)
    if location.attribute:
        if not hasattr(module, location.attribute):
            raise InvalidArgument(f"code location {where}: no attribute {location.attribute!r}")
        return getattr(module, location.attribute)
    if isinstance(getattr(module, "defs", None), loadable):
        return module.defs
    for kind, label in ((LazyDefinitions, "@dg.definitions functions"), (dg.Definitions, "")):
        named = {id(v): n for n, v in vars(module).items() if isinstance(v, kind)}
        if len(named) == 1:
            return getattr(module, next(iter(named.values())))
        if len(named) > 1:
            raise InvalidArgument(
                f"code location {where}: {len(named)} {label or 'Definitions objects'} at module "
                f"level ({', '.join(sorted(named.values()))}); name one with -a/--attribute"
            )
    raise InvalidArgument(
        f"code location {where}: no Definitions object or @dg.definitions function at module "
        "level; name the attribute with -a/--attribute"
    )


def load_definitions() -> Any:
    """The chosen code location's `dagster.Definitions` (several: merged)."""
    import dagster as dg

    loaded = [_load(location) for location in current_locations()]
    return loaded[0] if len(loaded) == 1 else dg.Definitions.merge(*loaded)


def runs_demo() -> bool:
    """Whether the command serves the demo (only then may it seed the demo shop)."""
    return all(location.is_demo for location in current_locations())


def dataset_specs() -> dict[str, DatasetSpec]:
    """Every dataset (and model node) of the chosen code location, by name."""
    from pipeline_output.dagster_layer.dataset import spec_of

    out = {}
    for asset in load_definitions().assets or []:
        spec = spec_of(asset) if hasattr(asset, "metadata_by_key") else None
        if spec is not None:
            out[spec.name] = spec
    return out


def source_specs() -> dict[str, Any]:
    """Every source (`postgres_source`, `iceberg_source`) of the chosen code location, by name."""
    from pipeline_output.dagster_layer.source_assets import source_spec_of

    found = (source_spec_of(asset) for asset in load_definitions().assets or [])
    return {source.name: source for source in found if source is not None}


def spec_named(dataset: str) -> DatasetSpec:
    """The dataset named `dataset`, or `UnknownDataset` listing the known ones and the location."""
    specs = dataset_specs()
    if dataset not in specs:
        where = ", ".join(f"{x.describe()} (from {x.source})" for x in current_locations())
        raise UnknownDataset(
            f"unknown dataset {dataset!r} in code location {where}; "
            f"known datasets: {', '.join(sorted(specs)) or '(none)'}"
        )
    return specs[dataset]


def location_runtime() -> Runtime:
    """The runtime of the chosen code location: its `PipelineOutputResource` (a configured one
    names the control plane and catalog itself), else the environment's settings."""
    from pipeline_output.dagster_layer.resource import runtime_of_definitions

    return runtime_of_definitions(load_definitions().resources)
