"""Network endpoints as the services pass them around, and their text form.

`Address` is (host text, port): an IPv4 or IPv6 literal or a name, as sockets take it.
Pure: no I/O (the wire codecs use it too).
"""

from __future__ import annotations

import ipaddress

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
