"""Where Switchyard may send a request a tenant chose the address of (webhooks today).

A tenant admin types a URL; a worker inside the platform's network posts to it. Without a
fence that is a way into everything the worker can reach: the database on 127.0.0.1:5432, the
cloud's metadata service on 169.254.169.254, the cluster's private services. So an outbound
URL must name a public address, checked twice:

* :func:`check_url` when the URL is saved: no ``user:pass@``, no name that is local by
  definition (``localhost``, ``*.localhost``, the metadata service's names), and an address
  written as a number (in any form the C library reads: ``127.0.0.1``, ``2130706433``,
  ``127.1``, ``0x7f.1``, ``[::1]``) must be public. A name is not resolved here: DNS may
  answer differently later anyway.
* :func:`resolve` when the request is made: every address the name resolves to must be public
  (one private answer is enough to refuse), and the caller connects to one of the addresses
  returned, so a second lookup (DNS rebinding) cannot swap in another.

Public means :func:`refusal` finds nothing: not loopback, link-local, private (RFC 1918,
unique-local ``fc00::/7``), unspecified, multicast, reserved, shared (``100.64.0.0/10``) or a
cloud metadata address, and the same for an IPv4 address carried inside an IPv6 one.

A platform setting may name hosts (``host`` or ``host:port``) that skip both checks, e.g. a
receiver inside the platform's own network; the name must match as written in the URL.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from console.exceptions import DomainError

DEFAULT_PORTS = {"http": 80, "https": 443}

#: Names that are local whatever DNS says (RFC 6761), and the metadata services' names.
LOCAL_NAMES = frozenset({
    "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback",
    "metadata.google.internal", "metadata.goog",
})

#: Cloud metadata and host services (AWS, ECS, GCP, Azure, Alibaba, Oracle, AWS over IPv6).
#: Some are public addresses, reachable only from inside that cloud.
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "168.63.129.16", "100.100.100.200", "192.0.0.192",
    "fd00:ec2::254",
))

NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
SHARED = ipaddress.ip_network("100.64.0.0/10")

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(DomainError):
    """The URL or an address it leads to is not one Switchyard sends requests to."""


class Unresolved(Exception):
    """The host name has no address now (DNS failed): worth another try later."""


@dataclass(frozen=True)
class Target:
    """A checked URL: the host as the HTTP client reads it, the port, and whether a platform
    setting allows the host past the address checks."""

    url: httpx.URL
    host: str
    port: int
    allowed: bool


def refusal(address: str | IP) -> str:
    """Why ``address`` is not public (``"10.0.0.1 is private"``), or ``""`` when it is."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    shown = str(ip)
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ipaddress.IPv6Address(int(ip))  # without a %zone
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None:
            # An IPv4 address inside an IPv6 one reaches that IPv4 address.
            kind = _kind(inner)
            return f"{shown} is {kind} (it carries {inner})" if kind else ""
        if ip in NAT64_LOCAL:
            return f"{shown} is reserved"
    kind = _kind(ip)
    return f"{shown} is {kind}" if kind else ""


def _kind(ip: IP) -> str:
    if ip in METADATA:
        return "a cloud metadata address"
    checks = (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
              ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
              ("reserved", ip.is_reserved), ("private", ip.is_private),
              ("shared (carrier-grade NAT)", ip in SHARED), ("not public", not ip.is_global))
    return next((kind for kind, hit in checks if hit), "")


def _allowed_entry(entry: str) -> tuple[str, int | None] | None:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` as (host, port); None if malformed."""
    entry = entry.strip().lower()
    port = ""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                return None
            port = rest[1:]
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    else:
        host = entry  # a name, or a bare IPv6 address
    if port and not port.isdigit():
        return None
    return (host.rstrip("."), int(port) if port else None) if host else None


def is_allowed(host: str, port: int, allowed_hosts: Iterable[str]) -> bool:
    """Whether ``host:port`` is named in ``allowed_hosts`` (``host`` alone allows any port)."""
    host = host.lower().rstrip(".")
    for entry in allowed_hosts:
        parsed = _allowed_entry(entry)
        if parsed and parsed[0] == host and parsed[1] in (None, port):
            return True
    return False


def _numeric(host: str) -> str | None:
    """The address a host written as a number stands for (any form the C library reads:
    ``2130706433``, ``127.1``, ``0x7f.1``), or None for a name. Never asks DNS."""
    try:
        infos = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    return str(infos[0][4][0]) if infos else None


def check_url(url: str, *, allowed_hosts: Iterable[str] = (), field: str = "url") -> Target:
    """Refuse (Refused on ``field``) a URL with credentials, a local name, or an address that
    is not public; the host is not resolved here (see :func:`resolve`)."""
    try:
        parsed = httpx.URL(url)
        scheme = parsed.scheme
        port = parsed.port or DEFAULT_PORTS.get(scheme, 0)
        authority = urlsplit(url).netloc
    except (httpx.InvalidURL, ValueError) as exc:
        raise Refused(f"not a valid URL ({exc})", field=field) from None
    if "@" in authority or parsed.userinfo:
        raise Refused("must not carry a user name or password (user:pass@)", field=field)
    host = parsed.raw_host.decode("ascii").lower()
    if not host:
        raise Refused("must name a host", field=field)
    if "%" in host:
        raise Refused("must not name a network interface (an IPv6 zone, %)", field=field)
    target = Target(url=parsed, host=host, port=port,
                    allowed=is_allowed(host, port, allowed_hosts))
    if target.allowed:
        return target
    name = host.rstrip(".")
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        raise Refused(f"{name} is a local host name: give a public host", field=field)
    address = _numeric(host)
    why = refusal(address) if address else ""
    if why:
        raise Refused(f"{why}: give a public address", field=field)
    return target


def resolve(url: str, *, allowed_hosts: Iterable[str] = (), field: str = "url") -> tuple[
    Target, list[str]
]:
    """Check ``url`` again and look its host up: (the target, its addresses to connect to, in
    the resolver's order). Refused when any address is not public; Unresolved when DNS has no
    answer. An allowed host is not looked up here (the list is empty: connect as usual)."""
    target = check_url(url, allowed_hosts=allowed_hosts, field=field)
    if target.allowed:
        return target, []
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Unresolved(f"could not resolve {target.host}: {_reason(exc)}") from None
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    for address in addresses:
        why = refusal(address)
        if why:
            raise Refused(f"address refused: {why}", field=field)
    if not addresses:
        raise Unresolved(f"could not resolve {target.host}: no address")
    return target, addresses


def pinned(target: Target, address: str) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
    """The URL to request so that the connection goes to ``address`` (checked by
    :func:`resolve`) and no other, with the ``Host`` header and the TLS server name (for SNI
    and the certificate check) of the name in the URL: (url, headers, extensions)."""
    url = target.url.copy_with(host=address)
    headers = {"Host": target.url.netloc.decode("ascii")}
    extensions = {"sni_hostname": target.host} if target.url.scheme == "https" else {}
    return url, headers, extensions


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno -2] Name or service not known" reads better without the number.
    if text.startswith("[Errno ") and "] " in text:
        text = text.split("] ", 1)[1]
    return text
