"""One trace per session across the four services, exported over OTLP/HTTP to a real
receiver: signaling -> transceiver (setup events in order) -> agent, and the relay's
first-packet span joined through `firsthop:trace:{ufrag}`."""

from __future__ import annotations

import asyncio
import os
import urllib.request

from firsthop.services.call.caller import Caller, ToneTrack
from tests.integration.test_transceiver import hears
from tests.otlp import OtlpCollector, SpanRecord
from tests.support import (
    AgentProcess,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    eventually,
    redis_server,
    wait_until,
)

ROOT_TRACE = os.urandom(16).hex()
ROOT_SPAN = os.urandom(8).hex()
SETUP_EVENTS = ("ice_connected", "dtls_connected", "first_rtp_in", "first_audio_out")


def test_one_trace_covers_signaling_transceiver_relay_and_agent() -> None:
    with OtlpCollector() as otlp, redis_server() as rs:
        relay = RelayProcess(redis_url=rs.url)
        agent = AgentProcess("echo")
        agent.env.update(otlp.env("agent"))
        tx = TransceiverProcess("--redis", rs.url, "--region", "a", agent_url=agent.url)
        tx.env.update(otlp.env("transceiver"))
        procs: list[RelayProcess | AgentProcess | TransceiverProcess | SignalingProcess] = [
            relay,
            agent,
            tx,
        ]
        session: dict[str, str] = {}
        try:
            os.environ.update(otlp.env("relay"))  # RelayProcess takes the test's environment
            try:
                relay.start()
            finally:
                for key in otlp.env("relay"):
                    os.environ.pop(key)
            agent.start()
            tx.start()
            sig = SignalingProcess("--redis", rs.url, "--ingress", f"a=127.0.0.1:{relay.listen[1]}")
            sig.env.update(otlp.env("signaling"))
            procs.append(sig)
            sig.start()

            def post(offer: str) -> str:
                req = urllib.request.Request(
                    f"{sig.url}/v1/calls",
                    data=offer.encode(),
                    method="POST",
                    headers={
                        "Content-Type": "application/sdp",
                        "Authorization": f"Bearer {sig.API_KEY}",
                        "traceparent": f"00-{ROOT_TRACE}-{ROOT_SPAN}-01",
                    },
                )
                with urllib.request.urlopen(req, timeout=10) as resp:
                    session["location"] = resp.headers["Location"]
                    return str(resp.read().decode())

            def delete() -> None:
                req = urllib.request.Request(
                    sig.url + session["location"],
                    method="DELETE",
                    headers={"Authorization": f"Bearer {sig.API_KEY}"},
                )
                with urllib.request.urlopen(req, timeout=10):
                    pass

            async def call() -> None:
                c = Caller(ToneTrack(440))

                async def signal(offer: str) -> str:
                    return await asyncio.to_thread(post, offer)

                await c.start(signal)
                await asyncio.wait_for(c.wait_connected(), 10)
                # the echo is back: every setup milestone is behind us (the last one is the
                # transceiver's first agent audio out)
                await eventually(lambda: hears(c, 440))
                await asyncio.to_thread(delete)  # ends the session at once, reason "deleted"
                await c.close()

            asyncio.run(call())
            names = (
                "signaling.place_call",
                "transceiver.session",
                "transceiver.answer",
                "relay.flow",
                "agent.session",
            )
            wait_until(lambda: all(otlp.named(n) for n in names))
        finally:
            for p in reversed(procs):
                if p.proc is not None and p.proc.poll() is None:
                    p.proc.terminate()
                    p.proc.wait(10)

        def one(name: str) -> SpanRecord:
            (span,) = [s for s in otlp.named(name) if s.trace_id == ROOT_TRACE]
            return span

        place = one("signaling.place_call")
        assert place.parent_id == ROOT_SPAN  # the caller's own trace context is continued
        assert place.service == "signaling"
        tx_span = one("transceiver.session")
        assert tx_span.parent_id == place.span_id
        assert tx_span.attributes["firsthop.call_id"] == session["location"].rsplit("/", 1)[1]
        assert tx_span.attributes["firsthop.end_reason"] == "deleted"
        # the call's media, as the core counted it, on its span
        media = {k: v for k, v in tx_span.attributes.items() if k.startswith("firsthop.media.")}
        assert int(media["firsthop.media.rtp_packets_in"]) > 20, media
        assert int(media["firsthop.media.agent_frames_played"]) > 20, media
        assert int(media["firsthop.media.srtp_auth_fail"]) == 0
        assert 0 <= float(media["firsthop.media.jitter_s"]) < 0.1, media
        events = [name for name, _ in sorted(tx_span.events, key=lambda e: e[1])]
        milestones = [e for e in events if e in SETUP_EVENTS]
        assert milestones[:2] == ["ice_connected", "dtls_connected"]
        assert set(milestones) == set(SETUP_EVENTS)
        assert one("transceiver.answer").parent_id == tx_span.span_id
        agent_span = one("agent.session")
        assert agent_span.parent_id == tx_span.span_id and agent_span.service == "agent"
        flows = [s for s in otlp.named("relay.flow") if s.trace_id == ROOT_TRACE]
        assert flows and all(f.parent_id == tx_span.span_id for f in flows)
        assert flows[0].service == "relay" and flows[0].end_ns >= flows[0].start_ns
