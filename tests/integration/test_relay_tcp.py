"""ICE-TCP through the real `firsthop relay` on loopback: RFC 4571 frames in, PROXY v2
STREAM-marked datagrams to the transceiver, framed replies on the same connection; and each
bound (connections per IP and in total, slow-loris, first frame, frame size, idle, slow
reader) against the attack it stops."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from firsthop.services.relay.tcp_ingress import FRAME_BURST, FRAME_RATE
from firsthop.shared.wire import stun
from firsthop.shared.wire.proxy_v2 import build_proxy_v2, parse_proxy_v2
from firsthop.shared.wire.rfc4571 import Deframer, frame
from tests.integration.test_relay import foreign_key_token
from tests.support import (
    AgentProcess,
    FakeTransceiver,
    RelayProcess,
    TransceiverProcess,
    binding_request,
    binding_success,
    mint,
    rtp,
    wait_until,
)

FIRST_FRAME_TIMEOUT = 1.0
IDLE_TIMEOUT = 2.0


class TcpCaller:
    """The caller's side of an ICE-TCP connection (RFC 6544 active), from `host`."""

    def __init__(self, relay: tuple[str, int], host: str = "127.0.0.1", rcvbuf: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((host, 0))
        self.sock.settimeout(3.0)
        self.addr: tuple[str, int] = self.sock.getsockname()[:2]
        self.reset_at_connect = False  # the relay refused it before connect() returned
        try:
            self.sock.connect(relay)
        except ConnectionResetError:
            self.reset_at_connect = True
        except BaseException:
            self.sock.close()
            raise
        self.deframer = Deframer()
        self.frames: list[bytes] = []

    def send(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def recv(self, timeout: float = 3.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not self.frames:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the relay closed the connection")
            self.frames += self.deframer.feed(data)
        return self.frames.pop(0)

    def closed_by_relay(self, within: float) -> bool:
        """True if the relay closes (FIN or RST) within `within` seconds."""
        if self.reset_at_connect:
            return True
        self.sock.settimeout(within)
        try:
            while self.sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        return True

    def close(self) -> None:
        self.sock.close()


def tcp_relay(*extra: str) -> RelayProcess:
    return RelayProcess("--listen-tcp", "127.0.0.1:0", *extra).start()


@pytest.fixture(scope="module")
def relay() -> Iterator[RelayProcess]:
    proc = tcp_relay(
        "--tcp-first-frame-timeout",
        str(FIRST_FRAME_TIMEOUT),
        "--tcp-idle-timeout",
        str(IDLE_TIMEOUT),
        "--tcp-write-buffer",
        "4096",
    )
    yield proc
    proc.kill()


def listen_tcp(relay: RelayProcess) -> tuple[str, int]:
    return relay.bound["listen_tcp"]


def closed(relay: RelayProcess, reason: str) -> float:
    return relay.metric("firsthop_relay_tcp_closed_total", reason=reason)


def open_tcp_call(relay: RelayProcess, caller: TcpCaller, tx: FakeTransceiver) -> tuple[str, int]:
    req = binding_request(mint(*tx.addr))
    caller.send(req)
    data, via = tx.recv()
    hdr = parse_proxy_v2(data)
    assert hdr.stream  # the transceiver can tell: the client's transport is TCP
    assert (hdr.src, hdr.dst) == (caller.addr, listen_tcp(relay))
    assert data[hdr.payload_offset :] == req
    answer = binding_success()
    tx.send(build_proxy_v2(listen_tcp(relay), caller.addr, stream=True) + answer, via)
    assert caller.recv() == answer
    return via


def test_frames_are_routed_by_token_marked_tcp_and_answered_on_the_connection(
    relay: RelayProcess, tx: FakeTransceiver
) -> None:
    caller = TcpCaller(listen_tcp(relay))
    try:
        via = open_tcp_call(relay, caller, tx)
        ingress = listen_tcp(relay)
        for seq in range(20):
            caller.send(rtp(seq))
            data, frm = tx.recv()
            hdr = parse_proxy_v2(data)
            assert (hdr.src, hdr.stream, data[hdr.payload_offset :], frm) == (
                caller.addr,
                True,
                rtp(seq),
                via,
            )
            tx.send(build_proxy_v2(ingress, caller.addr, stream=True) + rtp(1000 + seq), via)
            assert caller.recv() == rtp(1000 + seq)
        # a reply that names the client as a UDP one is for nobody: the relay keeps them apart
        before = relay.metric("firsthop_relay_drops_total", reason="return_no_flow")
        tx.send(build_proxy_v2(ingress, caller.addr) + rtp(7), via)
        relay.wait_metric("firsthop_relay_drops_total", before + 1, reason="return_no_flow")
        assert relay.metric("firsthop_relay_tcp_connections") >= 1
    finally:
        caller.close()


def test_a_real_transceiver_answers_a_check_over_tcp() -> None:
    relay = tcp_relay()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(agent_url=agent.url).start()
    caller = None
    try:
        offer = (
            "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"
            "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\n"
            "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
            "a=fingerprint:sha-256 "
            + ":".join(["AB"] * 32)
            + "\r\na=setup:actpass\r\na=sendrecv\r\na=rtcp-mux\r\na=rtpmap:111 opus/48000/2\r\n"
        )
        ingress = listen_tcp(relay)
        status, body = tx.create_session(
            offer,
            [f"{relay.listen[0]}:{relay.listen[1]}"],
            ingress_tcp=[f"{ingress[0]}:{ingress[1]}"],
        )
        assert status == 201, body
        answer = str(body["answer_sdp"])
        # the answer offers the ICE-TCP ingress too, passive, ranked below UDP (RFC 6544)
        cands = [line.split() for line in answer.splitlines() if line.startswith("a=candidate:")]
        (udp,) = [c for c in cands if c[2].lower() == "udp"]
        (tcp,) = [c for c in cands if c[2].lower() == "tcp"]
        assert (tcp[4], int(tcp[5]), tcp[6:]) == (
            ingress[0],
            ingress[1],
            ["typ", "host", "tcptype", "passive"],
        )
        assert int(tcp[3]) < int(udp[3])
        attrs = dict(
            line[2:].split(":", 1)
            for line in answer.splitlines()
            if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))
        )
        caller = TcpCaller(ingress)
        request = binding_request(attrs["ice-ufrag"].encode(), b"abcd", attrs["ice-pwd"].encode())
        caller.send(request)
        response = stun.parse_stun(caller.recv(timeout=5.0))
        assert (response.method, response.cls) == (stun.BINDING, stun.SUCCESS)
        assert response.transaction_id == stun.parse_stun(request).transaction_id
        mapped = response.get(stun.XOR_MAPPED_ADDRESS)
        assert mapped is not None
    finally:
        if caller is not None:
            caller.close()
        tx.kill()
        agent.kill()
        relay.kill()


def test_connections_per_ip_and_in_total_are_bounded() -> None:
    # (deadlines long enough that no admitted connection times out during the test)
    relay = tcp_relay("--tcp-max-per-ip", "3", "--tcp-max-connections", "5")
    ingress = listen_tcp(relay)
    per_ip = closed(relay, "connections_per_ip")
    total = closed(relay, "connection_limit")
    held = [TcpCaller(ingress, "127.0.0.1") for _ in range(3)]
    try:
        extra = TcpCaller(ingress, "127.0.0.1")
        assert extra.closed_by_relay(0.5)  # a fourth from one IP: reset at once
        extra.close()
        held += [TcpCaller(ingress, "127.0.0.2") for _ in range(2)]  # five in all
        other = TcpCaller(ingress, "127.0.0.3")
        assert other.closed_by_relay(0.5)
        other.close()
        assert not held[-1].closed_by_relay(0.2)  # the admitted ones are still open
        relay.wait_metric(
            "firsthop_relay_tcp_closed_total", per_ip + 1, reason="connections_per_ip"
        )
        relay.wait_metric("firsthop_relay_tcp_closed_total", total + 1, reason="connection_limit")
        for c in held:
            c.close()
        wait_until(lambda: relay.metric("firsthop_relay_tcp_connections") == 0, timeout=5)
    finally:
        for c in held:
            c.close()
        relay.kill()


def test_slow_loris_gets_no_more_than_the_first_frame_timeout(relay: RelayProcess) -> None:
    before = closed(relay, "first_frame_timeout")
    silent = TcpCaller(listen_tcp(relay))
    trickle = TcpCaller(listen_tcp(relay))
    try:
        partial = frame(binding_request(mint()))
        # A frame, one byte every 100 ms, for up to three first-frame timeouts: a deadline
        # that each byte pushed back would never come while it trickles.
        started, cut = time.monotonic(), False
        for byte in partial:
            if time.monotonic() - started > 3 * FIRST_FRAME_TIMEOUT:
                break
            try:
                trickle.sock.send(bytes([byte]))
            except OSError:
                cut = True
                break
            time.sleep(0.1)
        assert cut or trickle.closed_by_relay(0.5), "still open after 3 first-frame timeouts"
        assert silent.closed_by_relay(FIRST_FRAME_TIMEOUT + 5)
        relay.wait_metric(
            "firsthop_relay_tcp_closed_total", before + 2, reason="first_frame_timeout"
        )
    finally:
        silent.close()
        trickle.close()


@pytest.mark.parametrize(
    "first",
    [
        rtp(),  # not STUN
        b"\x16\xfe\xfd" + bytes(40),  # DTLS before any check
        binding_request(b"not-a-token"),
        binding_request(foreign_key_token(("127.0.0.1", 5004))),
    ],
    ids=["rtp", "dtls", "bad-ufrag", "foreign-key"],
)
def test_a_first_frame_that_opens_no_flow_closes_the_connection(
    relay: RelayProcess, first: bytes
) -> None:
    before = closed(relay, "first_frame_rejected")
    caller = TcpCaller(listen_tcp(relay))
    try:
        caller.send(first)
        assert caller.closed_by_relay(2.0)
        relay.wait_metric(
            "firsthop_relay_tcp_closed_total", before + 1, reason="first_frame_rejected"
        )
    finally:
        caller.close()


def test_a_flood_of_tiny_frames_is_rate_limited_and_counted_and_the_call_goes_on(
    relay: RelayProcess, tx: FakeTransceiver
) -> None:
    """RFC 4571's two-byte frames would turn one TCP segment into hundreds of datagrams to
    a transceiver: past FRAME_RATE a second (burst FRAME_BURST) a connection's frames are
    counted drops, and its call's next frames pass once the bucket refills."""
    caller = TcpCaller(listen_tcp(relay))
    try:
        via = open_tcp_call(relay, caller, tx)
        before = relay.metric("firsthop_relay_drops_total", reason="tcp_rate_limited")
        sent = 30_000
        start = time.monotonic()
        caller.sock.sendall(frame(b"\x80") * sent)  # (90 KB: 485 frames a TCP segment)

        def dropped_past_the_rate() -> bool:
            allowed = FRAME_BURST + FRAME_RATE * (time.monotonic() - start)
            dropped = relay.metric("firsthop_relay_drops_total", reason="tcp_rate_limited")
            return dropped - before >= sent - allowed

        wait_until(dropped_past_the_rate, timeout=10)
        while not tx.recv_none(0.2):  # (what did pass, if the socket kept it)
            pass
        time.sleep(0.1)  # a hundred tokens back
        caller.send(rtp(1))
        data, frm = tx.recv()
        hdr = parse_proxy_v2(data)
        assert (hdr.src, data[hdr.payload_offset :], frm) == (caller.addr, rtp(1), via)
    finally:
        caller.close()


@pytest.mark.parametrize("length", [1501, 0xFFFF])
def test_an_oversize_frame_resets_the_connection(relay: RelayProcess, length: int) -> None:
    before = closed(relay, "oversize_frame")
    caller = TcpCaller(listen_tcp(relay))
    try:
        caller.sock.sendall(length.to_bytes(2, "big") + bytes(100))
        assert caller.closed_by_relay(2.0)
        relay.wait_metric("firsthop_relay_tcp_closed_total", before + 1, reason="oversize_frame")
    finally:
        caller.close()


def test_an_idle_connection_is_closed_and_its_flow_goes_with_it(
    relay: RelayProcess, tx: FakeTransceiver
) -> None:
    before = closed(relay, "idle")
    caller = TcpCaller(listen_tcp(relay))
    try:
        via = open_tcp_call(relay, caller, tx)
        assert caller.closed_by_relay(IDLE_TIMEOUT + 5)
        relay.wait_metric("firsthop_relay_tcp_closed_total", before + 1, reason="idle")
        # the flow went with the connection: a reply for it is dropped, not delivered
        drops = relay.metric("firsthop_relay_drops_total", reason="return_no_flow")
        reply = build_proxy_v2(listen_tcp(relay), caller.addr, stream=True) + rtp()
        tx.send(reply, via)
        relay.wait_metric("firsthop_relay_drops_total", drops + 1, reason="return_no_flow")
    finally:
        caller.close()


def flood_slow_readers(
    relay: RelayProcess, tx: FakeTransceiver, readers: int, reason: str, bound: int
) -> None:
    """Send ~3.6 MB toward each of `readers` callers that read nothing: frames are dropped
    and counted as `reason`, the relay queues no more than `bound` bytes (plus the tail of
    one frame per connection), and a caller that reads again gets its frames."""
    callers = [TcpCaller(listen_tcp(relay), rcvbuf=4096) for _ in range(readers)]
    try:
        vias = [open_tcp_call(relay, caller, tx) for caller in callers]
        before = relay.metric("firsthop_relay_drops_total", reason=reason)
        for caller, via in zip(callers, vias, strict=True):
            reply = build_proxy_v2(listen_tcp(relay), caller.addr, stream=True) + rtp(size=1200)
            for i in range(3000):
                tx.send(reply, via)
                if i % 200 == 0:
                    caller.send(rtp(i))  # keeps the connection from going idle
        relay.wait_metric("firsthop_relay_drops_total", before + 1, reason=reason)
        queued = relay.metric("firsthop_relay_tcp_queued_bytes")
        assert 0 < queued <= bound + readers * 1202
        for caller in callers:  # each connection still works once its caller reads again
            for _ in range(3):
                caller.recv(timeout=5.0)
    finally:
        for caller in callers:
            caller.close()


def test_a_slow_reader_costs_a_bounded_buffer_and_counted_drops(
    relay: RelayProcess, tx: FakeTransceiver
) -> None:
    flood_slow_readers(relay, tx, 1, "tcp_write_buffer_full", 4096)


def test_slow_readers_together_cost_a_bounded_budget(tx: FakeTransceiver) -> None:
    relay = tcp_relay("--tcp-write-buffer", "1000000", "--tcp-write-budget", "20000")
    try:
        flood_slow_readers(relay, tx, 3, "tcp_write_budget_full", 20000)
    finally:
        relay.kill()


def test_every_worker_serves_its_own_connections() -> None:
    # SO_REUSEPORT spreads connections over the workers; each frame's reply comes back to
    # the worker that forwarded it, which holds the connection.
    relay = RelayProcess("--listen-tcp", "127.0.0.1:0", workers=2).start()
    fake = FakeTransceiver()
    callers = [TcpCaller(listen_tcp(relay)) for _ in range(16)]
    try:
        vias = {open_tcp_call(relay, caller, fake) for caller in callers}
        for seq, caller in enumerate(callers):
            caller.send(rtp(seq))
            data, via = fake.recv()
            hdr = parse_proxy_v2(data)
            assert hdr.src == caller.addr
            fake.send(build_proxy_v2(listen_tcp(relay), caller.addr, stream=True) + rtp(seq), via)
            assert caller.recv() == rtp(seq)
        assert len(vias) == 2  # (16 connections all land on one worker 1 time in 32,768)
    finally:
        for caller in callers:
            caller.close()
        fake.close()
        relay.kill()


def test_the_transceiver_refuses_a_bad_ingress_tcp() -> None:
    tx = TransceiverProcess().start()
    try:
        for bad in (["nowhere"], "127.0.0.1:443", ["127.0.0.1:443"] * 9):
            status, body = tx.create_session("v=0\r\n", ["127.0.0.1:3478"], ingress_tcp=bad)
            assert status == 400 and "ingress_tcp" in str(body), body
    finally:
        tx.kill()


def test_a_global_relay_hop_carries_an_ice_tcp_caller_both_ways() -> None:
    # The first relay takes the TCP connection; the STREAM marking survives the hop to the
    # second relay and the transceiver, and the reply comes back on the connection.
    b = RelayProcess(cluster=2).start()
    a = tcp_relay("--peer", f"2={b.internal[0]}:{b.internal[1]}")
    fake = FakeTransceiver()  # a transceiver of cluster 2
    caller = TcpCaller(listen_tcp(a))
    try:
        req = binding_request(mint(*fake.addr, cluster=2))
        caller.send(req)
        data, via = fake.recv()
        hdr = parse_proxy_v2(data)
        assert (hdr.src, hdr.dst, hdr.stream) == (caller.addr, listen_tcp(a), True)
        assert data[hdr.payload_offset :] == req
        back = build_proxy_v2(listen_tcp(a), caller.addr, stream=True)
        fake.send(back + binding_success(), via)
        assert stun.parse_stun(caller.recv()).cls == stun.SUCCESS
        for seq in range(5):
            caller.send(rtp(seq))
            data, _ = fake.recv()
            assert data[parse_proxy_v2(data).payload_offset :] == rtp(seq)
            fake.send(back + rtp(500 + seq), via)
            assert caller.recv() == rtp(500 + seq)
        assert b.wait_metric("firsthop_relay_flows", 1) == 1
    finally:
        caller.close()
        fake.close()
        a.kill()
        b.kill()
