"""The per-arm fixtures of the both-arms suites: `arm` ("iceberg" / "pg") and its harness `h`.

They live here, not in `stores/conftest.py`, because the per-arm test files use the root `h`
(the Iceberg harness) and must not get this parametrised one.
"""

from __future__ import annotations

import pytest

from pipeline_output_tests.iceberg_harness import Harness
from pipeline_output_tests.stores.arms import ARMS, IcebergArm, PgArm, PgHarness


@pytest.fixture(params=ARMS, ids=lambda arm: f"arm={arm}")
def arm(request: pytest.FixtureRequest) -> str:
    """Which arm the test runs on: "iceberg" or "pg"."""
    return str(request.param)


@pytest.fixture
def h(arm: str, request: pytest.FixtureRequest) -> IcebergArm | PgArm:
    """The arm's harness (the Iceberg arm's catalog is made only for `arm=iceberg`)."""
    pg_db_url = request.getfixturevalue("pg_db_url")
    if arm == "iceberg":
        catalog = request.getfixturevalue("catalog")
        return IcebergArm(Harness(catalog, request.getfixturevalue("fresh_catalog"), pg_db_url))
    return PgArm(PgHarness(pg_db_url))
