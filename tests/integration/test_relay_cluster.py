"""Real relay processes: SO_REUSEPORT workers, Global Relay hops, Redis flow recovery."""

from __future__ import annotations

import os
import signal
import time

import redis as redis_lib

from firsthop.shared.wire.route_token import verify_route_token
from tests.integration.test_relay import open_call
from tests.support import (
    KEYS,
    Endpoint,
    FakeTransceiver,
    RedisServer,
    RelayProcess,
    binding_request,
    binding_success,
    mint,
    redis_server,
    rtp,
    wait_until,
)

OK = binding_success()


def test_two_workers_share_the_port_and_keep_each_client_on_one() -> None:
    # port 0: the relay chooses its ports (one for both workers) and says which
    relay = RelayProcess(workers=2, listen_port=0, internal_port=0).start()
    assert relay.listen[1] != 0 and relay.internal[1] != 0
    tx = FakeTransceiver()
    clients = [Endpoint() for _ in range(24)]
    try:
        assert relay.metric("firsthop_relay_workers") == 2
        vias = {}
        for c in clients:
            vias[c.addr] = open_call(relay, c, tx)
        assert len(set(vias.values())) == 2  # both workers carry flows (2^-23 to fail)
        for round_ in range(3):
            for c in clients:
                c.send(rtp(round_), relay.listen)
                src, _, payload, via = tx.recv_framed()
                assert via == vias[src]  # a client's packets always come through one worker
                tx.reply(via, src, relay.listen, payload)
            for c in clients:
                assert c.recv() == (rtp(round_), relay.listen)
        assert relay.wait_metric("firsthop_relay_flows", 24) == 24
    finally:
        for c in clients:
            c.close()
        tx.close()
        relay.kill()


def test_global_relay_hop_preserves_client_and_returns_through_first_relay() -> None:
    b = RelayProcess(cluster=2).start()
    a = RelayProcess("--peer", f"2={b.internal[0]}:{b.internal[1]}", cluster=1).start()
    tx = FakeTransceiver()  # a transceiver of cluster 2
    client = Endpoint()
    try:
        req = binding_request(mint(*tx.addr, cluster=2))
        client.send(req, a.listen)
        src, dst, payload, via = tx.recv_framed()
        # the original client address and the ingress it used survive both hops
        assert (src, dst, payload) == (client.addr, a.listen, req)
        answer = binding_success()
        tx.reply(via, client.addr, a.listen, answer)
        assert client.recv() == (answer, a.listen)
        for seq in range(10):
            client.send(rtp(seq), a.listen)
            assert tx.recv_framed()[2] == rtp(seq)
            tx.reply(via, client.addr, a.listen, rtp(500 + seq))
            assert client.recv() == (rtp(500 + seq), a.listen)
        assert a.wait_metric("firsthop_relay_flows", 1) == 1
        assert b.wait_metric("firsthop_relay_flows", 1) == 1
    finally:
        client.close()
        tx.close()
        a.kill()
        b.kill()


def _restart(relay: RelayProcess, redis_url: str | None = None) -> RelayProcess:
    relay.stop()
    return RelayProcess(
        listen_port=relay.listen[1], internal_port=relay.internal[1], redis_url=redis_url
    ).start()


def test_restart_with_redis_resumes_media_before_any_stun() -> None:
    with redis_server() as rs:
        relay = RelayProcess(redis_url=rs.url).start()
        tx, client = FakeTransceiver(), Endpoint()
        try:
            via = open_call(relay, client, tx)
            client.send(rtp(1), relay.listen)
            tx.recv_framed()
            assert relay.wait_metric("firsthop_relay_redis_writes_total", 1) >= 1
            key = f"firsthop:flow:{client.addr[0]}:{client.addr[1]}"
            stored = redis_lib.Redis.from_url(rs.url).hgetall(key)
            assert verify_route_token(stored[b"token"], KEYS, time.time()).dest == tx.addr
            assert stored[b"hop"] == b""
            assert 0 < redis_lib.Redis.from_url(rs.url).ttl(key) <= 60
            relay = _restart(relay, redis_url=rs.url)
            t0 = time.monotonic()
            client.send(rtp(2), relay.listen)  # media, no STUN
            src, _, payload, via = tx.recv_framed()
            gap = time.monotonic() - t0
            assert (src, payload) == (client.addr, rtp(2))  # the packet that asked is not lost
            print(f"\nredis recovery: media forwarded {gap * 1e3:.1f} ms after restart")
            tx.reply(via, client.addr, relay.listen, rtp(3))
            assert client.recv()[0] == rtp(3)
            assert relay.wait_metric("firsthop_relay_recoveries_total", 1) == 1
        finally:
            client.close()
            tx.close()
            relay.kill()


