"""A REST catalog's requests signed by the project's SigV4 signer (`rest_catalog.py`, `sigv4.py`):
the same headers as pyiceberg's botocore signer, botocore left for what only it can resolve, and
a real server (SeaweedFS) that accepts the signature and refuses a wrong secret."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from pipeline_output.stores.iceberg.table import sigv4
from pipeline_output.stores.iceberg.table.rest_catalog import (
    SignedRestCatalog,
    SigV4Adapter,
    signing_of,
)
from pipeline_output_tests.seaweed import unique_namespace

MOMENT = datetime(2026, 12, 8, 2, 30, 5, tzinfo=UTC)

STATIC = {
    "uri": "https://catalog.example.com/iceberg",
    "rest.sigv4-enabled": "true",
    "rest.signing-name": "glue",
    "rest.signing-region": "eu-west-1",
    "client.access-key-id": "AKIDEXAMPLE",
    "client.secret-access-key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
}


class _Frozen(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> _Frozen:
        return cls.fromtimestamp(MOMENT.timestamp(), tz)


def _adapters(props: dict[str, str]) -> tuple[Any, Any]:
    """(pyiceberg's botocore adapter, ours) for a catalog of `props`."""
    from pyiceberg.catalog.rest import RestCatalog

    catalog = SimpleNamespace(properties=props, uri=props["uri"])
    signed = SignedRestCatalog.__new__(SignedRestCatalog)  # (its __init__ asks the server)
    signed.properties, signed.uri = props, props["uri"]
    theirs, ours = requests.Session(), requests.Session()
    RestCatalog._init_sigv4(catalog, theirs)  # type: ignore[arg-type]
    signed._init_sigv4(ours)
    return theirs.get_adapter(props["uri"]), ours.get_adapter(props["uri"])


REQUESTS = [
    ("GET", "/iceberg/v1/config", {"warehouse": "s3://lake/"}, None, {}),
    ("GET", "/iceberg/v1/namespaces/a%1Fb/tables", {"pageSize": "100"}, None, {}),
    ("HEAD", "/iceberg/v1/namespaces/sales/tables/orders", {}, None, {}),
    (
        "POST",
        "/iceberg/v1/namespaces/sales/tables/orders",
        {},
        b'{"requirements": [], "updates": [{"action": "set-properties"}]}',
        {"Content-Type": "application/json", "X-Iceberg-Access-Delegation": "vended-credentials"},
    ),
    (
        "DELETE",
        "/iceberg/v1/namespaces/sales/tables/old%20one",
        {"purgeRequested": "true"},
        None,
        {},
    ),
    ("GET", "/iceberg/v1/./namespaces//sales/../sales/", {"a b": "c/d", "e": "~f"}, None, {}),
    (
        "GET",
        "/iceberg/v1/namespaces",
        {},
        None,
        {"Authorization": "Bearer a-token-from-the-config", "User-Agent": "x   y"},
    ),
]


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEXAMPLETOKEN"])
@pytest.mark.parametrize(("method", "path", "params", "body", "headers"), REQUESTS)
def test_a_catalog_request_is_signed_with_the_headers_botocore_gives_it(
    monkeypatch: pytest.MonkeyPatch,
    token: str | None,
    method: str,
    path: str,
    params: dict[str, str],
    body: bytes | None,
    headers: dict[str, str],
) -> None:
    pytest.importorskip("boto3", reason="the reference signer is pyiceberg's, on botocore")
    import botocore.auth  # type: ignore[import-untyped]

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: MOMENT.replace(tzinfo=None))
    monkeypatch.setattr(sigv4, "datetime", _Frozen)
    props = dict(STATIC, **({"client.session-token": token} if token else {}))
    theirs, ours = _adapters(props)
    assert isinstance(ours, SigV4Adapter)
    assert not isinstance(theirs, SigV4Adapter)

    def prepared() -> requests.PreparedRequest:
        request = requests.Request(
            method, "https://catalog.example.com" + path, params=params, data=body, headers=headers
        )
        return requests.Session().prepare_request(request)

    expected, got = prepared(), prepared()
    theirs.add_headers(expected)
    ours.add_headers(got)
    assert got.url == expected.url
    assert {k.lower(): v for k, v in got.headers.items()} == {
        k.lower(): v for k, v in expected.headers.items()
    }
    assert "Signature=" in got.headers["Authorization"]


