"""The installed dependencies are inside the ranges the code supports (pyproject.toml), and the
Dagster packages come from one release train: a test fails as soon as an upgrade leaves them."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
TRAIN = ("dagster", "dagster-webserver", "dagster-postgres", "dagster-dg-cli")


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r for r in reqs}


@pytest.mark.parametrize("name", [*TRAIN, "pyiceberg", "polars", "pyarrow", "psycopg"])
def test_the_installed_version_is_inside_the_supported_range(name: str) -> None:
    requirement = _requirements()[name]
    installed = importlib.metadata.version(name)
    assert requirement.specifier.contains(installed, prereleases=True), (
        f"{name} {installed} is outside the supported range {requirement.specifier} "
        "(pyproject.toml); install a version inside it"
    )


def test_the_dagster_ranges_are_bounded_on_both_sides() -> None:
    """An open upper bound lets pip leave the train (or backtrack dagster-postgres to 0.11)."""
    reqs = _requirements()
    for name in [*TRAIN, "pyiceberg"]:
        operators = {spec.operator for spec in reqs[name].specifier}
        assert operators & {">=", "=="} and operators & {"<", "=="}, (name, reqs[name])


def test_the_dagster_packages_come_from_one_release_train() -> None:
    """dagster 1.13.N pairs with dagster-webserver/dagster-dg-cli 1.13.N and dagster-postgres
    0.29.N (libraries are numbered 0.(minor+16).N)."""
    core = Version(importlib.metadata.version("dagster"))
    for name in ("dagster-webserver", "dagster-dg-cli"):
        assert Version(importlib.metadata.version(name)) == core, name
    postgres = Version(importlib.metadata.version("dagster-postgres"))
    assert (postgres.major, postgres.minor, postgres.micro) == (0, core.minor + 16, core.micro)


def test_the_readme_states_the_supported_ranges() -> None:
    readme = (REPO / "README.md").read_text()
    for name in [*TRAIN, "pyiceberg"]:
        spec = str(_requirements()[name].specifier)
        wanted = ",".join(sorted(spec.split(","), key=lambda s: not s.startswith(">")))
        assert f"`{name}{wanted}`" in readme, f"README does not state {name}{wanted}"
