"""The package's shape, enforced: the pure core imports no Dagster, no basename is shared across
layers, and no module grows past 400 lines.

The Dagster layer is `dagster_layer/`, the CLI (`cli.py`, `commands/`) and the two modules that
build a code location's `Definitions` (`definitions.py`, `demo/code_location.py`). Everything else is
the core: specs, planning, windows, the stores, the ledger, publish, reads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pipeline_output

PACKAGE = Path(pipeline_output.__file__).parent
DAGSTER_LAYER = ("dagster_layer/", "commands/", "cli.py", "definitions.py", "demo/code_location.py")
MAX_LINES = 400


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_dagster_layer(relative: str) -> bool:
    return any(
        relative.startswith(prefix) if prefix.endswith("/") else relative == prefix
        for prefix in DAGSTER_LAYER
    )


def _core_modules() -> list[Path]:
    return [p for p in _modules() if not _is_dagster_layer(_relative(p))]


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_core_module_imports_dagster_or_the_dagster_layer() -> None:
    offenders = {}
    for path in _core_modules():
        if path == PACKAGE / "__init__.py":
            continue  # the facade: its Dagster-layer names load lazily (checked below)
        bad = sorted(
            name
            for name in _imported_modules(path)
            if name.split(".")[0].startswith("dagster")
            or name.startswith(("pipeline_output.dagster_layer", "pipeline_output.commands"))
            or name in ("pipeline_output.cli", "pipeline_output.definitions")
        )
        if bad:
            offenders[_relative(path)] = bad
    assert offenders == {}, f"core modules importing the Dagster layer: {offenders}"


def test_importing_every_core_module_loads_no_dagster() -> None:
    names = [
        "pipeline_output."
        + _relative(p).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for p in _core_modules()
        if _relative(p) != "__init__.py"
    ]
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))\n"
        "print(len(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "0", "importing the core loaded Dagster"
    assert len(names) > 40  # the walk found the package, not an empty directory


def test_no_basename_is_shared_across_layers() -> None:
    """A name like `delta.py` in both the core and the Dagster layer misleads readers and grep.
    The two arms' parallel modules (`stores/iceberg/store.py`, `stores/postgres/store.py`) are the
    one deliberate exception: the same role in each arm."""
    homes: defaultdict[str, list[str]] = defaultdict(list)
    for path in _modules():
        relative = _relative(path)
        if path.name == "__init__.py" or relative.startswith(
            ("stores/iceberg/", "stores/postgres/")
        ):
            continue
        homes[path.stem].append(relative)
    for path in PACKAGE.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            homes[path.name].append(f"{path.name}/")
    shared = {name: places for name, places in homes.items() if len(places) > 1}
    assert shared == {}, f"basenames shared across layers: {shared}"


def test_no_module_in_the_package_is_over_400_lines() -> None:
    long = {
        _relative(p): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"
