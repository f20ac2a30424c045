"""IPv6 dual stack through the real `firsthop relay` on loopback (issue #12 item 4): one relay
listening on 127.0.0.1 and ::1 (UDP and ICE-TCP), PROXY v2 frames in the client's family,
IPv6 transceivers (route tokens of family 6) behind an IPv4 internal socket, and real aiortc
callers over each family at once hearing their tones back through one relay."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
import redis as redis_lib

from firsthop.services.call.caller import Caller, ToneTrack
from firsthop.shared.address import format_hostport
from firsthop.shared.wire import stun
from firsthop.shared.wire.proxy_v2 import (
    FAMILY_INET6_DGRAM,
    FAMILY_INET_DGRAM,
    build_proxy_v2,
    parse_proxy_v2,
)
from firsthop.shared.wire.route_token import verify_route_token
from tests.integration.test_relay_tcp import TcpCaller
from tests.integration.test_transceiver import AUDIO, VALID_OFFER_HEAD, hears, signal_via
from tests.support import (
    KEYS,
    AgentProcess,
    Endpoint,
    FakeTransceiver,
    Namespace,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    binding_request,
    binding_success,
    eventually,
    mint,
    network_namespace,
    redis_server,
    rtp,
    wait_until,
)

V6 = "::1"
Address = tuple[str, int]


def dual_relay() -> RelayProcess:
    """A relay on 127.0.0.1 and ::1, UDP and ICE-TCP (the v6 ports are its own choice)."""
    return RelayProcess(
        *("--listen", f"[{V6}]:0"),
        *("--listen-tcp", "127.0.0.1:0", "--listen-tcp", f"[{V6}]:0"),
        *("--allow-dest", "127.0.0.0/8,::1/128"),
    ).start()


def addr(relay: RelayProcess, name: str) -> Address:
    host, port = relay.bound[name]
    return (str(host), int(port))


@pytest.fixture(scope="module")
def relay() -> Iterator[RelayProcess]:
    proc = dual_relay()
    yield proc
    proc.kill()


def open_udp_flow(
    relay: RelayProcess, client: Endpoint, tx: FakeTransceiver, ingress: Address
) -> Address:
    """A check from `client` to `ingress`, framed to `tx`, answered; returns the relay's
    socket that framed it."""
    req = binding_request(mint(*tx.addr))
    client.send(req, ingress)
    data, via = tx.recv()
    hdr = parse_proxy_v2(data)
    assert (hdr.src, hdr.dst, data[hdr.payload_offset :]) == (client.addr, ingress, req)
    assert data[13] == (FAMILY_INET6_DGRAM if ":" in client.addr[0] else FAMILY_INET_DGRAM)
    tx.send(build_proxy_v2(ingress, client.addr) + binding_success(), via)
    assert stun.parse_stun(client.recv()[0]).cls == stun.SUCCESS
    return via


@pytest.mark.parametrize("tx_host", ["127.0.0.1", V6], ids=["tx-v4", "tx-v6"])
def test_v4_and_v6_clients_at_once_each_framed_in_its_family(
    relay: RelayProcess, tx_host: str
) -> None:
    tx = FakeTransceiver(tx_host)
    c4, c6 = Endpoint("127.0.0.1"), Endpoint(V6)
    ingress4, ingress6 = addr(relay, "listen"), addr(relay, "listen_other")
    try:
        via4 = open_udp_flow(relay, c4, tx, ingress4)
        via6 = open_udp_flow(relay, c6, tx, ingress6)
        # media both ways on each (the data plane's fast paths), interleaved
        for seq in range(10):
            for client, ingress, via in ((c4, ingress4, via4), (c6, ingress6, via6)):
                client.send(rtp(seq), ingress)
                data, frm = tx.recv()
                hdr = parse_proxy_v2(data)
                assert (hdr.src, data[hdr.payload_offset :], frm) == (client.addr, rtp(seq), via)
                tx.send(build_proxy_v2(ingress, client.addr) + rtp(500 + seq), via)
                data, src = client.recv()
                assert (data, src) == (rtp(500 + seq), ingress)  # from the socket it sent to
    finally:
        for e in (tx, c4, c6):
            e.close()


def test_a_v6_client_cannot_speak_for_a_v4_one(relay: RelayProcess) -> None:
    """A reply naming a client in the other family's frame is for nobody."""
    tx = FakeTransceiver()
    c4 = Endpoint("127.0.0.1")
    ingress4 = addr(relay, "listen")
    try:
        via = open_udp_flow(relay, c4, tx, ingress4)
        before = relay.metric("firsthop_relay_drops_total", reason="return_no_flow")
        mapped = ("::ffff:127.0.0.1", c4.addr[1])
        tx.send(build_proxy_v2(addr(relay, "listen_other"), mapped) + rtp(1), via)
        relay.wait_metric("firsthop_relay_drops_total", before + 1, reason="return_no_flow")
        assert c4.recv_none()
    finally:
        tx.close()
        c4.close()


