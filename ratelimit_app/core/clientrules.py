"""Allow and deny lists (`ClientRule` rows as request handling sees them), applied before any Redis call
(docs/plans.md, "Allow and deny lists"): a deny-listed network or key prefix is refused with 403; an
allow-listed network or *verified* key is never limited; a request both lists match is denied."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from .logs import log_once

#: An address or network of either family (client addresses, allow/deny lists, trusted proxies).
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW = "allow"
DENY = "deny"

#: The IPv4-mapped IPv6 addresses (::ffff:a.b.c.d): a client from one of them is matched as a.b.c.d.
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def parse_network(text: str) -> IPNetwork:
    """The network `text` names (CIDR or one address; host bits ignored), an IPv4-mapped IPv6 network
    as the IPv4 network it maps (`::ffff:10.1.2.0/120` is `10.1.2.0/24`), since client addresses
    are matched as IPv4 when they are mapped ones. Raises ValueError for an invalid one."""
    network = ipaddress.ip_network(text.strip(), strict=False)
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        mapped = network.network_address.ipv4_mapped
        assert mapped is not None  # inside ::ffff:0:0/96
        return ipaddress.IPv4Network((mapped, network.prefixlen - 96))
    return network


@dataclass(frozen=True, slots=True)
class ClientRules:
    """The enabled rules, compiled: networks per action, and API key prefixes per action."""

    allow_networks: tuple[IPNetwork, ...] = ()
    deny_networks: tuple[IPNetwork, ...] = ()
    allow_keys: frozenset[str] = frozenset()
    deny_keys: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        """True when there is no rule at all (requests skip every check)."""
        return not (self.allow_networks or self.deny_networks or self.allow_keys or self.deny_keys)

    @property
    def has_networks(self) -> bool:
        """True when some rule names a network (the client address must be parsed)."""
        return bool(self.allow_networks or self.deny_networks)

    def for_address(self, address: str) -> str | None:
        """DENY, ALLOW or None for a client address ("unknown" or garbage matches nothing)."""
        try:
            parsed: IPAddress = ipaddress.ip_address(address)
        except ValueError:
            return None
        mapped = getattr(parsed, "ipv4_mapped", None)
        if mapped is not None:
            parsed = mapped  # ::ffff:10.0.0.1 is 10.0.0.1
        if any(parsed in network for network in self.deny_networks):
            return DENY
        if any(parsed in network for network in self.allow_networks):
            return ALLOW
        return None

    @classmethod
    def build(cls, rows: Iterable[tuple[str, str, str | None]]) -> ClientRules:
        """Compile (action, network, api key prefix) rows. A rule whose network does not parse is skipped
        alone and logged once (the model validates networks, so only rows written around the admin
        can be wrong; `manage.py check` reports them, ratelimit.E032)."""
        networks: dict[str, list[IPNetwork]] = {ALLOW: [], DENY: []}
        keys: dict[str, set[str]] = {ALLOW: set(), DENY: set()}
        for action, network, prefix in rows:
            if action not in networks:
                continue  # the database refuses any other action
            if network:
                try:
                    networks[action].append(parse_network(network))
                except ValueError as exc:
                    log_once("ratelimit.rule_skipped", logging.ERROR, action=action, network=network, problem=str(exc))
                    continue
            elif prefix:
                keys[action].add(prefix)
        return cls(tuple(networks[ALLOW]), tuple(networks[DENY]), frozenset(keys[ALLOW]), frozenset(keys[DENY]))


