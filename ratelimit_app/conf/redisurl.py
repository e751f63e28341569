"""What a RATELIMIT['REDIS_URL'] may be. It can hold a password, so a problem names the part at fault ("its
port"), never its text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from redis.connection import URL_QUERY_ARGUMENT_PARSERS

#: redis-py's parser of each query parameter it reads from a URL (int, float, to_bool, ...).
_PARSERS: dict[str, Callable[[str], Any]] = dict(URL_QUERY_ARGUMENT_PARSERS)  # type: ignore[arg-type]
_KINDS: dict[Any, str] = {int: "a whole number", float: "a number"}

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "redis+sentinel")
CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"

#: What `ssl_cert_reqs` may say (redis-py maps these to the ssl module's constants).
_CERT_REQS = ("none", "optional", "required")


def host_ports(netloc: str) -> list[tuple[str, int]] | None:
    """(host, port) of every "host:port" in a cluster or sentinel URL's network location (its user info
    left out), or None when one is not host:port."""
    found = []
    for item in netloc.rpartition("@")[2].split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            return None
        found.append((host.strip("[]"), int(port)))
    return found


def url_problem(url: str) -> str | None:
    """What is wrong with `url` as a REDIS_URL ("its port is not a number"), or None. Never quotes the URL."""
    try:
        parts = urlsplit(url)
        port = parts.port if parts.scheme not in (CLUSTER_SCHEME, SENTINEL_SCHEME) else None
    except ValueError:
        return "it is not a URL with a valid host and port"
    if parts.scheme not in SCHEMES:
        return f"its scheme is not one of {', '.join(SCHEMES)}"
    if parts.scheme in (CLUSTER_SCHEME, SENTINEL_SCHEME):
        if host_ports(parts.netloc) is None:
            return "an address in it is not host:port (redis+cluster://host:7000,host:7001)"
        segments = [segment for segment in parts.path.split("/") if segment]
        if parts.scheme == SENTINEL_SCHEME and len(segments) > 1 and not segments[1].isdigit():
            return "its database (the path after the service name) is not a number"
        return _query_problem(parts.query)
    if parts.scheme != "unix" and port is None and parts.netloc.endswith(":"):
        return "its port is empty"
    database = parts.path.strip("/") if parts.scheme != "unix" else ""
    if database and not database.isdigit():
        return "its database (the path after the host) is not a number"
    return _query_problem(parts.query)


def _query_problem(query: str) -> str | None:
    """The first query parameter redis-py would refuse, or that would make every connection fail."""
    for name, value in parse_qsl(query, keep_blank_values=True):
        parser = _PARSERS.get(name)
        if name == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
            return f"its query parameter 'ssl_cert_reqs' is not one of {', '.join(_CERT_REQS)}"
        if parser is None or value == "":
            continue
        try:
            parser(value)
        except (TypeError, ValueError):
            return f"its query parameter {name!r} is not {_KINDS.get(parser, 'a valid value')}"
    return None

