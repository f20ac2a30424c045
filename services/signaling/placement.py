"""Placement: which region serves a call, and which transceivers to ask, in order (§4).

Pure: no I/O, no clock. The region comes from the request context, in this order: the
``X-Client-Region`` header (set by a CDN or edge), the CIDR → region table on the client IP,
then the signaling server's own region. Transceivers come from the registry hashes
(`firsthop:transceiver:{id}`, §9) or from the static ``--transceiver`` list.

Ranking: transceivers that are draining or full are never asked. Those of the chosen region
come first, least loaded first (sessions / capacity); when that region has none, or all of
them fail, the own region's follow. Equal loads are shuffled by the caller's `tiebreak`, so
replicas working from the same one-second-old snapshot do not all pile onto one transceiver.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from firsthop.shared.redis_store import TransceiverInfo

# Region names travel in a header: keep them to a safe, short alphabet.
REGION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class RegionTable:
    """Client IP → region by longest-prefix match over ``--region-cidr CIDR=REGION``."""

    def __init__(self, entries: Iterable[tuple[str, str]] = ()) -> None:
        table: list[tuple[IpNetwork, str]] = []
        for cidr, region in entries:
            if not REGION_NAME.match(region):
                raise ValueError(f"bad region name {region!r}")
            table.append((ipaddress.ip_network(cidr, strict=False), region))
        # Longest prefix first, so the first match is the most specific.
        self._table = sorted(table, key=lambda item: -item[0].prefixlen)

    def lookup(self, ip: str | None) -> str | None:
        if not ip:
            return None
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return None
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        for network, region in self._table:
            if addr.version == network.version and addr in network:
                return region
        return None


def choose_region(
    header: str | None, client_ip: str | None, table: RegionTable, own: str
) -> tuple[str, str]:
    """(region, how it was chosen: "header" | "cidr" | "own")."""
    if header is not None:
        value = header.strip()
        if REGION_NAME.match(value):
            return value, "header"
    found = table.lookup(client_ip)
    if found is not None:
        return found, "cidr"
    return own, "own"


def placeable(
    transceivers: Iterable[TransceiverInfo], *, record: str | None = None
) -> list[TransceiverInfo]:
    """Those that may be asked to take a call: not draining, not full, and for a call to be
    recorded (`record`: its media, "webrtc" or "rtp") not one known not to record it."""
    return [
        t
        for t in transceivers
        if not t.draining and not t.full and not (record and t.can_record(record) is False)
    ]


def rank(
    transceivers: Sequence[TransceiverInfo],
    region: str,
    own_region: str,
    *,
    tiebreak: Callable[[TransceiverInfo], float] | None = None,
    record: str | None = None,
) -> list[TransceiverInfo]:
    """Transceivers to ask, in order: the region's least loaded first, then own region's; for
    a call to be recorded, those known to record before those that may (one of those without
    a --record-dir would refuse the call outright)."""
    usable = placeable(transceivers, record=record)

    def key(t: TransceiverInfo) -> tuple[bool, float, float, str]:
        unsure = record is not None and t.can_record(record) is not True
        return (unsure, t.load, tiebreak(t) if tiebreak is not None else 0.0, t.id)

    first = sorted((t for t in usable if t.region == region), key=key)
    if region == own_region:
        return first
    fallback = sorted((t for t in usable if t.region == own_region), key=key)
    return first + fallback


def ingress_for(
    ingress: Mapping[str, Sequence[str]], client_region: str, transceiver_region: str
) -> list[str]:
    """The relay ingress to advertise: the client's region's (the entry point nearest the
    client; Global Relay carries media on to another cluster), else the transceiver's."""
    return list(ingress.get(client_region) or ingress.get(transceiver_region) or [])
