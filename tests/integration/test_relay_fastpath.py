"""The relay's C common cases (`services/relay/_fastpath.c`) on real loopback sockets.

It must do exactly what `FlowTable.known_client` / `known_return` and the Python loop do
for the datagrams it takes, and stop at every other one (so the full path sees it), with
the flow table's own dicts as the only state it reads. `test_relay.py` runs the whole relay
over both data paths; these pin the batch contract itself.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from firsthop.services.relay import _fastpath
from firsthop.services.relay.dataplane import datapath_in_use, native_forwarder
from firsthop.services.relay.flows import MAX_DATAGRAM, Flow
from firsthop.shared.wire.proxy_v2 import build_proxy_v2

INGRESS = ("127.0.0.1", 3478)
Address = tuple[str, int]


def udp(host: str = "127.0.0.1") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.settimeout(2.0)
    return sock


@pytest.fixture
def socks() -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []
    yield made
    for sock in made:
        sock.close()


def new(socks: list[socket.socket], host: str = "127.0.0.1") -> socket.socket:
    sock = udp(host)
    socks.append(sock)
    return sock


def addr(sock: socket.socket) -> Address:
    host, port = sock.getsockname()[:2]
    return host, port


def flow(client: Address, dest: Address, *, established: bool = True, **more: object) -> Flow:
    values: dict[str, object] = dict(
        client=client,
        dest=dest,
        token=b"t",
        header=build_proxy_v2(client, INGRESS),
        return_key=build_proxy_v2(INGRESS, client),
        via=None,
        ingress=INGRESS,
        established=established,
        created=0.0,
        last_seen=0.0,
    )
    values.update(more)
    return Flow(**values)  # type: ignore[arg-type]


def fill(sock: socket.socket) -> None:
    """Wait until `sock` is readable (loopback queues a datagram within its sendto)."""
    assert select.select([sock], [], [], 2.0)[0]


def drain(sock: socket.socket) -> list[bytes]:
    got = []
    sock.setblocking(False)
    try:
        while True:
            got.append(sock.recv(4096))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2.0)
    return got


def test_the_c_data_path_is_built_and_auto_picks_it() -> None:
    assert datapath_in_use("auto") == "c"
    assert datapath_in_use("python") == "python"
    assert native_forwarder("python") is None
    assert isinstance(native_forwarder("c"), _fastpath.Forwarder)


def test_the_datapath_flag_takes_its_three_words_and_is_carried_to_the_workers() -> None:
    import argparse

    from firsthop.services.relay import config as relay_config

    parser = argparse.ArgumentParser()
    relay_config.register(parser.add_subparsers(), "relay")
    key = ["--route-keys", "1=" + "A" * 43 + "="]
    for word in ("auto", "c", "python"):
        config = relay_config.config_from_args(
            parser.parse_args(["relay", *key, "--datapath", word])
        )
        assert relay_config.RelayConfig.from_json(config.to_json()).datapath == word
    with pytest.raises(SystemExit, match="--datapath is one of auto, c, python, not 'fast'"):
        relay_config.config_from_args(parser.parse_args(["relay", *key, "--datapath", "fast"]))


def test_client_datagrams_go_upstream_framed_in_order_and_stop_where_python_must_look(
    socks: list[socket.socket],
) -> None:
    fp = native_forwarder("c")
    public, upstream, client, stranger = new(socks), new(socks), new(socks), new(socks)
    up_conn = new(socks)
    up_conn.connect(addr(upstream))  # the relay's connected upstream socket
    f = flow(addr(client), addr(upstream))
    flows = {addr(client): f}
    fds = {addr(upstream): up_conn.fileno()}
    for i in range(3):
        client.sendto(bytes([0x80, i]) + b"rtp", addr(public))
    client.sendto(b"\x00\x01stun", addr(public))  # STUN: the full path's
    client.sendto(bytes([0x80, 9]) + b"rtp", addr(public))
    stranger.sendto(bytes([0x80, 7]) + b"rtp", addr(public))  # no flow
    fill(public)
    got = fp.receive(public.fileno())
    assert got == 6
    stop, sent, nbytes, dropped = fp.forward_clients(0, flows, fds, 12.5)
    assert (stop, sent, nbytes, dropped) == (3, 3, 15, 0)
    assert f.last_seen == 12.5
    assert fp.datagram(stop) == b"\x00\x01stun" and fp.source(stop) == addr(client)
    stop, sent, _, _ = fp.forward_clients(stop + 1, flows, fds, 13.0)
    assert (stop, sent) == (5, 1)
    assert fp.source(5) == addr(stranger)
    assert fp.forward_clients(6, flows, fds, 13.0)[:2] == (6, 0)
    frames = [upstream.recv(4096) for _ in range(4)]
    header = f.header
    assert frames == [header + bytes([0x80, i]) + b"rtp" for i in (0, 1, 2, 9)]
    assert drain(upstream) == []


def test_no_upstream_socket_oversize_or_empty_is_the_full_paths(
    socks: list[socket.socket],
) -> None:
    fp = native_forwarder("c")
    public, upstream, client = new(socks), new(socks), new(socks)
    f = flow(addr(client), addr(upstream))
    client.sendto(b"\x80" * (MAX_DATAGRAM + 1), addr(public))
    client.sendto(b"", addr(public))
    client.sendto(b"\x80rtp", addr(public))
    fill(public)
    assert fp.receive(public.fileno()) == 3
    flows = {addr(client): f}
    assert fp.forward_clients(0, flows, {}, 1.0)[0] == 0  # oversize
    assert fp.forward_clients(1, flows, {}, 1.0)[0] == 1  # empty
    assert fp.forward_clients(2, flows, {}, 1.0)[0] == 2  # no upstream socket yet
    assert f.last_seen == 0.0  # nothing it took


def test_replies_reach_established_clients_only_from_their_destination(
    socks: list[socket.socket],
) -> None:
    fp = native_forwarder("c")
    public, client, pending_client, up = new(socks), new(socks), new(socks), new(socks)
    transceiver, other = new(socks), new(socks)
    up.connect(addr(transceiver))
    peer_sock = new(socks)
    good = flow(addr(client), addr(transceiver))
    pending = flow(addr(pending_client), addr(transceiver), established=False)
    by_return = {good.return_key: good, pending.return_key: pending}
    transceiver.sendto(good.return_key + b"\x80one", addr(up))
    transceiver.sendto(pending.return_key + b"\x80two", addr(up))  # not established
    transceiver.sendto(good.return_key + b"\x80three", addr(up))
    transceiver.sendto(b"\x0d\x0a\x0d\x0a" + bytes(30), addr(up))  # no such header
    fill(up)
    assert fp.receive(up.fileno(), False) == 4
    fd = public.fileno()
    args = (by_return, addr(transceiver), 5.0, fd, fd, peer_sock.fileno())
    stop, sent, nbytes, _ = fp.forward_returns(0, *args)
    assert (stop, sent, nbytes) == (1, 1, 4)
    stop, sent, _, _ = fp.forward_returns(2, *args)
    assert (stop, sent) == (3, 1)
    assert good.last_seen == 5.0 and pending.last_seen == 0.0
    assert [client.recv(4096), client.recv(4096)] == [b"\x80one", b"\x80three"]
    assert drain(pending_client) == []
    # the same reply, said to come from another destination than the flow's: not taken
    transceiver.sendto(good.return_key + b"\x80four", addr(up))
    fill(up)
    assert fp.receive(up.fileno(), False) == 1
    assert fp.forward_returns(0, by_return, addr(other), 6.0, fd, fd, fd)[:2] == (0, 0)
    assert good.last_seen == 5.0


def test_second_hop_replies_go_back_to_the_first_relay_as_they_are_and_tcp_is_pythons(
    socks: list[socket.socket],
) -> None:
    fp = native_forwarder("c")
    peer_sock, first_hop, up, transceiver = new(socks), new(socks), new(socks), new(socks)
    up.connect(addr(transceiver))
    hop = flow(("198.51.100.7", 5000), addr(transceiver), via=addr(first_hop))
    tcp = flow(("198.51.100.8", 5000), addr(transceiver), stream=True)
    by_return = {hop.return_key: hop, tcp.return_key: tcp}
    transceiver.sendto(hop.return_key + b"\x80hop", addr(up))
    transceiver.sendto(tcp.return_key + b"\x80tcp", addr(up))
    fill(up)
    assert fp.receive(up.fileno(), False) == 2
    stop, sent, _, _ = fp.forward_returns(
        0, by_return, addr(transceiver), 1.0, -1, -1, peer_sock.fileno()
    )
    assert (stop, sent) == (1, 1)
    assert first_hop.recv(4096) == hop.return_key + b"\x80hop"


def test_ipv6_clients_both_ways(socks: list[socket.socket]) -> None:
    fp = native_forwarder("c")
    public6, client6 = new(socks, "::1"), new(socks, "::1")
    upstream, up, public4 = new(socks), new(socks), new(socks)
    up.connect(addr(upstream))
    ingress6 = ("::1", 3478)
    f = flow(
        addr(client6),
        addr(upstream),
        header=build_proxy_v2(addr(client6), ingress6),
        return_key=build_proxy_v2(ingress6, addr(client6)),
        ingress=ingress6,
    )
    client6.sendto(b"\x80six", addr(public6))
    fill(public6)
    assert fp.receive(public6.fileno()) == 1
    assert fp.source(0) == addr(client6)
    fds = {addr(upstream): up.fileno()}
    assert fp.forward_clients(0, {addr(client6): f}, fds, 1.0)[:2] == (1, 1)
    assert upstream.recv(4096) == f.header + b"\x80six"
    upstream.sendto(f.return_key + b"\x80back", addr(up))
    fill(up)
    assert fp.receive(up.fileno(), False) == 1
    args = ({f.return_key: f}, addr(upstream), 2.0, public4.fileno(), public6.fileno(), -1)
    assert fp.forward_returns(0, *args)[:2] == (1, 1)
    assert client6.recv(4096) == b"\x80back"


def test_a_flood_of_sources_costs_decodes_never_memory(socks: list[socket.socket]) -> None:
    """Every source is still read right (the table is keyed by a seeded hash, probes at most
    a few slots and starts again when full), and the table never holds more than its bound."""
    fp = native_forwarder("c")
    public = new(socks)
    seen = 0
    sent: list[Address] = []
    for i in range(4400):  # (a multiple of 200, past MAX_SOURCES: the table starts again)
        # a new source address each time (127.1.x.y), as a spoofing flood's would be
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as src:
            src.bind((f"127.1.{i // 250}.{i % 250 + 1}", 0))
            src.sendto(b"\x80x", addr(public))
            sent.append(addr(src))
        if i % 200 == 199:
            fill(public)
            got = fp.receive(public.fileno())
            assert [fp.source(j) for j in range(got)] == sent[seen : seen + got]
            seen += got
            assert fp.sources_cached <= _fastpath.MAX_SOURCES
    assert seen > _fastpath.MAX_SOURCES
    # a source seen again is read right too (from the table or decoded anew)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as src:
        src.bind(sent[-1])
        src.sendto(b"\x80y", addr(public))
    fill(public)
    assert fp.receive(public.fileno()) == 1 and fp.source(0) == sent[-1]


def test_a_refused_send_is_a_counted_drop_and_the_rest_still_go(
    socks: list[socket.socket],
) -> None:
    import errno

    fp = native_forwarder("c")
    public, client, client2, gone, alive = (new(socks) for _ in range(5))
    to_gone, to_alive = new(socks), new(socks)
    gone_addr = addr(gone)
    to_gone.connect(gone_addr)
    to_alive.connect(addr(alive))
    gone.close()
    to_gone.send(b"x")  # the ICMP port unreachable it draws fails the next send there
    flows = {
        addr(client): flow(addr(client), gone_addr),
        addr(client2): flow(addr(client2), addr(alive)),
    }
    fds = {gone_addr: to_gone.fileno(), addr(alive): to_alive.fileno()}
    for _ in range(2):
        client.sendto(b"\x80a", addr(public))
        client2.sendto(b"\x80b", addr(public))
    fill(public)
    assert fp.receive(public.fileno()) == 4
    stop, sent, _, dropped = fp.forward_clients(0, flows, fds, 1.0)
    assert (stop, sent, dropped) == (4, 3, 1)
    assert fp.errnos == {errno.ECONNREFUSED: 1}
    assert [alive.recv(4096) for _ in range(2)] == [flows[addr(client2)].header + b"\x80b"] * 2


def test_a_first_hops_frames_go_on_as_they_are_from_that_relay_only(
    socks: list[socket.socket],
) -> None:
    fp = native_forwarder("c")
    peer_sock, first_hop, other_relay, transceiver, up = (new(socks) for _ in range(5))
    up.connect(addr(transceiver))
    client = ("198.51.100.9", 6000)
    hop = flow(client, addr(transceiver), via=addr(first_hop))
    hop_flows = {hop.header: hop}
    fds = {addr(transceiver): up.fileno()}
    first_hop.sendto(hop.header + b"\x80one", addr(peer_sock))
    first_hop.sendto(hop.header + b"\x00\x01stun", addr(peer_sock))  # the full path's
    first_hop.sendto(hop.header + b"\x80two", addr(peer_sock))
    other_relay.sendto(hop.header + b"\x80forged", addr(peer_sock))  # not the flow's first hop
    fill(peer_sock)
    assert fp.receive(peer_sock.fileno()) == 4
    stop, sent, nbytes, _ = fp.forward_peers(0, hop_flows, fds, 3.0)
    assert (stop, sent, nbytes) == (1, 1, 4)
    stop, sent, _, _ = fp.forward_peers(2, hop_flows, fds, 4.0)
    assert (stop, sent) == (3, 1)
    assert fp.source(3) == addr(other_relay)
    assert hop.last_seen == 4.0
    assert [transceiver.recv(4096) for _ in range(2)] == [
        hop.header + b"\x80one",
        hop.header + b"\x80two",
    ]
    assert drain(transceiver) == []


SIZES: dict[str, Any] = {
    "count": 4,
    "size": 1996,
    "headroom": 52,
    "flow_type": Flow,
    "v4_header": 28,
    "v6_header": 52,
    "v6_family_min": 0x21,
    "stun_last": 3,
    "max_datagram": MAX_DATAGRAM,
}


def test_a_forwarder_whose_init_failed_refuses_every_call(socks: list[socket.socket]) -> None:
    """A helper's read of the C (stop 42): an __init__ that failed after the buffers were
    made (a header shorter than its family byte) left a Forwarder that a second __init__
    refused and whose methods ran on NULL keys (a segfault). Now each method refuses it, and
    the sizes are checked first. (Only a bad call reaches this: the relay passes constants.)"""
    for bad in ({"v4_header": -1}, {"v4_header": 13}, {"max_datagram": -1}):
        half = _fastpath.Forwarder.__new__(_fastpath.Forwarder)
        with pytest.raises(ValueError, match="bad Forwarder sizes"):
            half.__init__(**(SIZES | bad))  # type: ignore[misc]
        a, b = new(socks), new(socks)
        b.sendto(bytes(40), addr(a))
        for method, args in (
            ("receive", (a.fileno(), False)),
            ("datagram", (0,)),
            ("source", (0,)),
            ("forward_clients", (0, {}, {}, 0.0)),
            ("forward_returns", (0, {}, INGRESS, 0.0, -1, -1, -1)),
            ("forward_peers", (0, {}, {}, 0.0)),
        ):
            with pytest.raises(RuntimeError, match="not initialised"):
                getattr(half, method)(*args)


def test_a_start_past_the_batch_forwards_nothing(socks: list[socket.socket]) -> None:
    forwarder = _fastpath.Forwarder(**SIZES)
    a, b = new(socks), new(socks)
    b.sendto(bytes(40), addr(a))
    select.select([a], [], [], 2)
    assert forwarder.receive(a.fileno()) == 1
    for start in (1, 2**32, 2**40):  # (a 32-bit wrap had started again at 0)
        assert forwarder.forward_clients(start, {}, {}, 0.0) == (1, 0, 0, 0)


class Served:
    """`Forwarder.serve`'s answer, by name."""

    def __init__(self, answer: tuple[int, ...]) -> None:
        (self.why, self.fd, self.got, self.stop, self.handled, self.last, self.more) = answer[:7]
        self.up, self.up_bytes, self.down, self.down_bytes, self.dropped = answer[7:12]
        self.recv_errors, self.upstream_errors = answer[12:]


