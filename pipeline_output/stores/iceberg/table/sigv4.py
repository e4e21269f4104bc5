"""AWS Signature Version 4 for the project's own HTTP requests, from static credentials: the S3
GETs and PUTs of `file_io` and a REST catalog's requests (`rest_catalog.py`).

One signer, the algorithm of botocore's `SigV4Auth` (header-based, HMAC-SHA256): the canonical
request (method, URI, query, the signed headers, the payload's hash), the string to sign with
its scope (`<day>/<region>/<service>/aws4_request`), the key derived from the secret. Each caller
gives the URI in its service's canonical form (`canonical_uri`): S3 signs the path as sent; every
other service (a REST catalog's `execute-api`, `glue`, `s3tables`) signs it URI-encoded once more.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

EMPTY_PAYLOAD = hashlib.sha256(b"").hexdigest()
"""The payload hash of a request without a body."""

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
"""S3's payload hash when the body is not signed."""

# never signed: headers a proxy or the HTTP client may change or add after signing (botocore's
# `SIGNED_HEADERS_BLACKLIST`), and an `authorization` the signature replaces
_UNSIGNED_HEADERS = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-amzn-trace-id",
        "authorization",
    }
)


@dataclass(frozen=True)
class Credentials:
    """Static AWS credentials: an access key, its secret, and a session token when temporary."""

    access_key: str
    secret_key: str
    token: str | None = None


def canonical_uri(path: str, *, service: str) -> str:
    """`path` (as sent: already URI-encoded) as `service` signs it: S3 as it is; any other
    service with dot segments and repeated slashes removed, then URI-encoded again."""
    if service == "s3":
        return path or "/"
    return quote(_without_dot_segments(path), safe="/~")


def canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    """Decoded query parameters in their canonical form: each name and value URI-encoded,
    sorted by name, then value."""
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def signed(
    method: str,
    uri: str,
    query: str,
    headers: Mapping[str, str],
    payload_hash: str,
    *,
    credentials: Credentials,
    service: str,
    region: str,
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers that sign a request: `x-amz-date`, `x-amz-security-token` (a session
    token's), `authorization`. `uri` and `query` are canonical (`canonical_uri`,
    `canonical_query`); `headers` are the request's as sent, `host` among them; every one but
    those an HTTP client or proxy may change (`connection`, `user-agent`, ...) is signed.
    `payload_hash`: the body's SHA-256 in hex (`EMPTY_PAYLOAD` without one), or S3's
    `UNSIGNED_PAYLOAD`."""
    moment = now if now is not None else datetime.now(UTC)
    stamp, day = moment.strftime("%Y%m%dT%H%M%SZ"), moment.strftime("%Y%m%d")
    added = {"x-amz-date": stamp}
    if credentials.token:
        added["x-amz-security-token"] = credentials.token
    to_sign: dict[str, list[str]] = {}
    for name, value in headers.items():
        lowered = name.lower()
        if lowered not in _UNSIGNED_HEADERS and lowered not in added:
            to_sign.setdefault(lowered, []).append(" ".join(str(value).split()))
    to_sign.update((name, [value]) for name, value in added.items())
    names = sorted(to_sign)
    canonical = "\n".join(
        [
            method.upper(),
            uri,
            query,
            "".join(f"{n}:{','.join(to_sign[n])}\n" for n in names),
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{credentials.secret_key}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    added["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return added


def _without_dot_segments(path: str) -> str:
    """`path` with `.` and `..` segments resolved and empty ones dropped (RFC 3986 5.2.4; AWS
    also drops repeated slashes), its leading and trailing slash kept; `/` when empty."""
    if not path:
        return "/"
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and kept else ""
    return first + "/".join(kept) + last
