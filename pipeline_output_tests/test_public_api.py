"""The public API is discoverable (issue 32): `dir(pipeline_output)` lists every exported name
although they load on first use, in a fresh interpreter as an IDE or `help()` would see it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pipeline_output
import pipeline_output.errors
import pipeline_output.maintenance


def test_dir_lists_the_public_api_and_every_name_resolves() -> None:
    listed = dir(pipeline_output)
    assert set(pipeline_output.__all__) <= set(listed)
    assert {"dataset", "build_definitions", "postgres_source", "Delta", "connect"} <= set(listed)
    for name in pipeline_output.__all__:
        assert getattr(pipeline_output, name) is not None, name


def test_a_fresh_interpreter_sees_the_api_before_anything_is_loaded() -> None:
    code = (
        "import sys, pipeline_output as p; "
        "print('dagster' in sys.modules, sorted(n for n in dir(p) if not n.startswith('_')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded, names = out.split(" ", 1)
    assert loaded == "False", "dir() must not import the Dagster layer"
    assert ast.literal_eval(names) == sorted(
        n for n in pipeline_output.__all__ if not n.startswith("_")
    )


def test_the_type_checking_imports_are_the_public_api_table() -> None:
    source = Path(pipeline_output.__file__).read_text()
    block = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imported: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            imported.setdefault(node.module, set()).add(alias.name)
    table = {module: set(names) for module, names in pipeline_output._API.items()}
    assert imported == table
    assert sorted(pipeline_output.__all__) == sorted([*pipeline_output._EXPORTS, "__version__"])


def test_each_public_name_is_the_object_of_its_module_in_the_table() -> None:
    for module, names in pipeline_output._API.items():
        for name in names:
            assert getattr(pipeline_output, name) is getattr(importlib.import_module(module), name)


def test_errors_and_maintenance_are_public_modules() -> None:
    assert {
        name
        for name in dir(pipeline_output.errors)
        if isinstance(getattr(pipeline_output.errors, name), type)
        and issubclass(
            getattr(pipeline_output.errors, name), pipeline_output.errors.PipelineOutputError
        )
    } >= set(pipeline_output._API["pipeline_output.errors"])
    assert set(pipeline_output.maintenance.__all__) == {
        "HealthThresholds",
        "MaintenanceOptions",
        "compact",
        "expire_snapshots",
        "maintain",
        "remove_orphans",
    }
    assert pipeline_output.maintenance.compact is pipeline_output.compact
    assert "internal" in (pipeline_output.__doc__ or "")
