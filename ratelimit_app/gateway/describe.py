"""The request a gateway asks about (`GatewayRequest`): method, URI, service, cost and usage estimate, read
from the headers of its authorization request (docs/gateway.md, "The contract"). Who the client is comes
from the authorization request itself, as for any request Django limits. The gateway must set or remove
these headers: a client that sends them itself chooses its own cost."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from django.http import HttpRequest

from ..apply.routes import validate_cost, validate_scope
from ..core.engine import Usage
from ..core.policies import MAX_LIMIT
from ..core.usage import usage_pairs

#: The contract of nginx's auth_request (X-Original-*; every answer but 200 is a 403, see answers).
AUTH_REQUEST = "auth-request"
#: The contract of Caddy, Traefik and Envoy, which pass the answer's status on (X-Forwarded-*, or a path).
AUTHORIZE = "authorize"

SERVICE_HEADER = "X-RateLimit-Service"
COST_HEADER = "X-RateLimit-Cost"
USAGE_HEADER = "X-RateLimit-Usage"
_USAGE_ITEM = re.compile(r"^\s*([a-z][a-z0-9_]{0,31})=([0-9]{1,10})\s*$")
_HEADERS = {
    AUTH_REQUEST: ("X-Original-Method", "X-Original-URI"),
    AUTHORIZE: ("X-Forwarded-Method", "X-Forwarded-Uri"),
}
_METHOD = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,32}$")
MAX_URI = 8192


class BadDescription(ValueError):
    """The authorization request does not describe a request the endpoint can decide (answered 400)."""


@dataclass(frozen=True, slots=True)
class GatewayRequest:
    """The request a gateway asks about: its method, URI (as the client sent it: path and query), the
    path (decoded, as Django's `path_info`), the service ("" for none), the cost and the usage estimates."""

    method: str
    uri: str
    path: str
    service: str
    cost: int
    usage: Usage = ()


def describe(request: HttpRequest, contract: str, forwarded_path: str | None = None) -> GatewayRequest:
    """The request that `request`, a gateway's authorization request under `contract`, describes: from
    `forwarded_path`, the path Envoy appended to the endpoint's own, else from the contract's headers.
    Raises BadDescription, saying what is missing or wrong."""
    if forwarded_path is not None:
        query = request.META.get("QUERY_STRING", "")
        method, uri = request.method or "", forwarded_path + (f"?{query}" if query else "")
        path = forwarded_path
    else:
        method_header, uri_header = _HEADERS[contract]
        method, uri = request.headers.get(method_header, ""), request.headers.get(uri_header, "")
        if not method or not uri:
            raise BadDescription(f"the gateway did not describe the request to decide: send {method_header} and "
                                 f"{uri_header} (docs/gateway.md)")
        path = _path_of(uri, uri_header)
    if not _METHOD.match(method):
        raise BadDescription(f"{method!r:.40} is not an HTTP method")
    return GatewayRequest(method.upper(), uri, path, _service(request), _cost(request),
                          usage_pairs(usage_of(request, minimum=1)))


def _path_of(uri: str, header: str) -> str:
    """The path of a request URI, decoded once: origin-form ("/orders?page=2"; one that starts with "//"
    is a path, as a server reads it, not a host) or absolute-form ("http://shop.example/orders")."""
    if len(uri) > MAX_URI:
        raise BadDescription(f"{header} is longer than {MAX_URI} characters")
    path = uri.partition("?")[0].partition("#")[0] if uri.startswith("/") else urlsplit(uri).path
    if not path.startswith("/") and uri != "*":
        raise BadDescription(f"{header} is not a request URI (a path such as /orders?page=2): {uri!r:.80}")
    return unquote(path) or "/"


def _service(request: HttpRequest) -> str:
    value = request.headers.get(SERVICE_HEADER)
    if value is None or value == "":
        return ""
    try:
        return validate_scope(value)
    except ValueError:
        raise BadDescription(f"{SERVICE_HEADER}: {value!r:.40} must be 1-30 letters, digits, '_' or '-' "
                             "(the scope of the service's tier limits)") from None


def _cost(request: HttpRequest) -> int:
    value = request.headers.get(COST_HEADER)
    if value is None or value == "":
        return 1
    try:
        if not (value.isascii() and value.isdigit() and len(value) <= 10):
            raise ValueError(value)
        return validate_cost(int(value), minimum=1)
    except ValueError:
        raise BadDescription(f"{COST_HEADER}: {value!r:.40} must be a whole number from 1 to {MAX_LIMIT}") from None


def usage_of(request: HttpRequest, *, minimum: int) -> dict[str, int]:
    """The units of `USAGE_HEADER` ("tokens=500, images=2"; {} without it), each a whole number from
    `minimum` (1: an estimate; 0: what a request used). Raises BadDescription."""
    value = request.headers.get(USAGE_HEADER, "")
    if not value:
        return {}
    counts: dict[str, int] = {}
    for item in value.split(",")[:16]:
        match = _USAGE_ITEM.match(item)
        count = int(match[2]) if match else -1
        if match is None or match[1] in counts or not minimum <= count <= MAX_LIMIT:
            raise BadDescription(f"{USAGE_HEADER}: {value!r:.60} must be unit=count pairs such as 'tokens=500', "
                                 f"each unit once, each count a whole number from {minimum} to {MAX_LIMIT}")
        counts[match[1]] = count
    return counts
