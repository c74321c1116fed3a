"""Where the gateway may send what an operator points it at (alert webhooks): public addresses only,
unless the operator's allow-list says otherwise (``[alerts] allow_destinations``).

    Destinations.parse(entries)   the allow-list: networks (``10.0.0.0/8``, ``fd00::/8``, one address) and
                                  host names (``receiver.internal``); ValueError naming a bad entry
    d.permits(host, address)      whether a connection to ``address`` (an IP, as ``host`` resolved) may be made
    d.trusts(host)                whether ``host`` is an allow-listed name (its addresses are then not checked)
    public(address)               whether ``address`` is a public unicast address
    metadata_name(host)           whether ``host`` names a cloud's instance metadata service

Refused unless allow-listed: private (10/8, 172.16/12, 192.168/16), shared (100.64/10), loopback,
link-local, unique-local (fc00::/7), site-local, multicast, unspecified, reserved and documentation
addresses, and an IPv6 address that carries one of those as an IPv4 address (mapped ``::ffff:a.b.c.d``,
compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4, Teredo). The cloud metadata services are refused
even when allow-listed (a receiver is never one): their addresses (169.254.169.254, 169.254.170.2,
fd00:ec2::254, 100.100.100.200, ...) and names (``metadata.google.internal``, ...).

Pure: no I/O. The resolution (when a webhook is added, and again at each send, so that a name that
resolves elsewhere later is checked then) is gateway/alerts.py's.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity
        "fd00:ec2::254",  # AWS over IPv6
        "fd00:ec2::23",
        "100.100.100.200",  # Alibaba Cloud
    )
)
METADATA_NAMES = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}
)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_COMPATIBLE = ipaddress.ip_network("::/96")
_HOST = re.compile(
    r"(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*"
)


def host_name(host: str) -> str:
    """A host name as it is compared: lower case, without a trailing dot."""
    return host.lower().rstrip(".")


def address_of(text: str) -> Address | None:
    """``text`` as an IP address (an IPv6 zone left out), else None."""
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _translated(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a connection to ``ip`` reaches: an IPv4-mapped or a NAT64 address's."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _embedded(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, if it carries one."""
    carried = _translated(ip)
    if carried is not None:
        return carried
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def public(ip: Address) -> bool:
    """Whether ``ip`` is a public unicast address (see the module's docstring for what is not)."""
    if isinstance(ip, ipaddress.IPv6Address):
        translated = _translated(ip)  # (a DNS64 answer for a public IPv4-only host is public)
        if translated is not None:
            return public(translated)
        carried = _embedded(ip)
        if ip.is_site_local or (carried is not None and not public(carried)):
            return False
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def metadata_name(host: str) -> bool:
    return host_name(host) in METADATA_NAMES


@dataclass(frozen=True, slots=True)
class Destinations:
    """The operator's allow-list (none: public addresses only)."""

    networks: tuple[Network, ...] = ()
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Destinations:
        networks: list[Network] = []
        names: set[str] = set()
        for entry in entries:
            text = entry.strip()
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
                continue
            except ValueError:
                pass
            name = host_name(text)
            if not _HOST.fullmatch(name) or address_of(name) is not None:
                raise ValueError(
                    f"{entry!r} is neither a network (10.0.0.0/8, fd00::/8, an address) nor a host name"
                )
            names.add(name)
        return cls(tuple(networks), frozenset(names))

    def trusts(self, host: str) -> bool:
        """Whether ``host`` is an allow-listed name (never a metadata service's)."""
        name = host_name(host)
        return name in self.names and name not in METADATA_NAMES

    def permits(self, host: str, address: str) -> bool:
        """Whether a connection to ``address`` (what ``host`` resolved to, or ``host`` itself) may be made."""
        ip = address_of(address)
        if ip is None or metadata_name(host):
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # (the allow-list names IPv4 networks as such)
        if ip in METADATA_ADDRESSES or (
            isinstance(ip, ipaddress.IPv6Address) and _embedded(ip) in METADATA_ADDRESSES
        ):
            return False  # (even allow-listed)
        return self.trusts(host) or public(ip) or any(ip in net for net in self.networks)