def test_restart_without_redis_resumes_at_next_binding_request() -> None:
    relay = RelayProcess().start()
    tx, client = FakeTransceiver(), Endpoint()
    try:
        token = mint(*tx.addr)
        client.send(binding_request(token), relay.listen)
        *_, via = tx.recv_framed()
        tx.reply(via, client.addr, relay.listen, OK)
        client.recv()
        relay = _restart(relay)
        client.send(rtp(1), relay.listen)
        assert tx.recv_none()  # nothing knows this client any more
        client.send(binding_request(token), relay.listen)  # the next consent check
        *_, via = tx.recv_framed()
        tx.reply(via, client.addr, relay.listen, OK)
        assert client.recv()[0] == OK
        client.send(rtp(2), relay.listen)
        assert tx.recv_framed()[2] == rtp(2)
    finally:
        client.close()
        tx.close()
        relay.kill()


def test_redis_down_mid_run_forwarding_goes_on_and_recovers() -> None:
    rs = RedisServer()
    rs.start()
    relay = RelayProcess(redis_url=rs.url).start()
    tx, c1, c2 = FakeTransceiver(), Endpoint(), Endpoint()
    try:
        via = open_call(relay, c1, tx)
        rs.stop()
        for seq in range(20):
            c1.send(rtp(seq), relay.listen)
            assert tx.recv_framed()[2] == rtp(seq)
            tx.reply(via, c1.addr, relay.listen, rtp(seq))
            assert c1.recv()[0] == rtp(seq)
        open_call(relay, c2, tx)  # new calls still open while Redis is down
        assert relay.wait_metric("firsthop_relay_redis_errors_total", 1) >= 1
        rs.start()  # same port
        r = redis_lib.Redis.from_url(rs.url)
        key = f"firsthop:flow:{c2.addr[0]}:{c2.addr[1]}"
        wait_until(lambda: r.exists(key))  # the held-back write landed once Redis returned
    finally:
        c1.close()
        c2.close()
        tx.close()
        relay.kill()
        rs.stop()


def _kill_worker(relay: RelayProcess) -> tuple[int, int]:
    """SIGKILL the relay's (one) serving worker once its warm standby is ready; returns
    (the killed pid, the standby's pid)."""
    assert relay.wait_metric("firsthop_relay_standby_workers", 1) == 1
    health = relay.health()
    (worker,), standby = health["worker_pids"], health["standby_pid"]
    assert standby is not None and standby != worker
    os.kill(worker, signal.SIGKILL)
    return worker, standby


def _media_until_forwarded(client: Endpoint, relay: RelayProcess, tx: FakeTransceiver) -> int:
    """Media alone (no STUN), every 20 ms as a call sends it, until one reaches the
    transceiver; returns how many were sent (bounded: a lost flow fails the test)."""
    for sent in range(1, 250):  # 5 s
        client.send(rtp(100 + sent), relay.listen)
        try:
            src, _, payload, _ = tx.recv_framed(timeout=0.02)
        except TimeoutError:
            continue
        assert src == client.addr and payload[0] & 0xC0 == 0x80  # RTP, not a check
        return sent
    raise AssertionError("no media forwarded within 5 s of the worker's death")