def test_serve_carries_wake_up_after_wake_up_in_c_until_one_needs_python(
    socks: list[socket.socket],
) -> None:
    """The worker's wait in C: the common cases of many wake-ups, both ways, with no
    return to Python; it comes back at its timeout, at a datagram that is not a common
    case (those before it sent), at a descriptor that is not a datagram socket (nothing of
    that wake-up read), and at a wake-up the gather must see."""
    import os
    import threading
    import time

    fp = native_forwarder("c")
    public, client, transceiver, up = new(socks), new(socks), new(socks), new(socks)
    peer_sock = new(socks)
    up.connect(addr(transceiver))
    f = flow(addr(client), addr(transceiver))
    flows, by_return = {addr(client): f}, {f.return_key: f}
    fds = {addr(transceiver): up.fileno()}
    routes: dict[int, Any] = {
        public.fileno(): 0,
        peer_sock.fileno(): 1,
        up.fileno(): addr(transceiver),
    }
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    ep = select.epoll()
    for fd in (public.fileno(), peer_sock.fileno(), up.fileno(), wake):
        ep.register(fd, select.EPOLLIN)
    pub = public.fileno()

    def serve(timeout: float, busy: bool = False, min_batch: int = 4) -> Served:
        answer = fp.serve(
            ep.fileno(), timeout, routes, flows, by_return, {}, fds, pub, pub,
            peer_sock.fileno(), busy, min_batch,
        )  # fmt: skip
        return Served(answer)

    def talk() -> None:  # a call's packets, one a wake-up, both ways
        for i in range(10):
            client.sendto(bytes([0x80, i]) + b"up", addr(public))
            transceiver.sendto(f.return_key + bytes([0x80, i]) + b"down", addr(up))
            time.sleep(0.005)

    try:
        talker = threading.Thread(target=talk)
        talker.start()
        started = time.monotonic()
        served = serve(0.5, min_batch=100)  # (a late talker's burst is no gather's business)
        talker.join()
        assert served.why == _fastpath.SERVE_TIMEOUT and time.monotonic() - started >= 0.5
        assert (served.handled, served.up, served.down) == (20, 10, 10)
        assert (served.up_bytes, served.down_bytes) == (40, 60)
        assert [transceiver.recv(4096) for _ in range(10)] == [
            f.header + bytes([0x80, i]) + b"up" for i in range(10)
        ]
        assert [client.recv(4096) for _ in range(10)] == [
            bytes([0x80, i]) + b"down" for i in range(10)
        ]
        assert f.last_seen > 1e9  # (wall-clock time, as time.time())

        # a datagram of no flow stops it there: the two before it have gone
        client.sendto(b"\x80a", addr(public))
        client.sendto(b"\x80b", addr(public))
        new(socks).sendto(b"\x80stranger", addr(public))
        client.sendto(b"\x80c", addr(public))
        fill(public)  # (and the rest: loopback queues a datagram within its sendto)
        served = serve(2.0, min_batch=100)
        assert (served.why, served.fd, served.got, served.stop) == (_fastpath.SERVE_SLOW, pub, 4, 2)
        assert fp.datagram(2) == b"\x80stranger"
        assert drain(transceiver) == [f.header + b"\x80a", f.header + b"\x80b"]
        assert fp.forward_clients(3, flows, fds, 1.0)[:2] == (4, 1)  # (what Python goes on with)

        # something else ready: back at once, the datagram beside it unread
        client.sendto(b"\x80d", addr(public))
        fill(public)
        os.eventfd_write(wake, 1)
        served = serve(2.0)
        assert (served.why, served.handled) == (_fastpath.SERVE_OTHER, 0)
        assert {fd for fd, _ in ep.poll(0)} == {pub, wake}
        os.eventfd_read(wake)
        # a command after a datagram: its wake-up is charged none of the datagram's
        threading.Timer(0.05, os.eventfd_write, (wake, 1)).start()
        served = serve(2.0, min_batch=100)
        assert (served.why, served.handled, served.last) == (_fastpath.SERVE_OTHER, 1, 0)
        os.eventfd_read(wake)
        with pytest.raises(ValueError, match="timeout"):
            serve(float("nan"))  # (it would wait for ever)

        # a wake-up of min_batch datagrams is the gather's to see; so is any one when busy
        for _ in range(4):
            client.sendto(b"\x80e", addr(public))
        served = serve(2.0, min_batch=4)
        assert (served.why, served.last, served.handled) == (_fastpath.SERVE_BUSY, 4, 4)
        client.sendto(b"\x80f", addr(public))
        served = serve(2.0, busy=True)
        assert (served.why, served.last) == (_fastpath.SERVE_BUSY, 1)
        assert len(drain(transceiver)) == 1 + 1 + 4 + 1  # (c, d, the four e, f)
    finally:
        ep.close()
        os.close(wake)
