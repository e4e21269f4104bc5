"""Docs that cannot drift: every backticked module path and dotted name of the package in README.md,
docs/*.md and the package's own docstrings resolves against the code.

What is checked (a backticked token, whole):

- a **path** of the repository (`stores/iceberg/merge.py`, `docs/deploy.md`, `benchmarks/`): it
  must exist relative to the repository, the package or one of the package's folders; a bare file
  name (`settings.py`) must name a file of the repository;
- a **dotted name** whose first part is the package or one of its modules (`pipeline_output.errors`,
  `loading.resolve_locations`, `merge.MergeChanges.delete_positions`): the module is found by its
  (unique or any) name in the package, the rest is looked up attribute by attribute — module
  attributes, class attributes, dataclass fields and methods, without importing anything (read
  with `ast`), so private helpers count too.

Tokens that are not about this repository — Dagster's or polars' names (`dg.AssetKey`,
`pl.LazyFrame`), runtime paths (`$PIPELINE_OUTPUT_HOME/logs/...`, `.pipeline_output/`), URLs,
commands with spaces — are not checked: a token is only checked when its first part is ours.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pipeline_output"
TOKEN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
PATH = re.compile(r"[\w.-]*(?:/[\w.-]+)*/?")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sql", ".toml", ".png", ".txt", ".json")
# Top-level folders and files of the repository a path may start with.
REPO_ROOTS = ("pipeline_output", "pipeline_output_tests", "docs", "benchmarks", "deploy", ".ci")
# Runtime state the project creates under PIPELINE_OUTPUT_HOME / DAGSTER_HOME or CI: not repo paths.
RUNTIME_PATHS = (
    "pg/",
    "warehouse/",
    "dagster/",
    "logs/",
    "audit/",
    ".pipeline_output/",
    ".ci/artifacts",
)
# Metadata keys that look like paths (`iceberg/snapshot_id`, `pipeline_output/...`).
METADATA_KEY_PREFIXES = ("iceberg/", "pipeline_output/...", "dagster/")
# Names of other systems that collide with a module name of ours: Iceberg table properties,
# pyiceberg's API, a SQL `schema.table`.
NOT_OURS = {
    *("write.merge.mode", "write.delete.mode", "table.maintenance", "schema.table"),
    "pipeline_output/contract/spec",  # a metadata key
}
# First parts of dotted names that are other libraries' or a user's (`dg.AssetKey`, `gc.freeze()`,
# `pyproject.toml`, `namespace.name`). Any other first part must be a module or class of ours:
# a renamed module (`overwrite.IndexedOverwrite`) fails instead of passing as "not ours".
FOREIGN = {
    *("dg", "dagster", "dagster_dg_cli", "dagster_docker", "dagster_aws", "pl", "pa", "pd"),
    *("pandas", "pyiceberg", "psycopg", "sqlalchemy", "sys", "os", "gc", "random", "postmaster"),
    "pyarrow",
    *("pyproject", "workspace", "defs", "s3", "namespace", "task", "shop", "context"),
    *(
        "my_project",
        "DgContext",
        "pg_hba",
        "client",
    ),  # a user's module in examples; dagster-dg-core's class
    *("replace", "upsert", "append", "append_new", "sync"),  # write modes
    *("Definitions", "LazyFrame", "DataFrame", "AutomationCondition", "DagsterInstance"),
    *("DeltaTable", "Transaction", "TableScan", "AssetKey", "FreshnessPolicy"),
}


@dataclass(frozen=True)
class Reference:
    token: str
    where: str  # file:line


def _doc_sources() -> Iterator[tuple[str, str, int]]:
    """(text, file, first line) of README.md, docs/*.md and every docstring of the package."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        yield path.read_text(encoding="utf-8"), str(path.relative_to(REPO)), 1
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ) and (doc := ast.get_docstring(node, clean=False)):
                body = node.body[0]
                yield doc, str(path.relative_to(REPO)), body.lineno


def references() -> list[Reference]:
    out = []
    for text, file, first in _doc_sources():
        for match in TOKEN.finditer(text):
            line = first + text.count("\n", 0, match.start())
            out.append(Reference(match.group(1).strip(), f"{file}:{line}"))
    return out


@cache
def _modules() -> dict[str, list[Path]]:
    """Every module and package of the package, its tests and benchmarks by its last name (and
    its dotted name)."""
    found: dict[str, list[Path]] = {}
    for root in (PACKAGE, REPO / "pipeline_output_tests", REPO / "benchmarks"):
        for path in root.rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            for name in {parts[-1], ".".join(parts)}:
                found.setdefault(name, []).append(path)
    return found


@cache
def _classes() -> dict[str, list[ast.ClassDef]]:
    """Every top-level class of the package by name."""
    found: dict[str, list[ast.ClassDef]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in _names(path).values():
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


@cache
def _names(path: Path) -> dict[str, ast.AST | None]:
    """The names a module defines at top level (a class maps to its node; others to None)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return _scope(tree.body)


def _scope(body: list[ast.stmt]) -> dict[str, ast.AST | None]:
    names: dict[str, ast.AST | None] = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = None
        elif isinstance(node, ast.If | ast.Try):
            names.update(_scope(node.body))
            for handler in getattr(node, "handlers", []):
                names.update(_scope(handler.body))
            names.update(_scope(node.orelse))
    return names


def _class_members(node: ast.ClassDef) -> set[str]:
    members = set(_scope(node.body))
    for item in node.body:  # attributes set in methods (self.x = ...)
        if isinstance(item, ast.FunctionDef):
            for sub in ast.walk(item):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    members.add(sub.attr)
    return members


@cache
def _control_plane_tables() -> set[str]:
    """`pipeline_output.<table>`: the control plane's Postgres tables (ledger/sql/*.sql)."""
    tables = set()
    for path in (PACKAGE / "ledger").glob("*.py"):  # MIGRATIONS_TABLE = "schema_migrations"
        tables |= set(re.findall(r'_TABLE = "(\w+)"', path.read_text(encoding="utf-8")))
    for path in (PACKAGE / "ledger" / "sql").glob("*.sql"):
        text = path.read_text(encoding="utf-8")
        tables |= set(
            re.findall(
                r"(?i)create (?:unlogged )?table (?:if not exists )?"
                r"pipeline_output\.(\w+)",
                text,
            )
        )
    return tables


def _resolves_dotted(token: str) -> bool | None:
    """True/False for a dotted name of ours; None when its first part is not ours."""
    if token in NOT_OURS:
        return None
    parts = token.removesuffix("()").split(".")
    if len(parts) == 2 and parts[0] == "pipeline_output" and parts[1] in _control_plane_tables():
        return True
    modules = _modules()
    # the longest dotted prefix that names a module of ours
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in modules:
            rest = parts[cut:]
            return any(_lookup(path, rest) for path in modules[head])
    if parts[0] in FOREIGN:
        return None
    return any(_member_path(cls, parts[1:]) for cls in _classes().get(parts[0], []))


def _member_path(node: ast.AST | None, rest: list[str]) -> bool:
    for attribute in rest:
        if not isinstance(node, ast.ClassDef):
            return True  # an attribute of a value: not followed further
        if attribute not in _class_members(node):
            return False
        node = _scope(node.body).get(attribute)
    return True


def _lookup(path: Path, rest: list[str]) -> bool:
    if not rest:
        return True
    if path.name == "__init__.py":
        sub = path.parent / rest[0]
        if (sub / "__init__.py").is_file():
            return _lookup(sub / "__init__.py", rest[1:])
        if sub.with_suffix(".py").is_file():
            return _lookup(sub.with_suffix(".py"), rest[1:])
    names = _names(path)
    if rest[0] in names:
        node = names[rest[0]]
    else:  # `store.maintenance`: an attribute of an instance of the module's class
        owners = [
            cls
            for cls in names.values()
            if isinstance(cls, ast.ClassDef) and rest[0] in _class_members(cls)
        ]
        if not owners:
            return False
        node = _scope(owners[0].body).get(rest[0])
    return _member_path(node, rest[1:])


def _resolves_path(token: str) -> bool | None:
    """True/False for a path of this repository; None when the token is not a repo path."""
    if (
        not PATH.fullmatch(token)
        or token.startswith(("http", "/", *RUNTIME_PATHS, *METADATA_KEY_PREFIXES))
        or token in NOT_OURS
    ):
        return None
    bare = "/" not in token.rstrip("/")
    if bare:  # a bare module file name (`settings.py`); other bare names are users' files
        if not token.endswith(".py"):
            return None
        return any(".git" not in p.parts for p in REPO.rglob(token))
    first = token.split("/")[0]
    bases = _folders()
    if first not in {*REPO_ROOTS, *(b.name for b in bases)}:
        return None
    return any((base / token.rstrip("/")).exists() for base in (REPO, *bases))


@cache
def _folders() -> list[Path]:
    """The package's and the tests' folders: a path may be relative to any of them."""
    return [
        p
        for root in (PACKAGE, REPO / "pipeline_output_tests")
        for p in (root, *root.rglob("*"))
        if p.is_dir() and p.name != "__pycache__"
    ]


def _package_docstring_names() -> Iterator[Reference]:
    """A package's docstring describes its modules: there a bare lowercase name (`merge`) must be
    a module of the package (at any depth) or a name one of the package's modules defines (a
    write mode, a schema or another system's name may be listed in FOREIGN)."""
    defined = {name for path in PACKAGE.rglob("*.py") for name in _names(path)}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        inside = {p.stem for p in init.parent.rglob("*.py")}
        inside |= {p.name for p in init.parent.rglob("*") if p.is_dir()}
        inside |= set(_names(init))
        for token in TOKEN.findall(doc):
            if re.fullmatch(r"[a-z_][a-z0-9_]*", token) and token not in inside | defined | FOREIGN:
                yield Reference(token, f"{init.relative_to(REPO)} (a module of the package?)")


def stale_references() -> list[str]:
    stale = [f"{ref.where}: `{ref.token}`" for ref in _package_docstring_names()]
    for ref in references():
        token = ref.token
        if DOTTED.fullmatch(token) and not token.endswith(FILE_SUFFIXES):
            ok = _resolves_dotted(token)
        else:
            ok = _resolves_path(token)
        if ok is False:
            stale.append(f"{ref.where}: `{token}`")
    return stale


LAYOUT_MAP = REPO / "docs" / "concepts.md"
LAYOUT_HEADING = "## Where each concept lives"


def _layout_map_modules() -> list[str]:
    """The modules docs/concepts.md's layout map names: the `.py` paths of its table's second
    column, relative to the package."""
    text = LAYOUT_MAP.read_text(encoding="utf-8")
    section = text.split(LAYOUT_HEADING, 1)[1].split("\n## ", 1)[0]
    named = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) == 2:
            named += [t for t in TOKEN.findall(cells[1]) if t.endswith(".py")]
    return named


def _package_modules() -> set[str]:
    """Every module of the package, relative to it; a sub-package's `__init__.py` only when it
    defines a class or a function (the others only re-export or hold a docstring)."""
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            body = ast.parse(path.read_text(encoding="utf-8")).body
            if not any(isinstance(n, ast.ClassDef | ast.FunctionDef) for n in body):
                continue
        modules.add(rel)
    return modules


def test_every_backticked_module_path_and_dotted_name_resolves() -> None:
    stale = stale_references()
    assert not stale, f"{len(stale)} stale references:\n" + "\n".join(stale)


def test_the_reference_check_fails_on_a_stale_name_and_a_stale_path() -> None:
    assert _resolves_dotted("pipeline_output.errors") is True
    assert _resolves_dotted("loading.resolve_locations") is True
    assert _resolves_dotted("loading.no_such_function") is False
    assert _resolves_dotted("pipeline_output.no_such_module") is False
    assert _resolves_dotted("dg.AssetKey") is None  # not ours: not checked
    assert _resolves_path("docs/concepts.md") is True
    assert _resolves_path("commands/loading.py") is True
    assert _resolves_path("commands/no_such_file.py") is False
    assert _resolves_path("no_such_file.py") is False
    assert _resolves_path("$PIPELINE_OUTPUT_HOME/logs") is None


def test_the_layout_map_lists_every_module_of_the_package_once() -> None:
    named = _layout_map_modules()
    twice = sorted({m for m in named if named.count(m) > 1})
    missing = sorted(_package_modules() - set(named))
    unknown = sorted(set(named) - _package_modules())
    assert not (twice or missing or unknown), (
        f"docs/concepts.md, {LAYOUT_HEADING!r}: listed twice {twice}, missing {missing}, "
        f"not a module of the package {unknown}"
    )