def test_killed_worker_standby_takes_over_and_media_resumes_without_stun() -> None:
    with redis_server() as rs:
        relay = RelayProcess(redis_url=rs.url).start()
        tx, client = FakeTransceiver(), Endpoint()
        try:
            open_call(relay, client, tx)
            assert relay.wait_metric("firsthop_relay_redis_writes_total", 1) >= 1
            _, standby = _kill_worker(relay)
            sent = _media_until_forwarded(client, relay, tx)
            print(f"\nworker kill: media forwarded again after {sent} packets of 20 ms")
            wait_until(lambda: relay.health()["worker_pids"] == [standby])  # it took over
            assert relay.wait_metric("firsthop_relay_takeovers_total", 1) == 1
            assert relay.wait_metric("firsthop_relay_recoveries_total", 1) == 1  # from Redis
            client.send(rtp(7), relay.listen)
            *_, via = tx.recv_framed()  # the new worker's own socket: replies go there
            tx.reply(via, client.addr, relay.listen, rtp(8))
            assert client.recv()[0] == rtp(8)
            # a new standby is started for the next failure
            assert relay.wait_metric("firsthop_relay_standby_workers", 1, timeout=10) == 1
            assert relay.health()["standby_pid"] not in (None, standby)
        finally:
            client.close()
            tx.close()
            relay.kill()


def test_redis_down_and_worker_killed_standby_recovers_from_its_copy() -> None:
    rs = RedisServer()
    rs.start()
    relay = RelayProcess(redis_url=rs.url).start()
    tx, client = FakeTransceiver(), Endpoint()
    try:
        open_call(relay, client, tx)
        # the standby copies the flow cache every 2 s: wait until it holds this flow
        assert relay.wait_metric("firsthop_relay_standby_flows", 1, timeout=10) >= 1
        rs.stop()
        _kill_worker(relay)
        sent = _media_until_forwarded(client, relay, tx)
        print(f"\nRedis down, worker kill: media forwarded again after {sent} packets of 20 ms")
        assert relay.wait_metric("firsthop_relay_snapshot_hits_total", 1) >= 1
        assert relay.metric("firsthop_relay_redis_errors_total") >= 1  # it did ask Redis first
    finally:
        client.close()
        tx.close()
        relay.kill()
        rs.stop()


def test_without_standby_a_killed_worker_is_cold_started_and_recovers_from_redis() -> None:
    with redis_server() as rs:
        relay = RelayProcess("--no-standby", redis_url=rs.url).start()
        tx, client = FakeTransceiver(), Endpoint()
        try:
            open_call(relay, client, tx)
            assert relay.wait_metric("firsthop_relay_redis_writes_total", 1) >= 1
            assert relay.health()["standby_pid"] is None
            (worker,) = relay.health()["worker_pids"]
            os.kill(worker, signal.SIGKILL)
            _media_until_forwarded(client, relay, tx)
            assert relay.wait_metric("firsthop_relay_worker_restarts_total", 1) == 1
            assert relay.metric("firsthop_relay_takeovers_total") == 0
            assert relay.wait_metric("firsthop_relay_recoveries_total", 1) == 1
        finally:
            client.close()
            tx.close()
            relay.kill()


def test_a_dead_standby_is_replaced_and_each_of_two_kills_is_taken_over() -> None:
    with redis_server() as rs:
        relay = RelayProcess(redis_url=rs.url).start()
        tx, client = FakeTransceiver(), Endpoint()
        try:
            assert relay.wait_metric("firsthop_relay_standby_workers", 1) == 1
            first_standby = relay.health()["standby_pid"]
            os.kill(first_standby, signal.SIGKILL)  # idle, it dies: another is started
            wait_until(lambda: relay.health()["standby_pid"] not in (None, first_standby))
            assert relay.wait_metric("firsthop_relay_takeovers_total", 0) == 0
            open_call(relay, client, tx)
            assert relay.wait_metric("firsthop_relay_redis_writes_total", 1) >= 1
            for kills in (1, 2):
                _, standby = _kill_worker(relay)
                _media_until_forwarded(client, relay, tx)
                serving = [standby]
                wait_until(lambda: relay.health()["worker_pids"] == serving)  # noqa: B023
                assert relay.wait_metric("firsthop_relay_takeovers_total", kills) == kills
        finally:
            client.close()
            tx.close()
            relay.kill()
