"""The ICE connection aiortc's transports run on: ours, not aioice's (one ICE agent a call).

aiortc's `RTCIceGatherer` and `RTCIceTransport` drive an `aioice.Connection`: they gather
with it, read its credentials and candidates for the answer, `connect()` it, and then
the DTLS transport sends and receives through it. `LiteConnection` is that object for
an ICE-lite agent on the shared socket. It speaks no STUN at all: the session table's
`LiteIce` (`ice_lite.py`) authenticates every check, answers it, and chooses the path.
This object only:

* says what goes in the answer: our credentials (the session's route token and password;
  `restart` replaces them) and our host candidates, i.e. the relay ingress address(es),
  with its ICE-TCP ingress as `tcptype passive` candidates of lower priority (RFC 6544 §4.2);
* completes `connect()` once the table has selected a path (the caller's first
  authenticated check): DTLS may start then;
* carries DTLS records both ways: `send` goes to the table's selected path through the
  shared socket, and `recv` takes what `deliver` queued. The queue is bounded
  (`MAX_QUEUE`); past it a record is dropped, and DTLS retransmits;
* reports its close to aiortc's monitor (`get_event` -> `ConnectionClosed`).

The attributes and coroutines are the ones aiortc 1.16 uses of `aioice.Connection`
(`rtcicetransport.py`); `hooks.use_lite_connection` puts one in place of aioice's, and
the pinned-version check guards it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aioice
from aioice.candidate import candidate_foundation, candidate_priority

from firsthop.shared.address import Address

MAX_QUEUE = 256  # DTLS records waiting for aiortc's DTLS task
# RFC 6544 §4.2: local preference = 2^13 * direction-pref + other-pref, with passive's
# direction-pref of 4 (below active's 6; we are never active), which ranks them under the
# UDP host candidate's 65535: a caller that can use UDP does.
TCP_PASSIVE_LOCAL_PREF = (1 << 13) * 4 + 8191


class LiteConnection:
    ice_controlling = False  # a lite agent is always controlled (RFC 8445 §6.1.1)

    def __init__(
        self,
        local: tuple[str, str],
        *,
        candidates: list[Address],
        tcp_candidates: list[Address] | None = None,
        send: Callable[[bytes, Address], None],
        selected: Callable[[], Address | None],
    ) -> None:
        self.local_username, self.local_password = local
        self.remote_username: str | None = None
        self.remote_password: str | None = None
        self.remote_is_lite = False
        self.remote_candidates: list[aioice.Candidate] = []
        self._send = send
        self._selected = selected
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(MAX_QUEUE + 1)  # None: closed
        self._path = asyncio.Event()  # the table selected a path
        self._closed = asyncio.Event()
        self.dropped = 0  # DTLS records past the queue's bound
        self.local_candidates = [
            aioice.Candidate(
                foundation=candidate_foundation("host", "udp", host),
                component=1,
                transport="udp",
                priority=candidate_priority(1, "host"),
                host=host,
                port=port,
                type="host",
            )
            for host, port in candidates
        ] + [
            aioice.Candidate(
                foundation=candidate_foundation("host", "tcp", host),
                component=1,
                transport="tcp",
                priority=candidate_priority(1, "host", TCP_PASSIVE_LOCAL_PREF),
                host=host,
                port=port,
                type="host",
                tcptype="passive",
            )
            for host, port in tcp_candidates or ()
        ]

    # -- what the session tells it ------------------------------------------------------------

    def path_selected(self) -> None:
        """The table selected a path (or moved it): `connect()` may complete."""
        self._path.set()

    def deliver(self, data: bytes) -> bool:
        """A DTLS record from the validated caller; False if the queue is full (dropped)."""
        if self._closed.is_set():
            return True
        if self._queue.qsize() >= MAX_QUEUE:
            self.dropped += 1
            return False
        self._queue.put_nowait(data)
        return True

    def restart(self, local: tuple[str, str], remote: tuple[str, str]) -> None:
        """ICE restart (RFC 8445 §9): new credentials both ways; the path stays."""
        self.local_username, self.local_password = local
        self.remote_username, self.remote_password = remote

    # -- what aiortc calls --------------------------------------------------------------------

    async def gather_candidates(self) -> None:
        return None  # the candidates are the relay's ingress, known from the start

    async def add_remote_candidate(self, candidate: aioice.Candidate | None) -> None:
        return None  # a lite agent never checks toward the caller's candidates

    async def connect(self) -> None:
        """Completed once the caller's first authenticated check chose a path (the table
        decides; a lite agent sends no checks of its own)."""
        closed = asyncio.ensure_future(self._closed.wait())
        path = asyncio.ensure_future(self._path.wait())
        try:
            await asyncio.wait({closed, path}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            path.cancel()
        if not self._path.is_set():
            raise ConnectionError("ICE closed before a path was selected")

    async def send(self, data: bytes) -> None:
        path = self._selected()
        if path is not None and not self._closed.is_set():
            self._send(data, path)

    async def recv(self) -> bytes:
        data = None if self._closed.is_set() else await self._queue.get()
        if data is None:
            raise ConnectionError("Cannot receive data, not connected")
        return data

    async def get_event(self) -> aioice.ConnectionClosed | None:
        await self._closed.wait()
        return aioice.ConnectionClosed()

    async def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)  # a `recv` waiting now learns it, as aioice's does
