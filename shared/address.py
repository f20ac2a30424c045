"""Network endpoints as the services pass them around, and their text form.

`Address` is (host text, port): an IPv4 or IPv6 literal or a name, as sockets take it.
Pure: no I/O (the wire codecs use it too).
"""

from __future__ import annotations

import ipaddress
import socket

Address = tuple[str, int]


def parse_hostport(text: str, *, default_port: int | None = None) -> Address:
    """Parse ``host:port``, ``[v6]:port`` or ``v6`` with a default port."""
    text = text.strip()
    host: str
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]")
        if not sep:
            raise ValueError(f"unclosed bracket in address {text!r}")
        port_text = port_text.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise ValueError(f"address {text!r} needs a port")
        port = default_port
    else:
        try:
            port = int(port_text)
        except ValueError as exc:
            raise ValueError(f"bad port in address {text!r}") from exc
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in address {text!r}")
    if not host:
        raise ValueError(f"address {text!r} has no host")
    return host, port


def format_hostport(addr: Address) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1): what ``--dev`` modes allow."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ip_family(host: str) -> int:
    """4 or 6: the IP family of an address literal (IPv6 literals are the ones with a colon)."""
    return 6 if ":" in host else 4


def normalize_host(host: str) -> str:
    """An IP literal as Python's `ipaddress` writes it (IPv6 compressed, lower case), with
    an IPv4-mapped IPv6 address (``::ffff:192.0.2.1``, RFC 4291 §2.5.5.2) as its plain
    IPv4 form: a v4 client must look the same whichever socket it came in on. A name or
    anything unparsable is returned unchanged."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


V6_SOURCE_PREFIX = 64  # one host (or one home) owns a whole /64 (RFC 4291 §2.5.1, RFC 7934)


_V4_MAPPED = bytes(10) + b"\xff\xff"


def source_key(host: str) -> str:
    """What per-source-IP bounds count by: the IPv4 address itself, or the /64 an IPv6
    address is in (``2001:db8:1:2::/64``), since one IPv6 host can pick any address of
    its /64 and would otherwise get 2^64 budgets. It runs on unauthenticated packets:
    inet_pton/inet_ntop, under 1 us (the ipaddress module took 15)."""
    if ":" not in host:
        return host
    try:
        raw = socket.inet_pton(socket.AF_INET6, host.partition("%")[0])
    except OSError:
        return host
    if raw[:12] == _V4_MAPPED:  # a v4 client seen through a v6 socket: its own key
        return socket.inet_ntop(socket.AF_INET, raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw[:8] + bytes(8)) + "/64"