OFFER = VALID_OFFER_HEAD + AUDIO  # (ice-ufrag abcd, ice-pwd abcdefghijklmnopqrstuvwx)


@pytest.fixture(scope="module")
def stack(relay: RelayProcess) -> Iterator[tuple[RelayProcess, TransceiverProcess]]:
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess("--media", f"[{V6}]:0", agent_url=agent.url).start()
    yield relay, tx
    tx.kill()
    agent.kill()


def candidates(answer: str) -> list[list[str]]:
    return [line.split() for line in answer.splitlines() if line.startswith("a=candidate:")]


def test_the_answer_has_both_families_and_a_v6_check_over_ice_tcp_is_answered(
    stack: tuple[RelayProcess, TransceiverProcess],
) -> None:
    relay, tx = stack
    udp = [addr(relay, "listen"), addr(relay, "listen_other")]
    tcp = [addr(relay, "listen_tcp"), addr(relay, "listen_tcp_other")]
    status, body = tx.create_session(
        OFFER,
        [format_hostport(a) for a in udp],
        ingress_tcp=[format_hostport(a) for a in tcp],
    )
    assert status == 201, body
    answer = str(body["answer_sdp"])
    cands = candidates(answer)
    # RFC 8839 §5.1: the connection-address is the bare IPv6 literal, no brackets
    assert sorted((c[2].lower(), c[4], int(c[5])) for c in cands) == sorted(
        [("udp", h, p) for h, p in udp] + [("tcp", h, p) for h, p in tcp]
    )
    attrs = dict(
        line[2:].split(":", 1)
        for line in answer.splitlines()
        if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))
    )
    assert len(attrs["ice-ufrag"]) == 56  # an IPv6 route token: the transceiver is on ::1
    caller = TcpCaller(tcp[1], host=V6)
    try:
        request = binding_request(attrs["ice-ufrag"].encode(), b"abcd", attrs["ice-pwd"].encode())
        caller.send(request)
        response = stun.parse_stun(caller.recv(timeout=5.0))
        assert (response.method, response.cls) == (stun.BINDING, stun.SUCCESS)
        mapped = response.get(stun.XOR_MAPPED_ADDRESS)
        assert mapped is not None
        # the caller is seen as itself (2001:db8::/32 style, never v4-mapped)
        assert stun.decode_xor_address(mapped, response.transaction_id) == caller.addr
    finally:
        caller.close()


def test_aiortc_callers_over_ipv6_and_ipv4_at_once_hear_their_tones(
    stack: tuple[RelayProcess, TransceiverProcess],
) -> None:
    relay, tx = stack
    # Each caller is given one family's ingress only: aioice pairs candidates of one IP
    # version (RFC 8445 §6.1.2.2), so the v6 caller's only path is its v6 host candidate to
    # the relay's ::1 socket, and the v4 caller's the 127.0.0.1 one.
    where6 = [format_hostport(addr(relay, "listen_other"))]
    where4 = [format_hostport(addr(relay, "listen"))]
    packets = partial(relay.metric, "firsthop_relay_packets_total")
    before = packets(direction="upstream"), packets(direction="downstream")

    async def main() -> list[str]:
        c6, c4 = Caller(ToneTrack(440.0)), Caller(ToneTrack(880.0))
        await asyncio.gather(c6.start(signal_via(tx, where6)), c4.start(signal_via(tx, where4)))
        await asyncio.gather(*(asyncio.wait_for(c.wait_connected(), 15) for c in (c6, c4)))
        await eventually(lambda: hears(c6, 440.0) and hears(c4, 880.0))
        remotes = [c.result.answer_sdp for c in (c6, c4)]
        await asyncio.gather(c6.close(), c4.close())
        return remotes

    answers = asyncio.run(main())
    assert [c[4] for c in candidates(answers[0])] == [V6]
    assert [c[4] for c in candidates(answers[1])] == ["127.0.0.1"]
    # both calls' media went through the relay (each heard half a second: 25+ packets each way)
    wait_until(
        lambda: (
            packets(direction="upstream") - before[0] > 50
            and packets(direction="downstream") - before[1] > 50
        )
    )


