"""Calls: create (placement + failover), patch, end — shared by the HTTP and WS front ends.

Creating a call: check the offer (`shared.sdp.check_offer`), resolve the agent, claim the
client secret (single use), choose the region, rank the transceivers, and ask them in turn
(at most `MAX_ATTEMPTS`) until one answers. A transceiver that is down, draining or full is
skipped for the next; one that rejects the offer ends the attempt with its 400. Nobody left:
503 with ``Retry-After`` and the secret is given back. The call map records which
transceiver and session own the call, which credential created it, and the caller's ICE
ufrag. Trickle is answered here; only an ICE restart reaches the transceiver (`trickle`).
"""

from __future__ import annotations

import hmac
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import trace

from firsthop.services.signaling.auth import Principal
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.placement import (
    RegionTable,
    choose_region,
    ingress_for,
    placeable,
    rank,
)
from firsthop.services.signaling.stores import (
    CallStore,
    Directory,
    RecordingIndex,
    RecordingRecord,
    SecretLedger,
)
from firsthop.services.signaling.transceivers import (
    RecordingBody,
    TransceiverClient,
    TransceiverDown,
    TransceiverRejected,
    new_traceparent,
    reason_of,
)
from firsthop.services.signaling.trickle import Fragment, TricklePolicy
from firsthop.shared.metrics import MetricFamily
from firsthop.shared.redis_store import CallRecord, TransceiverInfo
from firsthop.shared.sdp import MAX_SDP_BYTES, SdpError, check_offer
from firsthop.shared.telemetry import context_from_traceparent, traceparent_of, tracer

log = logging.getLogger("firsthop.signaling")
TRACER = tracer("firsthop.signaling")

MAX_ATTEMPTS = 3
NO_CAPACITY_RETRY_AFTER = 2.0


# Exported from the start, at 0, so that the alert rules' rate() sees the first one
# (monitoring/rules.yml): a series that first appears at 1 shows no increase.
ALERTED_EVENTS = frozenset({"redis_errors", "transceiver_failures"})


@dataclass
class Stats:
    requests: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    placement_failures: Counter[str] = field(default_factory=Counter)
    calls_created: Counter[str] = field(default_factory=Counter)
    rate_limited: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)  # redis_errors, tx_failures, ...
    ws_active: int = 0

    def families(self) -> list[MetricFamily]:
        requests = MetricFamily(
            "firsthop_signaling_requests_total", "counter", "HTTP requests by route and status"
        )
        for (method, route, status), n in sorted(self.requests.items()):
            requests.add(n, method=method, route=route, status=str(status))
        failures = MetricFamily(
            "firsthop_signaling_placement_failures_total",
            "counter",
            "Calls that could not be placed, by reason",
        )
        for reason, n in sorted(self.placement_failures.items()):
            failures.add(n, reason=reason)
        created = MetricFamily(
            "firsthop_signaling_calls_created_total", "counter", "Calls created, by region"
        )
        for region, n in sorted(self.calls_created.items()):
            created.add(n, region=region)
        limited = MetricFamily(
            "firsthop_signaling_rate_limited_total", "counter", "Requests refused with 429"
        )
        for scope, n in sorted(self.rate_limited.items()):
            limited.add(n, scope=scope)
        events = MetricFamily("firsthop_signaling_events_total", "counter", "Counted events")
        for name in sorted(self.counters.keys() | ALERTED_EVENTS):
            events.add(self.counters[name], event=name)
        ws = MetricFamily("firsthop_signaling_ws_active", "gauge", "Open WebSocket sessions")
        ws.add(self.ws_active)
        return [requests, failures, created, limited, events, ws]


@dataclass(frozen=True)
class OfferBody:
    sdp: str
    ice_ufrag: str  # the caller's (bundled m-lines share it)


def parse_offer_body(raw: bytes) -> OfferBody:
    """The offer, after the sanity checks (400 with their reason)."""
    if len(raw) > MAX_SDP_BYTES:
        raise Problem(413, f"offer larger than {MAX_SDP_BYTES} bytes")
    try:
        sdp = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Problem(400, "offer is not UTF-8") from None
    try:
        offer = check_offer(sdp)
    except SdpError as exc:
        raise Problem(400, str(exc)) from None
    ufrag = next(m.ufrag for m in offer.media if m.port != 0)  # check_offer: one is live
    return OfferBody(sdp, ufrag or "")


@dataclass
class CallRequest:
    offer: OfferBody
    agent: str | None
    principal: Principal
    region_header: str | None
    client_ip: str | None
    traceparent: str | None = None
    session: dict[str, Any] | None = None  # /v1/realtime calls: the caller's session config
    media: str = "webrtc"  # "rtp": a phone call from a SIP trunk (`sip.py`)
    call_id: str | None = None  # the id to give the call (a phone call's: its webhook's)
    record: bool = False  # the caller asked for a recording (`?record=true`)


