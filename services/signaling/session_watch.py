"""Phone calls whose sessions ended on the edge's side, found with one probe per transceiver.

Signaling's SIP front holds each phone call's dialog; when its transceiver session ends
without the trunk asking (the agent hung up, a drain, the trunk's media stopped), the trunk
must get a BYE. `/v1/ws` probes each of its calls once a second; a SIP front with hundreds
of calls on one transceiver asks that transceiver once per interval about all of them
(`POST /internal/v1/sessions/ended`, at most 1,000 ids a request). A transceiver that does
not answer for `lost_after`, or that left the registry, has lost its calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from firsthop.services.signaling.stores import Directory
from firsthop.services.signaling.transceivers import TransceiverClient, TransceiverDown
from firsthop.shared.redis_store import CallRecord

BATCH = 1000  # ids in one probe (the transceiver's MAX_PROBED)
log = logging.getLogger("firsthop.signaling.sip")


@dataclass(eq=False)
class Watched:
    record: CallRecord
    gone: trio.Event = field(default_factory=trio.Event)
    reason: str = ""


class SessionWatch:
    def __init__(
        self,
        client: TransceiverClient,
        directory: Directory,
        nursery: trio.Nursery,
        *,
        interval: float = 1.0,
        lost_after: float = 5.0,
    ) -> None:
        self.client, self.directory, self.nursery = client, directory, nursery
        self.interval, self.lost_after = interval, lost_after
        self._by_transceiver: dict[str, dict[str, Watched]] = {}  # api_url -> session -> ...

    def watch(self, record: CallRecord) -> Watched:
        watched = Watched(record)
        calls = self._by_transceiver.get(record.api_url)
        if calls is None:
            calls = self._by_transceiver[record.api_url] = {}
            self.nursery.start_soon(self._poll, record.api_url, record.transceiver_id)
        calls[record.session_id] = watched
        return watched

    def unwatch(self, watched: Watched) -> None:
        calls = self._by_transceiver.get(watched.record.api_url)
        if calls is not None and calls.get(watched.record.session_id) is watched:
            del calls[watched.record.session_id]

    async def _poll(self, api_url: str, transceiver_id: str) -> None:
        """While calls are watched there: one probe per interval for all of them."""
        calls = self._by_transceiver[api_url]
        last_ok = trio.current_time()
        try:
            while calls:
                await trio.sleep(self.interval)
                ids = list(calls)
                try:
                    ended: dict[str, str] = {}
                    for i in range(0, len(ids), BATCH):
                        ended.update(await self.client.sessions_ended(api_url, ids[i : i + BATCH]))
                    last_ok = trio.current_time()
                except Exception as exc:  # (TransceiverDown, or anything: never the SIP front)
                    if not isinstance(exc, TransceiverDown):
                        log.exception("watching the calls on %s failed", api_url)
                    lost = trio.current_time() - last_ok >= self.lost_after
                    if not lost and await self.directory.is_registered(transceiver_id) is not False:
                        continue
                    ended = dict.fromkeys(ids, "transceiver_lost")
                for session_id, reason in ended.items():
                    watched = calls.pop(session_id, None)
                    if watched is not None:
                        watched.reason = reason
                        watched.gone.set()
        finally:
            if self._by_transceiver.get(api_url) is calls and not calls:
                del self._by_transceiver[api_url]
            elif calls:  # (cancelled with calls left: the next watch starts a poller again)
                self._by_transceiver.pop(api_url, None)
                for watched in calls.values():
                    watched.reason = watched.reason or "watch_stopped"

    @property
    def transceivers(self) -> int:
        return len(self._by_transceiver)
