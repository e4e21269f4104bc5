"""The code-location options of the commands, and loading the chosen location's `Definitions`.

Owns the options every command that needs datasets shares (`code_location_options`:
`-m/--module`, `-f/--python-file`, `-w/--workspace`, `-a/--attribute`, as `dagster` takes them);
which location they choose, by which precedence and under which name, is `locations.py`.

As `dagster` does, the working directory (or the location's `working_directory`) is put first on
`sys.path`, so a module beside the user's project imports without installing it. Without an
attribute, a module attribute `defs` holding a `Definitions` or a `@dg.definitions` function is
taken, else what `dagster` itself discovers (`dagster._core.workspace.autodiscovery`): the
module's only `@dg.definitions` function, else its only `Definitions`. A `@dg.definitions`
function (in dagster 1.13 a `LazyDefinitions` object, not a `Definitions`) is called once, when
the location loads; the `load_from_defs_folder(path_within_project=...)` it usually returns finds
the project from the module's own path, whatever the working directory.
A workspace with several locations loads each and merges them (`Definitions.merge`). A location
is validated as `dagster` validates it (`Definitions.validate_loadable`): what Dagster would refuse
(a duplicate asset key, a job over unknown assets, ...) fails when it loads, in one line.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline_output.commands.locations import CodeLocation, resolve_locations
from pipeline_output.contract.spec import DatasetSpec
from pipeline_output.errors import InvalidArgument, PipelineOutputError, UnknownDataset
from pipeline_output.infra.settings import Settings
from pipeline_output.services.runtime import Runtime

DEFINITIONS = "pipeline_output.definitions:defs"
_META = "pipeline_output.code_location"

F = TypeVar("F", bound=Callable[..., Any])


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
            help="Attribute holding the Definitions (or @dg.definitions function), of -m/-f or "
            "of the module PIPELINE_OUTPUT_DEFINITIONS / pyproject.toml names (default: `defs`).",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


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
        try:
            spec.loader.exec_module(module)
        except PipelineOutputError:
            raise  # one line already, naming the dataset and the cause
        except Exception as exc:
            raise _raised_loading(where, exc) from exc
    else:
        assert location.module is not None
        try:
            module = importlib.import_module(location.module)
        except ModuleNotFoundError as exc:
            raise InvalidArgument(
                f"code location {where} (from {location.source}): module {exc.name!r} not found "
                f"(working directory {location.working_directory})"
            ) from exc
        except PipelineOutputError:
            raise  # one line already, naming the dataset and the cause
        except Exception as exc:
            raise _raised_loading(where, exc) from exc
    found = _definitions_of(module, location)
    if not isinstance(found, dg.Definitions) and callable(found):
        try:  # a `@dg.definitions` function (or a plain function returning Definitions)
            found = found()
        except PipelineOutputError:
            raise  # one line already, naming the dataset and the cause
        except Exception as exc:
            raise _raised_loading(where, exc) from exc
    if not isinstance(found, dg.Definitions):
        raise InvalidArgument(
            f"code location {where}: {type(found).__name__} is not a dagster Definitions"
        )
    try:  # what `dagster dev` would refuse, refused here when the location loads, in one line
        dg.Definitions.validate_loadable(found)
    except dg.DagsterError as exc:
        raise _does_not_load(where, exc) from exc
    return found


def _raised_loading(where: str, exc: Exception) -> PipelineOutputError:
    """The user's code raising while the location loads (its import, its `@dg.definitions`
    function, a Component building its definitions), in one line, about the cause under
    Dagster's wrappers (a Component's `ComponentTreeException` wraps what its module raised):
    our own error as it is (one line already, naming the dataset); Dagster's refusal as
    `_does_not_load` says it; anything else as the exception and the line of the user's code
    that raised it (the innermost frame outside installed packages, the standard library and
    this package)."""
    import sysconfig
    import traceback

    import dagster as dg

    chain: list[BaseException] = [exc]
    while (cause := chain[-1].__cause__) is not None and cause not in chain:
        chain.append(cause)
    ours = next((e for e in chain if isinstance(e, PipelineOutputError)), None)
    if ours is not None:
        return ours
    root = chain[-1]
    if isinstance(root, dg.DagsterError):
        return _does_not_load(where, root)
    skipped = (str(Path(__file__).resolve().parents[1]), sysconfig.get_paths()["stdlib"], "<")
    frames = [
        f
        for f in traceback.extract_tb(root.__traceback__)
        if "site-packages" not in f.filename and not f.filename.startswith(skipped)
    ]
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    message = " ".join(str(root).split())
    return InvalidArgument(
        f"code location {where} does not load: {type(root).__name__}{at}: {message}"
    )


def _does_not_load(where: str, exc: Exception) -> InvalidArgument:
    """Dagster's refusal of the location, in one line; when datasets were collected without the
    project's resources (a `@dataset` in a plain defs folder), the line says how to provide them."""
    from pipeline_output.dagster_layer.keys import IO_MANAGER_KEY
    from pipeline_output.dagster_layer.resource import RESOURCE_KEY

    message = " ".join(str(exc).split())
    if any(f"resource with key '{key}'" in message for key in (RESOURCE_KEY, IO_MANAGER_KEY)):
        message += (
            " — pipeline-output datasets need the project's resources: load their module through"
            " the Component (`dg scaffold defs pipeline_output.PipelineOutputComponent NAME`,"
            " `module:` naming it) or return `pipeline_output.build_definitions(assets=[...])`"
        )
    return InvalidArgument(f"code location {where} does not load: {message}")


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


def check_environment_catalog(settings: Settings) -> None:
    """Before a command starts anything (the embedded Postgres, a run): fail on the environment's
    malformed pyiceberg catalog config (`Settings.check_catalog`, one line naming the setting)
    unless every chosen location's `PipelineOutputResource` names its own catalog, which then is
    the only one used. Only with such a config are the definitions loaded this early."""
    if settings.catalog_error is None:
        return
    from pipeline_output.dagster_layer.resource import names_its_catalog

    for location in current_locations():
        if location.is_demo or not names_its_catalog(_load(location).resources):
            settings.check_catalog()


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


def dataset_selection(dataset: str) -> str:
    """The Dagster asset selection of the dataset named `dataset` (its key, `key_prefix` and
    all), or `UnknownDataset` as `spec_named` says it."""
    from pipeline_output.dagster_layer.dataset import spec_of

    for asset in load_definitions().assets or []:
        spec = spec_of(asset) if hasattr(asset, "metadata_by_key") else None
        if spec is not None and spec.name == dataset:
            return f'key:"{asset.key.to_user_string()}"'
    spec_named(dataset)  # raises UnknownDataset: no asset holds it
    raise AssertionError(f"{dataset!r} has a spec and no asset")


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
