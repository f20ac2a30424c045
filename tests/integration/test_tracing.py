"""One trace per session across the services, exported over OTLP/HTTP to a real receiver."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request

from services.call.caller import Caller, ToneTrack
from tests.otlp import OtlpCollector
from tests.support import AgentProcess, RelayProcess, TransceiverProcess, redis_server

ROOT_TRACE = os.urandom(16).hex()
ROOT_SPAN = os.urandom(8).hex()


def test_one_trace_covers_transceiver_relay_and_agent() -> None:
    with OtlpCollector() as otlp, redis_server() as rs:
        relay = RelayProcess(redis_url=rs.url)
        agent = AgentProcess("echo")
        agent.env.update(otlp.env("agent"))
        tx = TransceiverProcess("--redis", rs.url, agent_url=agent.url)
        tx.env.update(otlp.env("transceiver"))
        procs = [relay, agent, tx]
        try:
            relay_env = otlp.env("relay")
            os.environ.update(relay_env)  # RelayProcess takes the test's environment
            try:
                relay.start()
            finally:
                for key in relay_env:
                    os.environ.pop(key)
            agent.start()
            tx.start()
            session: dict[str, str] = {}

            async def signal(offer: str) -> str:
                body = json.dumps(
                    {
                        "call_id": "call-traced",
                        "offer_sdp": offer,
                        "ingress": [f"{relay.listen[0]}:{relay.listen[1]}"],
                    }
                ).encode()
                req = urllib.request.Request(
                    f"{tx.api}/internal/v1/sessions",
                    data=body,
                    method="POST",
                    headers={
                        "Content-Type": "application/json",
                        "traceparent": f"00-{ROOT_TRACE}-{ROOT_SPAN}-01",
                    },
                )
                resp = await asyncio.to_thread(urllib.request.urlopen, req, None, 10)
                data = json.loads(resp.read())
                session["id"] = data["session_id"]
                return str(data["answer_sdp"])

            async def call() -> None:
                c = Caller(ToneTrack(440))
                await c.start(signal)
                await asyncio.wait_for(c.wait_connected(), 10)
                await asyncio.sleep(1.5)
                await asyncio.to_thread(
                    tx.request, "DELETE", f"/internal/v1/sessions/{session['id']}"
                )
                await asyncio.sleep(0.5)
                await c.close()

            asyncio.run(call())
            deadline = time.monotonic() + 10
            names = ("transceiver.session", "transceiver.answer", "relay.flow", "agent.session")
            while time.monotonic() < deadline and not all(otlp.named(n) for n in names):
                time.sleep(0.2)
        finally:
            for p in reversed(procs):
                if p.proc is not None and p.proc.poll() is None:
                    p.proc.terminate()
                    p.proc.wait(10)
        # spans flushed at exit count too
        (tx_span,) = [s for s in otlp.named("transceiver.session") if s.trace_id == ROOT_TRACE]
        assert tx_span.parent_id == ROOT_SPAN
        assert tx_span.attributes["firsthop.call_id"] == "call-traced"
        assert tx_span.attributes["firsthop.session_id"] == session["id"]
        assert tx_span.attributes["firsthop.end_reason"] == "deleted"
        events = [name for name, _ in sorted(tx_span.events, key=lambda e: e[1])]
        milestones = [
            e
            for e in events
            if e in ("ice_connected", "dtls_connected", "first_rtp_in", "first_audio_out")
        ]
        assert milestones[:2] == ["ice_connected", "dtls_connected"]
        assert set(milestones) == {
            "ice_connected",
            "dtls_connected",
            "first_rtp_in",
            "first_audio_out",
        }
        (answer,) = [s for s in otlp.named("transceiver.answer") if s.trace_id == ROOT_TRACE]
        assert answer.parent_id == tx_span.span_id
        (agent_span,) = [s for s in otlp.named("agent.session") if s.trace_id == ROOT_TRACE]
        assert agent_span.parent_id == tx_span.span_id
        assert agent_span.service == "agent"
        flows = [s for s in otlp.named("relay.flow") if s.trace_id == ROOT_TRACE]
        assert flows and all(f.parent_id == tx_span.span_id for f in flows)
        assert flows[0].service == "relay"
        assert flows[0].end_ns >= flows[0].start_ns
