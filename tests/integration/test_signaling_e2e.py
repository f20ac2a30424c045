"""Whole calls through signaling: aiortc caller → signaling → transceiver → relay → echo agent.

Two regions on loopback: relay A (cluster 1, with relay B as its Global Relay peer for
cluster 2) and relay B (cluster 2); transceiver tx-a (region a, cluster 1) and tx-b (region
b, cluster 2); one signaling server of region a that knows both regions' ingress and maps
127.0.0.2 to region b. A caller steered to b gets B's ingress in its answer and its media
lands on tx-b.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis as redis_lib

from firsthop.services.call.caller import Caller, ToneTrack, dominant, tone_power
from firsthop.shared.metrics import parse_text
from tests.integration.test_transceiver import heard, hears
from tests.support import (
    AgentProcess,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    eventually,
    redis_server,
    start_all,
    wait_until,
)
from tests.unit.test_signaling_app import OFFER

KEY = SignalingProcess.API_KEY
FREQS = [440.0, 550.0, 660.0, 770.0]


@dataclass
class Regions:
    r: redis_lib.Redis
    relay_a: RelayProcess
    relay_b: RelayProcess
    tx_a: TransceiverProcess
    tx_b: TransceiverProcess
    sig: SignalingProcess


@pytest.fixture(scope="module")
def regions() -> Iterator[Regions]:
    with redis_server() as redis:
        relay_b = RelayProcess(cluster=2)
        relay_a = RelayProcess("--peer", f"2={relay_b.internal[0]}:{relay_b.internal[1]}")
        agent = AgentProcess("echo")
        tx_a = TransceiverProcess("--redis", redis.url, "--region", "a", tx_id="tx-a")
        tx_b = TransceiverProcess("--redis", redis.url, "--region", "b", tx_id="tx-b", cluster=2)
        sig = SignalingProcess(
            *["--redis", redis.url, "--agent-url", f"echo={agent.url}", "--ip-rate", "0"],
            *["--ingress", f"a={relay_a.listen[0]}:{relay_a.listen[1]}"],
            *["--ingress", f"b={relay_b.listen[0]}:{relay_b.listen[1]}"],
            *["--region-cidr", "127.0.0.2/32=b"],
            *["--trusted-proxy", "127.0.0.1/32"],  # (an edge: its X-Client-Region is believed)
        )
        procs = [relay_a, relay_b, agent, tx_a, tx_b, sig]
        start_all(*procs)
        r = redis_lib.Redis.from_url(redis.url, decode_responses=True)
        try:
            wait_until(lambda: httpx.get(f"{sig.url}/healthz").json()["transceivers"] == 2)
            yield Regions(r, relay_a, relay_b, tx_a, tx_b, sig)
        finally:
            r.close()
            for p in procs:
                p.kill()


def candidate_ports(sdp: str) -> set[int]:
    return {int(m) for m in re.findall(r"a=candidate:\S+ 1 udp \d+ \S+ (\d+) typ", sdp)}


def packets_in(tx: TransceiverProcess) -> float:
    status, body = tx.request("GET", "/metrics")  # not under /internal/: no token needed
    assert status == 200
    key = ("firsthop_transceiver_packets_total", frozenset({("direction", "in")}))
    return parse_text(body.decode()).get(key, 0.0)


async def call_and_listen(
    sig: SignalingProcess, freq: float, until: Callable[[], bool], **headers: str
) -> Caller:
    """Place a call with a tone through signaling, listen until the echo is heard and
    `until()` (blocking: a metric of the call's path) holds, then hang up (DELETE)."""
    async with httpx.AsyncClient(base_url=sig.url, timeout=20) as http:
        resp = await http.post("/v1/client_secrets", headers={"Authorization": f"Bearer {KEY}"})
        secret = resp.json()["value"]  # the browser flow: the backend mints, the page calls
        auth = {"Authorization": f"Bearer {secret}"}
        location = ""

        async def signal(offer: str) -> str:
            nonlocal location
            resp = await http.post(
                "/v1/calls?agent=echo",
                content=offer,
                headers={"Content-Type": "application/sdp", **auth, **headers},
            )
            assert resp.status_code == 201, resp.text
            location = resp.headers["location"]
            return resp.text

        caller = Caller(ToneTrack(freq))
        try:
            await caller.start(signal)
            await asyncio.wait_for(caller.wait_connected(), 15)
            await listen(caller, freq, until)
        finally:
            await caller.close()
        assert (await http.delete(location, headers=auth)).status_code == 204
        return caller


async def listen(caller: Caller, freq: float, until: Callable[[], bool]) -> None:
    await eventually(lambda: hears(caller, freq))
    await asyncio.to_thread(wait_until, until)


def assert_heard(caller: Caller, freq: float) -> None:
    """The call's own tone, at the end too (`listen` has already waited until a whole 0.5 s
    of it was clear): the last 0.5 s is that tone, not another call's, and not silence
    (~1e-8). On a loaded machine a frame or two of it may be late: a lower bar than `hears`."""
    tail = heard(caller)  # the last 0.5 s
    assert dominant(tail, FREQS) == freq
    assert tone_power(tail, freq) > 0.0002


def test_call_hears_its_own_tone_back_through_the_own_region(regions: Regions) -> None:
    before = packets_in(regions.tx_a)
    caller = asyncio.run(
        call_and_listen(regions.sig, 550.0, lambda: packets_in(regions.tx_a) > before + 50)
    )
    assert candidate_ports(caller.result.answer_sdp) == {regions.relay_a.listen[1]}
    assert_heard(caller, 550.0)
    assert packets_in(regions.tx_a) > before + 50
    assert regions.relay_a.metric("firsthop_relay_flows") >= 1


def test_region_b_from_the_header_gets_bs_ingress_and_transceiver(regions: Regions) -> None:
    before_a, before_b = packets_in(regions.tx_a), packets_in(regions.tx_b)
    caller = asyncio.run(
        call_and_listen(
            regions.sig,
            660.0,
            lambda: packets_in(regions.tx_b) > before_b + 50,
            **{"X-Client-Region": "b"},
        )
    )
    assert candidate_ports(caller.result.answer_sdp) == {regions.relay_b.listen[1]}
    assert_heard(caller, 660.0)
    assert packets_in(regions.tx_b) > before_b + 50  # media reached B's transceiver
    assert packets_in(regions.tx_a) == before_a  # and not A's


def test_region_from_the_cidr_table_and_fallback_to_own(regions: Regions) -> None:
    def place(local: str, **headers: str) -> tuple[set[int], str]:
        transport = httpx.HTTPTransport(local_address=local)
        with httpx.Client(base_url=regions.sig.url, transport=transport, timeout=20) as http:
            resp = http.post(
                "/v1/calls",
                content=OFFER,
                headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {KEY}"}
                | headers,
            )
            assert resp.status_code == 201, resp.text
            call_id = resp.headers["location"].rsplit("/", 1)[1]
            tx_id = regions.r.hget(f"firsthop:call:{call_id}", "transceiver_id")
            delete = http.delete(
                resp.headers["location"], headers={"Authorization": f"Bearer {KEY}"}
            )
            assert delete.status_code == 204
            return candidate_ports(resp.text), str(tx_id)

    b_port, a_port = regions.relay_b.listen[1], regions.relay_a.listen[1]
    assert place("127.0.0.2") == ({b_port}, "tx-b")  # 127.0.0.2/32 = b
    assert place("127.0.0.1") == ({a_port}, "tx-a")  # no match: own region
    behind_the_edge = {"X-Forwarded-For": "127.0.0.2"}
    assert place("127.0.0.1", **behind_the_edge) == ({b_port}, "tx-b")  # the client's CIDR
    # The trusted edge's header comes first; a client's own, past the edge, is not believed.
    assert place("127.0.0.1", **behind_the_edge, **{"X-Client-Region": "a"}) == ({a_port}, "tx-a")
    assert place("127.0.0.2", **{"X-Client-Region": "a"}) == ({b_port}, "tx-b")
    assert place("127.0.0.1", **{"X-Client-Region": "nowhere"}) == ({a_port}, "tx-a")


def test_media_through_a_global_relay_hop_from_a_s_ingress(regions: Regions) -> None:
    """A caller told to use A's ingress for a session on B's transceiver (cluster 2): relay A
    forwards the flow to relay B, which delivers it to tx-b; replies return through A."""
    before_b = packets_in(regions.tx_b)
    a_ingress = f"{regions.relay_a.listen[0]}:{regions.relay_a.listen[1]}"

    async def main() -> Caller:
        caller = Caller(ToneTrack(770.0))

        async def signal(offer: str) -> str:
            status, body = await asyncio.to_thread(
                regions.tx_b.create_session,
                offer,
                [a_ingress],
                agent_url=regions_agent_url(regions),
            )
            assert status == 201, body
            return str(body["answer_sdp"])

        try:
            await caller.start(signal)
            await asyncio.wait_for(caller.wait_connected(), 15)
            await listen(caller, 770.0, carried)
        finally:
            await caller.close()
        return caller

    def carried() -> bool:  # by both relays: A as the ingress, B as the second hop
        upstream = "firsthop_relay_packets_total"
        return (
            packets_in(regions.tx_b) > before_b + 50
            and regions.relay_a.metric(upstream, direction="upstream") > 50
            and regions.relay_b.metric(upstream, direction="upstream") > 50
        )

    caller = asyncio.run(main())
    assert candidate_ports(caller.result.answer_sdp) == {regions.relay_a.listen[1]}
    assert_heard(caller, 770.0)
    assert packets_in(regions.tx_b) > before_b + 50
    # both relays carried the flow: A as the ingress, B as the second hop
    assert regions.relay_a.metric("firsthop_relay_packets_total", direction="upstream") > 50
    assert regions.relay_b.metric("firsthop_relay_packets_total", direction="upstream") > 50


def regions_agent_url(regions: Regions) -> str:
    return str(regions.sig.args[regions.sig.args.index("--agent-url") + 1].split("=", 1)[1])
