"""Which code location(s) a command serves: the choice, its precedence and the location's name.

First match wins:

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

Each location also carries the name Dagster shows it under (`location_name`, used by `dev`): a dg
project's location is named as `dg dev` names it — `[tool.dg.project] code_location_name`, else
the name of the directory holding its `pyproject.toml` (`DgContext.code_location_name` in
dagster-dg-core) — also when `-m` or `PIPELINE_OUTPUT_DEFINITIONS` name a module of that project's
`root_module`; any other name makes `load_from_defs_folder` warn that the project's name "does not
match". `[tool.dagster] code_location_name` and a workspace entry's `location_name` are kept, as
`dagster dev` keeps them; anything else is left to Dagster (the module, or the file's name).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline_output.errors import InvalidArgument

_DEMO_MODULE = "pipeline_output.definitions"


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
