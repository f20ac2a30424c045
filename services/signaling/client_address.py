"""Who the client is, for per-address budgets and placement: the TCP peer, or, when that peer
is a proxy we trust (``--trusted-proxy CIDR``, an ingress controller), the address it says it
forwarded for; and which region a request may name (``X-Client-Region``: from such a proxy
only, once any is trusted).

Behind a Kubernetes Ingress every request comes from the controller's address, so per-IP
budgets were one budget for every client (a client past it had everyone refused). A trusted
proxy's ``X-Forwarded-For`` is read right to left, skipping the hops that are trusted
proxies themselves; the first address that is not is the client. Entries to its left are the
client's own word, never believed (prepending addresses to the header changes nothing), and
a peer that is not trusted is the client whatever it sends. An entry that is not an address
ends the walk at the hop before it. At most `MAX_HOPS` entries are read.

Pure: strings in, a string out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

MAX_HOPS = 16  # X-Forwarded-For entries read, from the right
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


class ClientAddresses:
    def __init__(self, trusted: Iterable[str] = ()) -> None:
        self.trusted: list[Network] = [ipaddress.ip_network(c, strict=False) for c in trusted]

    def _is_trusted(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(addr.version == n.version and addr in n for n in self.trusted)

    def of(self, peer: str | None, forwarded_for: Iterable[str]) -> str:
        """The client of a request from `peer` carrying these X-Forwarded-For header values
        (each a comma-separated list, in the order received)."""
        peer = peer or ""
        if not self.trusted:
            return peer
        hop = _address(peer)
        if hop is None or not self._is_trusted(hop):
            return peer
        entries = [e for value in forwarded_for for e in value.split(",")][-MAX_HOPS:]
        for entry in reversed(entries):
            addr = _address(entry)
            if addr is None:
                break
            hop = addr
            if not self._is_trusted(addr):
                break
        return str(hop)

    def region_of(self, peer: str | None, header: str | None) -> str | None:
        """The region a request from `peer` names in `X-Client-Region` (a CDN's or an edge's
        word), or None. Where proxies are trusted, only theirs is believed: a client that
        reaches us around them names no region. With none trusted nothing tells an edge
        from a client, and any peer's is."""
        if header is None or not self.trusted:
            return header
        hop = _address(peer or "")
        return header if hop is not None and self._is_trusted(hop) else None