def test_sigv4_signs_the_aws_documentation_example() -> None:
    """AWS's published example (the IAM `ListUsers` GET, Signature Version 4 documentation):
    the signature a server computes from the same request."""
    added = sigv4.signed(
        "GET",
        sigv4.canonical_uri("/", service="iam"),
        sigv4.canonical_query([("Action", "ListUsers"), ("Version", "2010-05-08")]),
        {
            "host": "iam.amazonaws.com",
            "content-type": "application/x-www-form-urlencoded; charset=utf-8",
        },
        sigv4.EMPTY_PAYLOAD,
        credentials=sigv4.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        service="iam",
        region="us-east-1",
        now=datetime(2015, 8, 30, 12, 36, 0, tzinfo=UTC),
    )
    assert added["x-amz-date"] == "20150830T123600Z"
    assert added["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date, "
        "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
    )


def test_a_query_parameter_without_a_value_and_a_repeated_one_are_signed() -> None:
    """AWS signs every parameter sent, an empty value as `name=` and repeated names sorted by
    value (pyiceberg's signer drops both: a server would refuse such a request)."""
    assert sigv4.canonical_query([("b", "2"), ("a", ""), ("b", "1"), ("c d", "e/f")]) == (
        "a=&b=1&b=2&c%20d=e%2Ff"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"client.access-key-id": None},
        {"client.secret-access-key": None},
        {"rest.signing-region": None},
        {"client.profile-name": "analytics"},
    ],
    ids=["no access key", "no secret", "no region", "a profile"],
)
def test_a_catalog_whose_credentials_botocore_must_resolve_is_signed_by_pyiceberg(
    change: dict[str, str | None], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("boto3", reason="pyiceberg's signer is botocore's")
    config = tmp_path / "aws-config"
    config.write_text("[profile analytics]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    props = {k: v for k, v in {**STATIC, **change}.items() if v is not None}
    assert signing_of(props) is None
    _, ours = _adapters(props)
    assert not isinstance(ours, SigV4Adapter)
    assert type(ours).__module__ == "pyiceberg.catalog.rest"


def test_the_signing_region_falls_back_to_the_client_region_and_the_service_to_execute_api() -> (
    None
):
    props = {
        k: v for k, v in STATIC.items() if k not in ("rest.signing-region", "rest.signing-name")
    }
    signing = signing_of({**props, "client.region": "us-west-2"})
    assert signing is not None
    assert (signing.region, signing.service) == ("us-west-2", "execute-api")


OPEN_AND_COMMIT = """
import json, sys
class Refuse:  # as on an install without boto3 (pyiceberg's `rest-sigv4` extra)
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("boto3", "botocore"):
            raise ModuleNotFoundError(f"no module named {name!r} here", name=name)
sys.meta_path.insert(0, Refuse())
import polars as pl
from pipeline_output.infra.deferred_imports import loaded
from pipeline_output.stores.iceberg.table.catalog import open_catalog
props, ns = json.loads(sys.argv[1]), sys.argv[2]
catalog = open_catalog("default", props, namespace=ns, where=str)
table = catalog.create_table((ns, "signed"), pl.DataFrame({"id": [1, 2, 3]}).to_arrow().schema)
table.append(pl.DataFrame({"id": [1, 2, 3]}).to_arrow())
rows = catalog.load_table((ns, "signed")).scan().to_arrow().num_rows
print(json.dumps({"rows": rows, "botocore": loaded("botocore"), "boto3": loaded("boto3"),
                  "tables": [t[-1] for t in catalog.list_tables(ns)]}))
"""


def test_a_sigv4_rest_catalog_with_static_credentials_works_without_botocore(
    seaweedfs: Any,
) -> None:
    """SeaweedFS checks every catalog request's signature: a fresh process where boto3 and
    botocore cannot be imported opens the catalog, creates a table, commits to it, lists and
    reads it."""
    got = subprocess.run(
        [
            sys.executable,
            "-c",
            OPEN_AND_COMMIT,
            json.dumps(seaweedfs.catalog_properties()),
            unique_namespace("signed"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out == {"rows": 3, "botocore": False, "boto3": False, "tables": ["signed"]}


def test_a_catalog_request_signed_with_a_wrong_secret_is_refused(seaweedfs: Any) -> None:
    from pyiceberg.exceptions import ForbiddenError

    from pipeline_output.stores.iceberg.table.catalog import open_catalog

    props = dict(seaweedfs.catalog_properties(), **{"client.secret-access-key": "not-it"})
    with pytest.raises(ForbiddenError, match="signature we calculated does not match"):
        open_catalog("default", props, where=str).list_namespaces()
