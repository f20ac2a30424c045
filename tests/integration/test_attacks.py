"""Attacks on the edge, each reproduced against real processes on loopback.

A relay, a transceiver and an echo agent run as real processes; callers are real aiortc peers
(through a userspace NAT where the test needs one); the attacker sends from other loopback
addresses, or from 20k spoofed 127.64.0.0/10 sources through a raw socket (root). Every test
checks what the attacker gets back, what state the edge kept, and that a legitimate call
carries on — or connects — during the attack.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from firsthop.services.call.caller import Caller, ToneTrack, tone_power
from tests.attack import Nat, Spoofer, spoofed_sources
from tests.support import (
    AgentProcess,
    RelayProcess,
    TransceiverProcess,
    binding_request,
    eventually,
    start_all,
    wait_until,
)

FREQ = 440.0
SAMPLES_PER_SECOND = 48000  # PCM16 mono, as the caller records it

Stack = tuple[RelayProcess, TransceiverProcess]


@pytest.fixture(autouse=True)
def one_host_address_a_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """The honest callers here gather on the first address of each family only (eth0's).
    aioice gathers on every interface's (never loopback's), and an address another test
    process adds meanwhile (a namespace's veth) gave a caller a second pair, whose
    nomination moved its own media path: these tests count moves (`path_moved`) to see
    that an attacker's cannot, and a stop-44 CI run failed on the caller's own."""
    import aioice.ice

    every = aioice.ice.get_host_addresses

    def first_of_each(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        v4 = every(use_ipv4, False)[:1]
        v6 = every(False, use_ipv6)[:1]
        return v4 + v6

    monkeypatch.setattr(aioice.ice, "get_host_addresses", first_of_each)


def attacked_stack() -> Iterator[Stack]:
    relay = RelayProcess()
    agent = AgentProcess("echo")
    tx = TransceiverProcess(agent_url=agent.url, tx_id="tx-attacked")
    start_all(relay, agent)
    start_all(tx)
    yield relay, tx
    for proc in (tx, agent, relay):
        proc.kill()


stack = pytest.fixture(scope="module")(attacked_stack)
# A stack of its own, for a test whose bounds count every flow of the relay and what its
# token holds: after the NAT rebinding test on the module's stack (its caller's old path
# still a flow, its calls lingering) the flood test failed 3 runs of 3 (flows 12 > 11, or
# no pending flow of the attacker's token ever seen), and so once in CI.
own_stack = pytest.fixture(attacked_stack, name="own_stack")


@dataclass
class Call:
    caller: Caller
    session_id: str
    server_ufrag: str
    server_pwd: str
    client_ufrag: str

    def signed_check(self) -> bytes:
        """A check only the caller could have made: signed with the call's real password."""
        return binding_request(
            self.server_ufrag.encode(), self.client_ufrag.encode(), self.server_pwd.encode()
        )

    def unsigned_check(self) -> bytes:
        return binding_request(self.server_ufrag.encode(), self.client_ufrag.encode(), b"x" * 24)

    def heard_since(self, t: float) -> float:
        """Tone power in what arrived after monotonic time `t`."""
        times = self.caller.result.frame_times
        first = next((i for i, at in enumerate(times) if at >= t), len(times))
        frame = len(self.caller.result.received) // max(1, len(times))
        return tone_power(bytes(self.caller.result.received[first * frame :]), FREQ)

    def frames_since(self, t: float) -> int:
        """Audio frames that arrived after monotonic time `t`."""
        return sum(1 for at in self.caller.result.frame_times if at >= t)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest stretch in [start, end] with no audio frame arriving (seconds)."""
        times = [start, *(t for t in self.caller.result.frame_times if start < t < end), end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


def sdp_value(sdp: str, name: str) -> str:
    return next(
        line.split(":", 1)[1].strip() for line in sdp.splitlines() if line.startswith(f"a={name}:")
    )


async def call(tx: TransceiverProcess, ingress: tuple[str, int]) -> Call:
    caller = Caller(ToneTrack(FREQ))
    created: dict[str, Any] = {}

    async def signal(offer: str) -> str:
        status, body = await asyncio.to_thread(
            tx.create_session, offer, [f"{ingress[0]}:{ingress[1]}"]
        )
        assert status == 201, body
        created.update(body)
        return str(body["answer_sdp"])

    await caller.start(signal)
    await asyncio.wait_for(caller.wait_connected(), 15)
    answer = caller.result.answer_sdp
    return Call(
        caller,
        created["session_id"],
        sdp_value(answer, "ice-ufrag"),
        sdp_value(answer, "ice-pwd"),
        sdp_value(caller.pc.localDescription.sdp, "ice-ufrag"),
    )


def events(tx: TransceiverProcess, name: str) -> float:
    return tx.event_count(name)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def drain(sock: socket.socket) -> list[bytes]:
    got = []
    sock.setblocking(False)
    while True:
        try:
            got.append(sock.recv(4096))
        except BlockingIOError:
            return got


def test_a_signed_or_replayed_check_from_elsewhere_moves_no_media(stack: Stack) -> None:
    """Finding 1: one Binding request signed with a live call's credentials, or a captured
    check replayed, from another address used to move the call's media there (323 media
    packets, 61 kB for 756 B sent, within 5 s). Now the other address must answer our own
    check first: it cannot, so it gets one STUN response and at most one validation request
    per check it sent, and the caller keeps hearing its echo."""
    relay, tx = stack
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind(("127.0.0.2", 0))

    async def main() -> None:
        c = await call(tx, relay.listen)
        try:
            await attack(c)
        finally:
            await c.caller.close()

    async def attack(c: Call) -> None:
        # capture the caller's own next check (a consent check), to replay it elsewhere
        captured: list[bytes] = []
        pc: Any = c.caller.pc
        conn = next(iter(pc._RTCPeerConnection__iceTransports))._connection
        transport = conn._nominated[1].protocol.transport
        real_sendto = transport.sendto

        def tap(data: bytes, addr: Any = None) -> None:
            if data[:2] == b"\x00\x01":  # a Binding request
                captured.append(bytes(data))
            real_sendto(data, addr)

        transport.sendto = tap
        await eventually(lambda: c.heard_since(time.monotonic() - 0.5) > 0.001)  # echo flows
        t0 = time.monotonic()
        sent = 0
        for _ in range(5):
            check = c.signed_check()
            attacker.sendto(check, relay.listen)
            sent += len(check)
            await asyncio.sleep(1.0)  # the attacker's pace: one check a second
        await eventually(lambda: captured, 8)
        attacker.sendto(captured[0], relay.listen)  # the caller's own check, replayed
        sent += len(captured[0])
        await asyncio.to_thread(
            wait_until,
            lambda: events(tx, "stun_replay") >= 1 and events(tx, "path_validations") >= 1,
        )
        await asyncio.sleep(1.0)  # what the replay draws has a second to reach the attacker
        got = drain(attacker)
        assert all(d[0] < 4 for d in got), "the attacker received media"
        assert len(got) <= 2 * 5  # per signed check: one response, at most one validation
        assert sum(map(len, got)) <= 2 * sent  # no answer much bigger than the question
        assert events(tx, "path_moved") == 0
        # the caller kept its media all along
        assert c.heard_since(time.monotonic() - 1.5) > 0.001
        assert c.longest_gap(t0, t0 + 5) < 1.0
        print(
            f"\nattacker: sent {sent} B in 6 checks, got {len(got)} STUN datagrams, "
            f"{sum(map(len, got))} B, no media"
        )

    try:
        asyncio.run(main())
    finally:
        attacker.close()


def test_a_nat_rebinding_moves_the_media_at_the_callers_next_check(stack: Stack) -> None:
    """The same rule lets a real move through: the caller's NAT changes its port mid-call;
    its next consent check comes from the new port, answers our validation, and the media
    follows. The gap is printed (it is the caller's consent interval: 4-6 s for aiortc)."""
    relay, tx = stack
    nat = Nat(relay.listen)

    async def main() -> None:
        played = events(tx, "agent_frames_played")
        c = await call(tx, nat.inside_addr)
        try:
            await eventually(lambda: c.heard_since(time.monotonic() - 1.0) > 0.001)
            moved = events(tx, "path_moved")
            nat.rebind()
            t_rebind = time.monotonic()
            await asyncio.to_thread(wait_until, lambda: events(tx, "path_moved") > moved, 15)
            t_moved = time.monotonic()
            # the echo is back on the new path: half a second of it, its own tone (judged on
            # a few frames, the first after a gap, it had failed a CI run)
            await eventually(lambda: c.frames_since(t_moved) >= 25)
            end = time.monotonic()
            gap = c.longest_gap(t_rebind - 0.2, end)
            print(f"\nNAT rebinding: longest audio gap {gap * 1000:.0f} ms")
            assert c.heard_since(t_moved) > 0.001
            assert gap < 8.0
            heard = len(c.caller.result.frame_times)
        finally:
            await c.caller.close()
        # the session's own counts reach /metrics when it ends: what it played, at least
        # what the caller heard of it (a test after this one reads them)
        await asyncio.to_thread(
            wait_until, lambda: events(tx, "agent_frames_played") - played >= heard * 0.9
        )

    try:
        asyncio.run(main())
    finally:
        nat.close()


def test_unauthenticated_checks_do_not_keep_a_vanished_callers_session_alive() -> None:
    """Finding 3: an unauthenticated check every 5 s kept a dead session alive past 50 s.
    Only authenticated checks refresh consent (RFC 7675), so the session still ends."""
    relay = RelayProcess()
    agent = AgentProcess("echo")
    tx = TransceiverProcess("--consent-timeout", "7", agent_url=agent.url)
    start_all(relay, agent, tx)
    nat = Nat(relay.listen)
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind(("127.0.0.3", 0))
    spoofer = Spoofer()
    try:

        async def main() -> None:
            c = await call(tx, nat.inside_addr)
            nat.silent = True  # the caller is gone: nothing from it any more
            try:
                await asyncio.to_thread(keep_poking, c)
            finally:
                await c.caller.close()

        def keep_poking(c: Call) -> None:
            t0 = time.monotonic()
            ended = None
            while ended is None and time.monotonic() - t0 < 20:
                attacker.sendto(c.unsigned_check(), relay.listen)
                spoofer.send(nat.outside_addr, relay.listen, c.unsigned_check())  # as the caller
                path = f"/internal/v1/sessions/{c.session_id}"
                status, body = tx.request("PATCH", path, b"", "application/trickle-ice-sdpfrag")
                if status == 404:
                    ended = time.monotonic() - t0
                time.sleep(0.5)
            assert ended is not None, (  # (what it last said, for a run that fails here)
                f"the session outlived its consent: {status} {body!r:.300}; "
                f"stun_auth_fail {events(tx, 'stun_auth_fail')}"
            )
            assert b"consent_expired" in body
            assert ended < 7 + 3
            assert events(tx, "stun_auth_fail") >= 4

        asyncio.run(main())
    finally:
        spoofer.close()
        attacker.close()
        nat.close()
        for proc in (tx, agent, relay):
            proc.kill()


def flood(spoofer: Spoofer, dest: tuple[str, int], payloads: list[bytes], start: int) -> None:
    for src, payload in zip(spoofed_sources(len(payloads), start), payloads, strict=True):
        spoofer.send(src, dest, payload)


def udp_rcvbuf_errors() -> int:
    """Datagrams this machine's kernel dropped for a full socket receive buffer (all UDP
    sockets: another test process's drops can only make a bound that allows for these
    looser, never fail it)."""
    with open("/proc/net/snmp") as f:
        udp = [line.split() for line in f if line.startswith("Udp:")]
    return int(udp[1][udp[0].index("RcvbufErrors")])


def sample(
    relay: RelayProcess, flooding: threading.Thread, samples: list[float], at_least: float = 0
) -> None:
    """The relay's pending flows every 0.1 s while `flooding` runs, and for a second after
    (the workers report every 0.5 s); with `at_least`, on until one sample shows that many,
    for up to 8 s more (pending flows live 10 s): on a loaded machine the worker may still
    be reading the flood's backlog a second after it was sent (a CI run's samples were all 0
    for the 2.2 s it sampled)."""
    until = give_up = None
    while True:
        now = time.monotonic()
        if until is None and not flooding.is_alive():
            until, give_up = now + 1.0, now + 9.0
        if until is not None and now >= until:
            if max(samples, default=0) >= at_least or (give_up is not None and now >= give_up):
                break
        samples.append(relay.metric("firsthop_relay_pending_flows"))
        time.sleep(0.1)


def test_a_spoofed_flood_with_a_live_token_cannot_fill_the_tables(own_stack: Stack) -> None:
    """Finding 2: Binding requests carrying an attacker's own live ufrag from ~200k spoofed
    sources filled the relay's table to its cap (transceiver RSS 113 -> 249 MB), and a new
    call never connected. Now only a success response establishes a flow, the transceiver
    answers only checks that authenticate, and a token holds at most 8 pending and 8
    established flows: 20k spoofed sources leave the tables near empty, and new calls
    connect during the flood."""
    relay, tx = own_stack
    spoofer = Spoofer()
    rcvbuf_before = udp_rcvbuf_errors()

    async def main() -> tuple[list[float], Call, float]:
        bystander = await call(tx, relay.listen)
        attacker = await call(tx, relay.listen)  # the attacker's own call: its creds known
        unsigned = [attacker.unsigned_check() for _ in range(18000)]
        signed = [attacker.signed_check() for _ in range(2000)]  # as if a caller's
        assert tx.proc is not None
        rss_before = rss_mb(tx.proc.pid)
        t0 = time.monotonic()

        def signed_then_unsigned() -> None:
            flood(spoofer, relay.listen, signed, 0)
            flood(spoofer, relay.listen, unsigned, len(signed))

        thread = threading.Thread(target=signed_then_unsigned)
        samples: list[float] = []
        sampler = threading.Thread(target=sample, args=(relay, thread, samples, 8))
        thread.start()
        sampler.start()
        newcomer = await call(tx, relay.listen)  # connects during the flood
        await asyncio.to_thread(sampler.join)
        # the flood is over (and a second since); both calls hear their echo
        await eventually(
            lambda: (
                newcomer.heard_since(time.monotonic() - 1.0) > 0.001
                and bystander.heard_since(time.monotonic() - 1.0) > 0.001
            )
        )
        rss_growth = rss_mb(tx.proc.pid) - rss_before
        print(
            f"\nflood of {spoofer.sent} spoofed checks in {time.monotonic() - t0:.1f} s: "
            f"relay pending <= {max(samples, default=0):.0f}, "
            f"flows {relay.metric('firsthop_relay_flows'):.0f}, "
            f"transceiver RSS +{rss_growth:.1f} MB"
        )
        assert newcomer.heard_since(time.monotonic() - 1.0) > 0.001
        assert bystander.heard_since(time.monotonic() - 1.0) > 0.001
        for c in (bystander, attacker, newcomer):
            await c.caller.close()
        return samples, attacker, rss_growth

    try:
        samples, attacker, rss_growth = asyncio.run(main())
    finally:
        spoofer.close()
    assert 8 <= max(samples) <= 8 + 3  # the token's cap (reached), and our own calls
    assert relay.metric("firsthop_relay_flows") <= 8 + 3
    # every spoofed check that reached the relay went no further than the token's cap:
    # all 20k but the few the kernel dropped on a full receive buffer (a loaded machine)
    lost = udp_rcvbuf_errors() - rcvbuf_before
    wait_until(  # (a loaded machine's worker may still be reading the flood's backlog)
        lambda: (
            relay.metric("firsthop_relay_drops_total", reason="pending_per_token") > 15000 - lost
        )
    )
    assert relay.metric("firsthop_relay_drops_total", reason="table_full") == 0
    assert rss_growth < 40  # was +136 MB
    # what reached the transceiver unsigned was dropped there, never answered
    assert events(tx, "stun_auth_fail") >= 1


def test_a_flood_with_an_ended_calls_token_is_refused_at_the_relay(stack: Stack) -> None:
    """Finding 2, second half: the ufrag of an ended call is valid for hours; a flood with it
    filled the global pending pool (20k) within a second and new calls failed. The ended
    call's relay is told (TOKEN_REVOKED) once the call has lingered `LINGER` (3 s); a relay
    that was not is told on the first packet that reaches the transceiver; after that the
    token routes nowhere."""
    relay, tx = stack
    spoofer = Spoofer()

    async def main() -> Call:
        ended = await call(tx, relay.listen)
        revoked = relay.metric("firsthop_relay_revocations_total")
        status, _ = await asyncio.to_thread(
            tx.request, "DELETE", f"/internal/v1/sessions/{ended.session_id}"
        )
        assert status == 204
        await ended.caller.close()
        # told once the call has lingered (its caller's checks answered "call ended")
        await asyncio.to_thread(
            wait_until, lambda: relay.metric("firsthop_relay_revocations_total") > revoked
        )
        payloads = [ended.unsigned_check() for _ in range(10000)]
        thread = threading.Thread(target=flood, args=(spoofer, relay.listen, payloads, 50000))
        samples: list[float] = []
        sampler = threading.Thread(target=sample, args=(relay, thread, samples))
        pending_before = relay.metric("firsthop_relay_pending_flows")
        thread.start()
        sampler.start()
        newcomer = await call(tx, relay.listen)
        await asyncio.to_thread(sampler.join)
        assert max(samples) <= pending_before + 1  # the newcomer's own, at most
        await eventually(lambda: newcomer.heard_since(time.monotonic() - 1.0) > 0.001)
        await newcomer.caller.close()
        return ended

    try:
        asyncio.run(main())
    finally:
        spoofer.close()
    assert relay.metric("firsthop_relay_drops_total", reason="token_revoked") >= 10000
    assert events(tx, "revocations_sent") >= 1
