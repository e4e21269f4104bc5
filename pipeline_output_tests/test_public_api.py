"""The public API is discoverable (issue 32): `dir(pipeline_output)` lists every exported name
although they load on first use, in a fresh interpreter as an IDE or `help()` would see it."""

from __future__ import annotations

import ast
import subprocess
import sys

import pipeline_output


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