def record_flag(value: str | None) -> bool:
    """`?record=` of a call's creation: true/1 asks for a recording, absent/false/0 not."""
    if value is None or value.lower() in ("false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise Problem(400, "record must be true or false")


class Calls:
    def __init__(
        self,
        *,
        own_region: str,
        ingress: Mapping[str, Sequence[str]],
        regions: RegionTable,
        agents: Mapping[str, str],
        directory: Directory,
        store: CallStore,
        ledger: SecretLedger,
        client: TransceiverClient,
        stats: Stats,
        trickle_policy: TricklePolicy | None = None,
        rng: random.Random | None = None,
        ingress_tcp: Mapping[str, Sequence[str]] | None = None,
        recordings: RecordingIndex | None = None,
    ) -> None:
        self.own_region = own_region
        self.recordings = recordings or RecordingIndex(None)
        self.ingress = ingress
        self.ingress_tcp = ingress_tcp or {}
        self.regions = regions
        self.agents = agents
        self.directory = directory
        self.store = store
        self.ledger = ledger
        self.client = client
        self.stats = stats
        self.trickle_policy = trickle_policy or TricklePolicy(refused=stats.rate_limited)
        self._rng = rng or random.Random()

    def agent_url(self, agent: str | None) -> str | None:
        if agent is None or agent == "":
            return None
        url = self.agents.get(agent)
        if url is None:
            known = ", ".join(sorted(self.agents)) or "none configured"
            raise Problem(400, f"unknown agent {agent[:32]!r} (known: {known})")
        return url

    async def create(self, req: CallRequest) -> tuple[CallRecord, str]:
        """Place the call; (record, answer SDP). Raises Problem."""
        agent_url = self.agent_url(req.agent)
        call_id = req.call_id or secrets.token_urlsafe(16)
        principal = req.principal
        if principal.kind == "secret" and principal.secret_id is not None:
            claimed = await self.ledger.claim(
                principal.secret_id, call_id, float(principal.expires_at or 0)
            )
            if not claimed:
                raise Problem(403, "secret already used")
        try:
            with TRACER.start_as_current_span(
                "signaling.place_call",
                context=context_from_traceparent(req.traceparent),
                attributes={"firsthop.call_id": call_id},
            ):
                return await self._place(req, call_id, agent_url)
        except Exception:
            if principal.kind == "secret" and principal.secret_id is not None:
                await self.ledger.release(principal.secret_id)
            raise

    async def _place(
        self, req: CallRequest, call_id: str, agent_url: str | None
    ) -> tuple[CallRecord, str]:
        region, how = choose_region(req.region_header, req.client_ip, self.regions, self.own_region)
        span = trace.get_current_span()
        span.set_attribute("firsthop.region", region)
        span.set_attribute("firsthop.region_source", how)
        # The transceiver's session span joins this trace (§10); with tracing off, a fresh
        # W3C traceparent still ties the services' logs together.
        traceparent = traceparent_of() or new_traceparent(req.traceparent)
        tried: set[str] = set()
        began = self.directory.now()
        for since in (None, began):  # a miss reads the registry again (`Directory.snapshot`)
            snapshot = await self.directory.snapshot(since=since)
            # (first pass only: on the re-read, a recorder that just failed may be gone from
            # the registry, and that is an outage, 503, not a setting)
            recording = req.media if req.record else None
            if (
                recording
                and not tried
                and snapshot
                and all(t.can_record(recording) is False for t in snapshot)
            ):
                self.stats.placement_failures["no_recorder"] += 1
                raise Problem(
                    400, f"recording is off here (no transceiver records {req.media} calls)"
                )
            candidates = [
                tx
                for tx in rank(
                    snapshot,
                    region,
                    self.own_region,
                    tiebreak=lambda _: self._rng.random(),
                    record=recording,
                )
                if tx.id not in tried
            ][: MAX_ATTEMPTS - len(tried)]
            placed = await self._try(req, call_id, agent_url, region, how, traceparent, candidates)
            if placed is not None:
                return placed
            tried.update(tx.id for tx in candidates)
            if self.directory.link is None or len(tried) >= MAX_ATTEMPTS:
                break
            self.stats.counters["placement_re_reads"] += 1
        if not tried:
            self.stats.placement_failures["no_transceiver"] += 1
            raise Problem(503, "no transceiver available", retry_after=NO_CAPACITY_RETRY_AFTER)
        self.stats.placement_failures["all_failed"] += 1
        raise Problem(503, "no transceiver could take the call", retry_after=1.0)

    async def _try(
        self,
        req: CallRequest,
        call_id: str,
        agent_url: str | None,
        region: str,
        how: str,
        traceparent: str,
        candidates: list[TransceiverInfo],
    ) -> tuple[CallRecord, str] | None:
        """Ask `candidates` in turn; the call placed on the first that takes it, or None."""
        span = trace.get_current_span()
        for tx in candidates:
            ingress = ingress_for(self.ingress, region, tx.region)
            if not ingress:
                self.stats.placement_failures["no_ingress"] += 1
                log.error("no --ingress for region %s (nor %s)", region, tx.region)
                continue
            try:
                session_id, answer = await self.client.create_session(
                    tx.api_url,
                    call_id=call_id,
                    offer_sdp=req.offer.sdp,
                    ingress=ingress,
                    agent_url=agent_url,
                    region=tx.region,
                    traceparent=traceparent,
                    session=req.session,
                    ingress_tcp=ingress_for(self.ingress_tcp, region, tx.region),
                    media=req.media,
                    record=req.record,
                )
            except TransceiverRejected as exc:
                self.stats.placement_failures["offer_rejected"] += 1
                raise Problem(400, exc.reason) from None
            except TransceiverDown as exc:
                span.add_event("transceiver_failed", {"firsthop.transceiver": tx.id})
                self.stats.counters["transceiver_failures"] += 1
                log.warning("transceiver %s (%s) failed: %s", tx.id, tx.api_url, exc.reason)
                continue
            self.directory.note_placed(tx.id)
            span.set_attribute("firsthop.transceiver", tx.id)
            record = CallRecord(
                call_id=call_id,
                transceiver_id=tx.id,
                api_url=tx.api_url,
                session_id=session_id,
                owner=req.principal.owner,
                region=region,
                created=time.time(),
                client_ufrag=req.offer.ice_ufrag,
            )
            await self.store.put(record)
            if req.record:
                await self.recordings.put(call_id, RecordingRecord(record.owner, tx.api_url, tx.id))
            self.stats.calls_created[tx.region] += 1
            log.info(
                "call %s: region %s (%s) -> transceiver %s session %s, ingress %s",
                call_id,
                region,
                how,
                tx.id,
                session_id,
                ",".join(ingress),
            )
            return record, answer
        return None

    async def placeable(self) -> int:
        """How many transceivers could take a call now (signaling's readiness): read again
        if the directory's copy shows none."""
        began = self.directory.now()
        usable = placeable(await self.directory.snapshot())
        if not usable and self.directory.link is not None:
            usable = placeable(await self.directory.snapshot(since=began))
        return len(usable)

    async def find(self, call_id: str, principal: Principal) -> CallRecord:
        record = await self.store.get(call_id)
        if record is None:
            raise Problem(404, "no such call")
        if not hmac.compare_digest(principal.owner.encode(), record.owner.encode()):
            raise Problem(403, "this call belongs to another credential")
        return record

    async def recording(self, call_id: str, principal: Principal) -> RecordingBody:
        """A finished recording of `call_id` (streamed; its length if known, its type), for the
        credential that placed the call, or the API key whose ephemeral key did (the rule of
        the Realtime hangup): 404 none, 403 another's, 409 the call still lasts, 503 its
        transceiver cannot be asked."""
        found = await self.recordings.get(call_id)
        if found is None:
            raise Problem(404, "no recording of this call")
        if not principal.owns(found.owner):  # (an API key owns its ephemeral keys' calls)
            raise Problem(403, "this call belongs to another credential")
        try:
            status, body = await self.client.recording(found.api_url, call_id)
        except TransceiverDown:
            raise Problem(
                503, "the recording's transceiver cannot be reached", retry_after=5.0
            ) from None
        if status == 409:
            raise Problem(409, "the call is still being recorded")
        if body is None:
            raise Problem(404, "no recording of this call (it may have expired)")
        return body

    async def trickle(self, record: CallRecord, frag: Fragment) -> bytes | None:
        """Apply a trickle-ice-sdpfrag (or one WebSocket candidate) to a call. Candidates are
        counted and capped here, and go no further: the ICE-lite transceiver never uses them.
        An ICE restart goes to the transceiver, and the answer is its new credentials (an
        sdpfrag); None: nothing to answer (204). Raises Problem (429 when over a limit)."""
        restart = frag.restarts(record.client_ufrag)
        self.trickle_policy.admit(record.call_id, frag, restart=restart)
        self.stats.counters["trickle_candidates"] += len(frag.candidates)
        if not restart:
            return None
        try:
            reply = await self.client.patch_session(
                record.api_url, record.session_id, frag.credentials()
            )
        except TransceiverDown:
            raise await self._unreachable(record) from None
        if reply.status == 404:
            await self.store.delete(record.call_id)
            raise Problem(404, "call has ended")
        if reply.status >= 400:
            raise Problem(reply.status, reason_of(reply.status, reply.body))
        if reply.status == 200:
            self.stats.counters["ice_restarts"] += 1
        if frag.ufrag is not None and frag.ufrag != record.client_ufrag:
            await self.store.put(replace(record, client_ufrag=frag.ufrag))  # 200, or 204: known
        return reply.body if reply.status == 200 else None

    async def end(self, record: CallRecord) -> None:
        try:
            await self.client.delete_session(record.api_url, record.session_id)
        except TransceiverDown:
            raise await self._unreachable(record) from None
        # 204, or 404 (the session already ended on its own): the call is over either way.
        await self.store.delete(record.call_id)

    async def _unreachable(self, record: CallRecord) -> Problem:
        if await self.directory.is_registered(record.transceiver_id) is False:
            # The transceiver left the registry: its sessions went with it.
            await self.store.delete(record.call_id)
            return Problem(404, "call has ended (its transceiver is gone)")
        return Problem(503, "transceiver unreachable", retry_after=1.0)
