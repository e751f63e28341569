"""Who is calling: the API key of ours a request carries (a credential of another format is not ours), the
client IP (behind trusted proxies only), and the identity strings limits are counted under: `key:<prefix>`,
`user:<pk>`, `ip:<IPv4>` or `ip:<IPv6 network>/<RATELIMIT['IPV6_PREFIX']>`. The engine hashes identities
into fixed-length Redis keys, so no header value ever becomes a Redis key name.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple, cast

from django.http import HttpRequest

from ..conf.snapshot import Snapshot, request_settings
from ..core.apikeys import parse_key
from ..core.clientrules import IPAddress, IPNetwork, parse_network

#: Most X-Forwarded-For entries walked when trusted proxies are a CIDR list.
_MAX_FORWARDED_HOPS = 32
UNKNOWN_IP = "unknown"


@dataclass(frozen=True, slots=True)
class IdentityConfig:
    """The identity settings, parsed once per settings change."""

    api_key_meta: str  # request.META name of RATELIMIT['API_KEY_HEADER']
    trusted_hops: int
    trusted_networks: tuple[IPNetwork, ...]
    ipv6_prefix: int


def _read_identity_config(snapshot: Snapshot) -> IdentityConfig:
    # the values were validated with the other settings (ratelimit_app.conf.settings): this only converts them
    meta = "HTTP_" + snapshot.get("API_KEY_HEADER").upper().replace("-", "_")
    proxies = snapshot.get("TRUSTED_PROXIES")
    hops, networks = 0, cast(tuple[IPNetwork, ...], ())
    if isinstance(proxies, int):
        hops = proxies
    else:
        networks = parse_networks(proxies)
    return IdentityConfig(meta, hops, networks, snapshot.get("IPV6_PREFIX"))


def parse_networks(cidrs: Sequence[str]) -> tuple[IPNetwork, ...]:
    """Networks from CIDR strings ("10.0.0.0/8", "2001:db8::/32", or a single address); host bits are
    ignored, an IPv4-mapped network is its IPv4 network (see `parse_network`). Raises ValueError for an
    invalid one."""
    return tuple(parse_network(cidr) for cidr in cidrs)


def identity_config(snapshot: Snapshot | None = None) -> IdentityConfig:
    """The parsed identity settings (parsed once per settings snapshot)."""
    return (snapshot or request_settings()).derived(_read_identity_config)


class PresentedKey(NamedTuple):
    """One of our API keys as a request presents it: its prefix, and the whole key (unverified until it is
    compared with the stored hash)."""

    prefix: str
    key: str


def api_key_from_request(request: HttpRequest, config: IdentityConfig | None = None) -> PresentedKey | None:
    """The API key of ours the request carries (RATELIMIT['API_KEY_HEADER'], else `Authorization: Bearer`),
    or None. A value is ours when it has the shape of our keys (`apikeys.parse_key`); any other (a JWT, a
    key of the project's own) is left to the project's authentication. `config`: the identity settings
    (default: of now)."""
    meta = request.META
    value = meta.get((config or identity_config()).api_key_meta)
    if value is not None:
        prefix = parse_key(value)
        if prefix is not None:
            return PresentedKey(prefix, value)
    authorization = meta.get("HTTP_AUTHORIZATION")
    if authorization and authorization[:7].lower() == "bearer ":
        value = authorization[7:].strip()
        prefix = parse_key(value)
        if prefix is not None:
            return PresentedKey(prefix, value)
    return None


def offers_credential(request: HttpRequest) -> bool:
    """True when the request carries a value in the API key header or an `Authorization: Bearer` credential,
    ours or not: where RATELIMIT['REQUIRE_API_KEY'] refuses a request without a key of ours, this tells a
    malformed key from a missing one."""
    meta = request.META
    authorization = meta.get("HTTP_AUTHORIZATION")
    return identity_config().api_key_meta in meta or bool(authorization and authorization[:7].lower() == "bearer ")


def _parse_ip(text: str) -> IPAddress | None:
    """The address of `text`, with or without a port ("1.2.3.4", "1.2.3.4:5678", "2001:db8::1",
    "[2001:db8::1]:443", as proxies write X-Forwarded-For entries); an IPv4-mapped address as IPv4.
    None when it is not one."""
    text = text.strip()
    host, port = text, None
    if text.startswith("["):  # an IPv6 address in brackets, maybe with a port
        host, _, rest = text[1:].partition("]")
        if ":" not in host or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    elif text.count(":") == 1:  # an IPv4 address with a port
        host, _, port = text.partition(":")
    if port is not None and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_ip(request: HttpRequest, config: IdentityConfig | None = None) -> str:
    """The client's address: REMOTE_ADDR, unless trusted proxies are configured: with a hop count N, the
    N-th X-Forwarded-For entry from the right; with a CIDR list, the first untrusted address walking it
    from the right. Without trusted proxies the header is ignored (a client cannot choose its address).
    "unknown" when no address can be read. `config`: the identity settings (default: of now)."""
    meta = request.META
    remote = str(meta.get("REMOTE_ADDR") or "")
    config = config or identity_config()
    if config.trusted_hops:
        forwarded = meta.get("HTTP_X_FORWARDED_FOR")
        if not forwarded:
            return remote or UNKNOWN_IP
        entries = str(forwarded).rsplit(",", config.trusted_hops)
        candidate = entries[-config.trusted_hops] if len(entries) >= config.trusted_hops else entries[0]
        address = _parse_ip(candidate)
        return str(address) if address is not None else (remote or UNKNOWN_IP)
    if config.trusted_networks:
        address = _parse_ip(remote)
        if address is None or not _is_trusted(address, config.trusted_networks):
            return remote or UNKNOWN_IP
        forwarded = str(meta.get("HTTP_X_FORWARDED_FOR") or "")
        for entry in reversed(forwarded.split(",")[-_MAX_FORWARDED_HOPS:] if forwarded else []):
            hop = _parse_ip(entry)
            if hop is None:
                break  # a malformed entry: trust nothing left of it; the last trusted hop is what we know
            address = hop
            if not _is_trusted(hop, config.trusted_networks):
                break
        return str(address)
    return remote or UNKNOWN_IP


def address_in(address: str, networks: tuple[IPNetwork, ...]) -> bool:
    """True when `address` (a client IP as `client_ip` returns it) is in one of `networks`."""
    parsed = _parse_ip(address)
    return parsed is not None and _is_trusted(parsed, networks)


def _is_trusted(address: IPAddress, networks: tuple[IPNetwork, ...]) -> bool:
    return any(address.version == network.version and address in network for network in networks)


@lru_cache(maxsize=8192)
def ip_identity(address: str, ipv6_prefix: int = 64) -> str:
    """The identity of a client address: `ip:<IPv4>` or `ip:<IPv6 network>/<ipv6_prefix>`."""
    parsed = _parse_ip(address)
    if parsed is None:
        return f"ip:{UNKNOWN_IP}"
    if isinstance(parsed, ipaddress.IPv6Address):
        return f"ip:{ipaddress.IPv6Network((parsed, ipv6_prefix), strict=False)}"
    return f"ip:{parsed}"


def request_ip_identity(request: HttpRequest, config: IdentityConfig | None = None) -> str:
    """`ip_identity(client_ip(request))` with the configured IPv6 prefix (`config`: the identity settings,
    default: of now)."""
    config = config or identity_config()
    return ip_identity(client_ip(request, config), config.ipv6_prefix)


def key_identity(prefix: str) -> str:
    """The identity of an API key: `key:<prefix>` (never the secret part)."""
    return f"key:{prefix}"


def user_identity(user_pk: Any) -> str:
    """The identity of an authenticated user: `user:<pk>`."""
    return f"user:{user_pk}"


def authenticated_user(request: Any) -> Any:
    """The request's authenticated user, or None (also when no authentication middleware ran)."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return user
    return None


def throttle_ident(request: HttpRequest) -> str | None:
    """The client address as a throttle names it (DRF's and Ninja's `get_ident`): found through
    RATELIMIT['TRUSTED_PROXIES'], an IPv6 address grouped by RATELIMIT['IPV6_PREFIX']; None when the
    request has no address."""
    address = client_ip(request)
    if address == UNKNOWN_IP:
        return None
    return ip_identity(address, identity_config().ipv6_prefix).removeprefix("ip:")
