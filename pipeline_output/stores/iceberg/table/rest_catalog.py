"""`SignedRestCatalog`: pyiceberg's REST catalog, its requests signed by the project's SigV4
signer (`sigv4.py`) when the configuration gives static credentials.

pyiceberg signs a REST catalog's requests (`rest.sigv4-enabled`: AWS Glue's and S3 Tables'
Iceberg endpoints, SeaweedFS) through botocore, building a boto3 session twice as the catalog
opens: importing boto3 and making its sessions is ~90 ms of every process that opens such a
catalog — a Dagster run's, before its first write (benchmarks/results/rest-catalog.md,
"Session 19") — and boto3 must be installed. With an access key, its secret (a session token
too) and a signing region in the configuration (`client.access-key-id`,
`client.secret-access-key`, `client.session-token`; `rest.signing-region`, else
`client.region`), the same signature is computed here: botocore's canonical request for a
service other than S3 (the path URI-encoded again, the query sorted, every header signed but
those a client may change, the body's SHA-256), the same headers added (`x-amz-date`, the token,
`authorization`; a bearer token's `authorization` moved to `Original-Authorization`, as
pyiceberg does). Any other configuration (a profile, credentials or region from the
environment or AWS config files, a botocore session) is signed by pyiceberg as before.

Imported only when a REST catalog is opened (`catalog.open_catalog`): it imports pyiceberg's REST
catalog and `requests`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pyiceberg.catalog.rest import (
    SIGV4_MAX_RETRIES,
    SIGV4_MAX_RETRIES_DEFAULT,
    SIGV4_REGION,
    SIGV4_SERVICE,
    RestCatalog,
)
from pyiceberg.utils.properties import get_first_property_value, property_as_int
from requests import PreparedRequest, Session
from requests.adapters import HTTPAdapter

from pipeline_output.errors import InvalidArgument
from pipeline_output.stores.iceberg.table import sigv4

_DEFAULT_PORTS = {"http": 80, "https": 443}


class SignedRestCatalog(RestCatalog):
    """pyiceberg's `RestCatalog`, SigV4-signed without botocore when its configuration gives
    static credentials and a region (`signing_of`)."""

    def _init_sigv4(self, session: Session) -> None:
        signing = signing_of(self.properties)
        if signing is None:
            super()._init_sigv4(session)
            return
        retries = property_as_int(self.properties, SIGV4_MAX_RETRIES, SIGV4_MAX_RETRIES_DEFAULT)
        session.mount(self.uri, SigV4Adapter(signing, max_retries=retries or 0))


@dataclass(frozen=True)
class Signing:
    """How a catalog's requests are signed: the credentials, the service and the region."""

    credentials: sigv4.Credentials
    service: str
    region: str


def signing_of(properties: Mapping[str, Any]) -> Signing | None:
    """The signing a catalog's `properties` give — static credentials and a region — or None
    when botocore must resolve either (a profile, the environment, AWS config files, a botocore
    session), as pyiceberg's signer does."""

    def first(*names: str) -> str | None:  # pyiceberg's lookup, as its own signer's
        value = get_first_property_value(dict(properties), *names)
        return str(value) if value else None

    access, secret = first("client.access-key-id"), first("client.secret-access-key")
    region = first(SIGV4_REGION, "client.region")
    if not (access and secret and region):
        return None
    if first("client.profile-name") or properties.get("botocore_session") is not None:
        return None
    return Signing(
        sigv4.Credentials(access, secret, first("client.session-token")),
        service=first(SIGV4_SERVICE) or "execute-api",
        region=region,
    )


class SigV4Adapter(HTTPAdapter):
    """An HTTP adapter that signs every request it sends (`Signing`)."""

    def __init__(self, signing: Signing, *, max_retries: int) -> None:
        super().__init__(max_retries=max_retries)
        self.signing = signing

    def add_headers(self, request: PreparedRequest, **kwargs: Any) -> None:
        """Sign `request` in place (requests calls this right before sending it)."""
        headers = request.headers
        headers.pop("connection", None)  # the HTTP client's to set, after signing
        body = _bytes_of(request.body)
        if not body:
            headers["x-amz-content-sha256"] = sigv4.EMPTY_PAYLOAD
        sent = {name: _text(value) for name, value in headers.items()}
        given = headers.get("x-amz-content-sha256")  # (any spelling of the name)
        payload = _text(given) if given else hashlib.sha256(body or b"").hexdigest()
        parts = urlsplit(str(request.url))
        added = sigv4.signed(
            str(request.method),
            sigv4.canonical_uri(parts.path, service=self.signing.service),
            sigv4.canonical_query(parse_qsl(parts.query, keep_blank_values=True)),
            {**sent, "host": _host(parts.scheme, parts.hostname, parts.port)},
            payload,
            credentials=self.signing.credentials,
            service=self.signing.service,
            region=self.signing.region,
        )
        for name, value in added.items():
            held = headers.get(name)
            if held is not None and _text(held) != value:  # a bearer token's: kept beside
                headers[f"Original-{name.title()}"] = held
        headers.update(added)


def _bytes_of(body: Any) -> bytes | None:
    """A request body's bytes: a file's read and rewound (as botocore hashes it)."""
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    if hasattr(body, "read") and hasattr(body, "seek"):
        start = body.tell()
        data = body.read()
        body.seek(start)
        return data if isinstance(data, bytes) else str(data).encode()
    raise InvalidArgument(  # pyiceberg's requests never stream a body
        f"a REST catalog request whose body is a {type(body).__name__} cannot be SigV4-signed"
    )


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _host(scheme: str, hostname: str | None, port: int | None) -> str:
    """The `host` a request to a URL signs: lowercase, its port unless the scheme's default."""
    host = hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    return host
