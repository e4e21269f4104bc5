"""The per-arm fixtures of the both-arms suites: `arm` ("iceberg" / "pg"), the Iceberg arm's
`catalog_backend` ("sql" / "rest") and the arm's harness `h`.

A test that takes `arm` (or `h`) runs on three variants: `arm=iceberg` (the SQL catalog, local
files), `arm=iceberg-rest` (SeaweedFS's REST catalog over S3) and `arm=pg`. They live here, not in
`stores/conftest.py`, because the per-arm test files use the root `h` (the Iceberg harness) and
must not get this parametrised one.

Time budget: the REST variant of every test is in the slow run; the default run keeps the REST
variant of the tests marked `@pytest.mark.rest_default` (a representative set: every write mode x
strategy once, a window, schema evolution, refused writes) — see docs/deploy.md "Tested
configurations".
"""

from __future__ import annotations

import pytest

from pipeline_output_tests.iceberg_harness import Harness
from pipeline_output_tests.seaweed import rest_variant_marks
from pipeline_output_tests.stores.arms import ARMS, IcebergArm, PgArm, PgHarness


def arm_variants(metafunc: pytest.Metafunc) -> list[object]:
    """`(arm, catalog_backend)` for each arm; the REST variant slow unless the test says
    `rest_default`."""
    rest_marks = rest_variant_marks(metafunc.definition)
    variants: list[object] = []
    for arm in ARMS:
        variants.append(pytest.param(arm, "sql", id=f"arm={arm}"))
        if arm == "iceberg":
            variants.append(pytest.param(arm, "rest", id="arm=iceberg-rest", marks=rest_marks))
    return variants


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "arm" in metafunc.fixturenames:
        metafunc.parametrize(("arm", "catalog_backend"), arm_variants(metafunc))


@pytest.fixture
def h(arm: str, catalog_backend: str, request: pytest.FixtureRequest) -> IcebergArm | PgArm:
    """The arm's harness (the Iceberg arm's catalog, of `catalog_backend`, is made only for
    `arm=iceberg`)."""
    pg_db_url = request.getfixturevalue("pg_db_url")
    if arm == "iceberg":
        catalog = request.getfixturevalue("catalog")
        return IcebergArm(Harness(catalog, request.getfixturevalue("fresh_catalog"), pg_db_url))
    return PgArm(PgHarness(pg_db_url))