def test_signaling_advertises_a_regions_v4_and_v6_ingress_and_a_caller_connects(
    stack: tuple[RelayProcess, TransceiverProcess],
) -> None:
    """`--ingress a=127.0.0.1:P --ingress a=[::1]:P6` (and the same for ICE-TCP): the answer
    signaling returns has a candidate for each, and a dual-stack caller connects (on either
    family, ICE picks) and hears its tone."""
    relay, tx = stack
    udp = [addr(relay, "listen"), addr(relay, "listen_other")]
    tcp = [addr(relay, "listen_tcp"), addr(relay, "listen_tcp_other")]
    flags = [
        *("--transceiver", f"a={tx.api}"),
        *(x for a in udp for x in ("--ingress", f"a={format_hostport(a)}")),
        *(x for a in tcp for x in ("--ingress-tcp", f"a={format_hostport(a)}")),
    ]
    sig = SignalingProcess(*flags).start()
    try:

        async def call(offer: str) -> str:
            resp = await asyncio.to_thread(
                httpx.post,
                f"{sig.url}/v1/calls",
                content=offer,
                headers={
                    "Authorization": f"Bearer {SignalingProcess.API_KEY}",
                    "Content-Type": "application/sdp",
                },
                timeout=20,
            )
            assert resp.status_code == 201, resp.text
            return resp.text

        async def main() -> str:
            c = Caller(ToneTrack(660.0))
            await c.start(call)
            await asyncio.wait_for(c.wait_connected(), 15)
            await eventually(lambda: hears(c, 660.0))
            await c.close()
            return c.result.answer_sdp

        answer = asyncio.run(main())
    finally:
        sig.kill()
    cands = candidates(answer)
    assert sorted((c[2].lower(), c[4], int(c[5])) for c in cands) == sorted(
        [("udp", h, p) for h, p in udp] + [("tcp", h, p) for h, p in tcp]
    )


def free_v6_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind((V6, 0))
        return int(s.getsockname()[1])


def test_a_v6_flow_is_cached_under_its_compressed_ip_and_recovered_after_a_restart() -> None:
    port6 = free_v6_port()

    def start(redis_url: str, listen: int = 0, internal: int | None = None) -> RelayProcess:
        return RelayProcess(
            *("--listen", f"[{V6}]:{port6}", "--allow-dest", "127.0.0.0/8,::1/128"),
            redis_url=redis_url,
            listen_port=listen or None,
            internal_port=internal,
        ).start()

    with redis_server() as rs:
        relay = start(rs.url)
        tx, client = FakeTransceiver(V6), Endpoint(V6)
        ingress6 = (V6, port6)
        try:
            open_udp_flow(relay, client, tx, ingress6)
            relay.wait_metric("firsthop_relay_redis_writes_total", 1)
            key = f"firsthop:flow:{client.addr[0]}:{client.addr[1]}"  # firsthop:flow:::1:PORT
            stored = redis_lib.Redis.from_url(rs.url).hgetall(key)
            assert verify_route_token(stored[b"token"], KEYS, time.time()).dest == tx.addr
            listen, internal = relay.listen[1], relay.internal[1]
            relay.stop()
            relay = start(rs.url, listen, internal)
            client.send(rtp(2), ingress6)  # media, no STUN: the flow comes back from Redis
            data, via = tx.recv()
            hdr = parse_proxy_v2(data)
            assert (hdr.src, hdr.dst, data[hdr.payload_offset :]) == (client.addr, ingress6, rtp(2))
            tx.send(build_proxy_v2(ingress6, client.addr) + rtp(3), via)
            assert client.recv() == (rtp(3), ingress6)
            assert relay.wait_metric("firsthop_relay_recoveries_total", 1) == 1
        finally:
            client.close()
            tx.close()
            relay.kill()


