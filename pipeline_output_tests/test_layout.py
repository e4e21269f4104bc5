"""The package's shape, enforced (which module owns which concept is the layout map,
docs/concepts.md, "Where each concept lives", checked by test_doc_references.py):

- every module sits in a layer and imports only its own layer and the ones below, lowest first:
  `errors` → `contract/` → `infra/` → `ledger/` → `stores/` → `services/` → `maintenance` (the
  public facade) → `dagster_layer/` → `demo/` → `commands/` → `cli`, `definitions`, and the
  `__init__` facade on top;
- no import cycle between modules, type-only imports included;
- no module imports another module's private (`_x`) name;
- the core — everything but `dagster_layer/`, `commands/`, `cli.py`, `definitions.py` and
  `demo/code_location.py` — imports no Dagster, and importing all of it loads none;
- at most twelve modules at the top level;
- no basename shared across layers (an arm's own modules and the public facades excepted);
- a module past 800 lines is a soft warning (is it still one concept?), not a failure.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import pipeline_output

PACKAGE = Path(pipeline_output.__file__).parent
DAGSTER_LAYER = ("dagster_layer/", "commands/", "cli.py", "definitions.py", "demo/code_location.py")
SOFT_MAX_LINES = 800
MAX_TOP_LEVEL_MODULES = 12
# Public modules that only name the public part of a concept implemented below them (their
# docstrings say where): they share the concept's name by design.
PUBLIC_FACADES = ("maintenance.py",)
LAYERS = (
    "errors",
    "contract",
    "infra",
    "ledger",
    "stores",
    "services",
    "maintenance",  # the public facade of table maintenance (services + stores)
    "dagster_layer",
    "demo",
    "commands",
    "cli",
    "definitions",
    "__init__",
)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _dotted(path: Path) -> str:
    rel = _relative(path).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return "pipeline_output" if rel == "__init__" else f"pipeline_output.{rel}"


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


_MODULES = {_dotted(p): p for p in _modules()}


def _project_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from pipeline_output... import name` and `import pipeline_output...`
    in `path`, type-only imports included; `name` is "" for a plain import. A `from package import
    module` counts as an import of the module."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("pipeline_output")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "pipeline_output":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append(
                    (submodule, "") if submodule in _MODULES else (node.module, alias.name)
                )
    return found


def _graph() -> dict[str, set[str]]:
    return {
        name: {m for m, _ in _project_imports(path) if m in _MODULES and m != name}
        for name, path in _MODULES.items()
    }


def _layer(module: str) -> int:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    return LAYERS.index(head)


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
    names = [_dotted(p) for p in _core_modules() if _relative(p) != "__init__.py"]
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


def test_every_module_sits_in_a_known_layer() -> None:
    unknown = [m for m in _MODULES if m.split(".")[1:2] and m.split(".")[1] not in LAYERS]
    assert unknown == [], f"modules outside the layers {LAYERS}: {unknown}"


def test_imports_only_go_down_the_layers() -> None:
    upward = {
        module: sorted(t for t in targets if _layer(t) > _layer(module))
        for module, targets in _graph().items()
        if module != "pipeline_output"  # the facade sits on top and re-exports every layer
    }
    upward = {m: ts for m, ts in upward.items() if ts}
    assert upward == {}, f"imports that go up the layers: {upward}"


def test_no_import_cycle_between_modules_type_only_imports_included() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert cycles == [], f"import cycles: {cycles}"


def test_no_module_imports_another_modules_private_name() -> None:
    reaches = sorted(
        f"{_relative(path)}: {module}.{name}"
        for path in _modules()
        for module, name in _project_imports(path)
        if name.startswith("_") and not name.startswith("__")
    )
    assert reaches == [], f"imports of private names: {reaches}"


def test_the_top_level_holds_at_most_twelve_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"


def test_no_basename_is_shared_across_layers() -> None:
    """A name like `delta.py` in both the core and the Dagster layer misleads readers and grep.
    Inside one arm (`stores/iceberg/`, `stores/postgres/`) a name is the arm's own; the two arms'
    parallel modules (`store.py`) are the one deliberate exception between them."""
    homes: defaultdict[str, list[str]] = defaultdict(list)
    for path in _modules():
        relative = _relative(path)
        if (
            path.name == "__init__.py"
            or relative.startswith(("stores/iceberg/", "stores/postgres/"))
            or relative in PUBLIC_FACADES
        ):
            continue
        homes[path.stem].append(relative)
    for path in PACKAGE.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            homes[path.name].append(f"{path.name}/")
    shared = {name: places for name, places in homes.items() if len(places) > 1}
    assert shared == {}, f"basenames shared across layers: {shared}"


def test_a_module_past_800_lines_is_a_soft_warning() -> None:
    long = {
        _relative(p): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > SOFT_MAX_LINES
    }
    for module, n in sorted(long.items()):
        warnings.warn(f"{module}: {n} lines (> {SOFT_MAX_LINES}): still one concept?", stacklevel=1)
