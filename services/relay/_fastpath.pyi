"""Types of the C forwarder (`_fastpath.c`, built by setup.py)."""

from typing import Any

MAX_SOURCES: int
MAX_DESTINATIONS: int
SERVE_TIMEOUT: int
SERVE_OTHER: int
SERVE_SLOW: int
SERVE_BUSY: int

class Forwarder:
    errnos: dict[int, int]
    sources_cached: int
    def __init__(
        self,
        count: int,
        size: int,
        headroom: int,
        flow_type: type,
        v4_header: int,
        v6_header: int,
        v6_family_min: int,
        stun_last: int,
        max_datagram: int,
    ) -> None: ...
    def receive(self, fd: int, sources: bool = True, /) -> int: ...
    def datagram(self, i: int, /) -> bytes: ...
    def source(self, i: int, /) -> tuple[str, int]: ...
    def forward_clients(
        self, start: int, flows: dict[Any, Any], upstream_fds: dict[Any, int], now: float, /
    ) -> tuple[int, int, int, int]: ...
    def forward_returns(
        self,
        start: int,
        by_return: dict[bytes, Any],
        peer: tuple[str, int],
        now: float,
        fd4: int,
        fd6: int,
        fd_peer: int,
        /,
    ) -> tuple[int, int, int, int]: ...
    def forward_peers(
        self, start: int, hop_flows: dict[bytes, Any], upstream_fds: dict[Any, int], now: float, /
    ) -> tuple[int, int, int, int]: ...
    def serve(
        self,
        epfd: int,
        timeout: float,
        routes: dict[int, int | tuple[str, int]],
        flows: dict[Any, Any],
        by_return: dict[bytes, Any],
        hop_flows: dict[bytes, Any],
        upstream_fds: dict[Any, int],
        fd4: int,
        fd6: int,
        fd_peer: int,
        busy: bool,
        min_batch: int,
        /,
    ) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int]: ...
    def take_rx_errors(self) -> int: ...