def test_a_dual_stack_transceiver_serves_callers_of_both_families(relay: RelayProcess) -> None:
    """`--media [::]:P --advertise-media 127.0.0.1:P`: one socket for both families (its
    tokens name the IPv4 address, so the relay reaches it over IPv4, seen as v4-mapped);
    callers over IPv6 and IPv4 to the relay both hear their tones."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        probe.bind(("::", 0))
        port = int(probe.getsockname()[1])
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(
        *("--media", f"[::]:{port}", "--advertise-media", f"127.0.0.1:{port}"),
        agent_url=agent.url,
    ).start()
    try:
        where6 = [format_hostport(addr(relay, "listen_other"))]
        where4 = [format_hostport(addr(relay, "listen"))]

        async def main() -> None:
            c6, c4 = Caller(ToneTrack(520.0)), Caller(ToneTrack(1040.0))
            await asyncio.gather(c6.start(signal_via(tx, where6)), c4.start(signal_via(tx, where4)))
            await asyncio.gather(*(asyncio.wait_for(c.wait_connected(), 15) for c in (c6, c4)))
            await eventually(lambda: hears(c6, 520.0) and hears(c4, 1040.0))
            ufrag = next(
                line
                for line in c6.result.answer_sdp.splitlines()
                if line.startswith("a=ice-ufrag:")
            )
            assert len(ufrag.split(":", 1)[1]) == 40  # an IPv4 token: the advertised address
            await asyncio.gather(c6.close(), c4.close())

        asyncio.run(main())
    finally:
        tx.kill()
        agent.kill()


def test_a_global_relay_hop_carries_a_v6_client_both_ways() -> None:
    """A v6 client of relay A whose token names cluster 2: A frames it in IPv6 (52-byte
    header) to relay B over IPv4, B forwards the frame as it is to its transceiver, and the
    replies come back the same way (both relays' fast paths, on headers of either length)."""
    b = RelayProcess(cluster=2).start()
    a = RelayProcess(
        *("--listen", f"[{V6}]:0", "--peer", f"2={b.internal[0]}:{b.internal[1]}"),
    ).start()
    fake = FakeTransceiver()  # a transceiver of cluster 2
    client = Endpoint(V6)
    ingress6 = addr(a, "listen_other")
    try:
        req = binding_request(mint(*fake.addr, cluster=2))
        client.send(req, ingress6)
        data, via = fake.recv()
        hdr = parse_proxy_v2(data)
        assert (hdr.src, hdr.dst, data[hdr.payload_offset :]) == (client.addr, ingress6, req)
        back = build_proxy_v2(ingress6, client.addr)
        fake.send(back + binding_success(), via)
        assert stun.parse_stun(client.recv()[0]).cls == stun.SUCCESS
        for seq in range(5):
            client.send(rtp(seq), ingress6)
            data, _ = fake.recv()
            assert data[parse_proxy_v2(data).payload_offset :] == rtp(seq)
            fake.send(back + rtp(500 + seq), via)
            assert client.recv() == (rtp(500 + seq), ingress6)
        assert b.wait_metric("firsthop_relay_flows", 1) == 1
    finally:
        client.close()
        fake.close()
        a.kill()
        b.kill()


CONNECT_FROM = """
import json, socket, sys
relay = (sys.argv[1], int(sys.argv[2]))
socks = []
for src in sys.argv[3:]:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(3.0)
    try:
        s.connect(relay)
    except ConnectionResetError:  # the relay refused it before connect() returned
        s.close()
        s = None
    socks.append(s)
verdicts = []
for s in socks:
    if s is None:
        verdicts.append("reset")
        continue
    s.settimeout(0.5)  # (well within the relay's 5 s for a first frame)
    try:
        verdicts.append("closed" if s.recv(1) == b"" else "open")
    except ConnectionResetError:
        verdicts.append("reset")
    except TimeoutError:
        verdicts.append("open")
    s.close()
print(json.dumps(verdicts))
"""


def _ifname(address: str, inside: Namespace | None = None) -> str:
    """The interface holding `address` on this host (or inside the namespace `inside`)."""
    argv = ("ip", "-o", "addr", "show", "to", address)
    if inside is not None:
        return inside.run(*argv).stdout.split()[1]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()[1]


def test_ice_tcp_connections_per_source_count_an_ipv6_slash_64_as_one() -> None:
    """Three callers at three addresses of one /64 (one host can pick any of them) and one
    in another /64, across a veth pair into a network namespace: with --tcp-max-per-ip 2,
    the /64 gets two connections, the other /64 its own."""
    with network_namespace() as ns:
        tag = os.urandom(2).hex()
        same, other = f"fd99:{tag}:0:1", f"fd99:{tag}:0:2"
        host_if, inside_if = _ifname(ns.host), _ifname(ns.inside, inside=ns)
        relay_host = f"{same}::1"
        subprocess.run(
            ["ip", "-6", "addr", "add", f"{relay_host}/64", "dev", host_if, "nodad"], check=True
        )
        subprocess.run(["ip", "-6", "route", "add", f"{other}::/64", "dev", host_if], check=True)
        sources = [f"{same}::2", f"{same}::3", f"{same}::4", f"{other}::5"]
        for src in sources:
            ns.run("ip", "-6", "addr", "add", f"{src}/64", "dev", inside_if, "nodad")
        relay = RelayProcess("--listen-tcp", f"[{relay_host}]:0", "--tcp-max-per-ip", "2").start()
        try:
            port = addr(relay, "listen_tcp")[1]
            out = ns.run(sys.executable, "-c", CONNECT_FROM, relay_host, str(port), *sources)
            assert json.loads(out.stdout) == ["open", "open", "reset", "open"]
            assert relay.metric("firsthop_relay_tcp_closed_total", reason="connections_per_ip") == 1
        finally:
            relay.kill()
            subprocess.run(["ip", "-6", "route", "del", f"{other}::/64", "dev", host_if])
