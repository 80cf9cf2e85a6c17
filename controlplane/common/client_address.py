"""The client's address: one rule for every place that records or checks it (the audit trail, the
``/metrics`` allow-list, agents' registration and its per-address throttle).

Behind a load balancer the TCP peer (``REMOTE_ADDR``) is the balancer, and the client is in the
``X-Forwarded-For`` it appends. That header is anyone's to write, so it is read only when the peer
is in ``MOTLEY_TRUSTED_PROXIES`` (networks or host names; default none), and then from the right:
each hop a trusted proxy appended is skipped, and the first address no trusted proxy owns is the
client's. A client that sends its own ``X-Forwarded-For`` through the balancer only adds entries left
of the one the balancer wrote, which are never reached. A malformed entry ends the walk: the address
is then the last trusted hop's, never a string a client chose.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


HOST_NAME = re.compile(r"(?=.*[A-Za-z])[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


@lru_cache(maxsize=16)
def networks(entries: tuple[str, ...], setting: str) -> tuple[Network, ...]:
    """``entries`` parsed as networks, or host names resolved to their addresses (a compose service's
    name: containers get their addresses when they start, so a balancer's is known by name only).
    A name is resolved once, at the first request that needs it; a bad entry is an
    ImproperlyConfigured naming ``setting``, and a name that does not resolve is tried again next time."""
    parsed: list[Network] = []
    for entry in entries:
        try:
            parsed.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError as exc:
            if not HOST_NAME.fullmatch(entry):
                raise ImproperlyConfigured(f"{setting}: {exc}") from None
        try:
            found = {info[4][0] for info in socket.getaddrinfo(entry, None, proto=socket.IPPROTO_TCP)}
        except OSError as exc:
            raise ImproperlyConfigured(f"{setting}: the host name {entry!r} does not resolve: {exc}") \
                from None
        parsed.extend(ipaddress.ip_network(address.split("%", 1)[0]) for address in sorted(found))
    return tuple(parsed)


def parse_address(text: str) -> Address | None:
    """An IP address (an IPv4-mapped IPv6 one as its IPv4 address, a zone dropped), or None."""
    try:
        ip = ipaddress.ip_address(text.strip().split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def in_networks(ip: Address | None, nets: tuple[Network, ...]) -> bool:
    return ip is not None and any(ip.version == net.version and ip in net for net in nets)


def address_allowed(address: str, allow: tuple[str, ...] | list[str], *, setting: str) -> bool:
    """Whether ``address`` is in a network of ``allow`` (the setting ``setting`` names)."""
    return in_networks(parse_address(address), networks(tuple(allow), setting))


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address as text (see the module's rule), or None where the server gave none
    (a unix socket's peer)."""
    peer = parse_address(request.META.get("REMOTE_ADDR") or "")
    if peer is None:
        return None
    trusted = networks(tuple(settings.MOTLEY_TRUSTED_PROXIES), "MOTLEY_TRUSTED_PROXIES")
    if not in_networks(peer, trusted):
        return str(peer)
    hops = [h for part in request.headers.get("X-Forwarded-For", "").split(",") if (h := part.strip())]
    client = peer
    for hop in reversed(hops):
        ip = parse_address(hop)
        if ip is None:
            break
        client = ip
        if not in_networks(ip, trusted):
            break
    return str(client)
