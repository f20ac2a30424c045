"""Attacks on signaling that needed no credential, or only one, against real processes.

* Made-up HTTP methods: each token sent became a `method` label of its own (3000 requests, 3000
  series, a 1.7 MB /metrics) and none of them reached a rate limit. Now a method outside the
  closed set is answered 501 after the per-IP budget is spent, its connection closed, and
  counted as ``method="other"``.
* IPv6: every address of one /64 had a budget of its own; now the /64 has one (the relay
  already counted that way), in a network namespace whose /64s are local routes.
* Ephemeral keys: 1000 mints of 16 KiB sessions with 2 h expiry took 16 MB of Redis in 2 s;
  now an API key holds at most ``--max-ephemeral-keys`` live ones (the dev route, in all,
  ``--max-dev-ephemeral-keys``), counted in Redis across replicas.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import httpx
import pytest
import redis as redis_lib

from firsthop.shared.metrics import parse_text
from tests.support import (
    RedisServer,
    SignalingProcess,
    TransceiverProcess,
    network_namespace,
    redis_server,
    wait_until,
)
from tests.unit.test_signaling_app import OFFER

KEY = SignalingProcess.API_KEY


def metrics(sig: SignalingProcess) -> str:
    return httpx.get(f"{sig.url}/metrics", timeout=5).text


def raw_request(port: int, method: str, *, keep_alive_second: bool = False) -> list[bytes]:
    """One request with `method` (and, asked for, a second on the same connection); the
    status lines that came back before the server closed the connection."""
    request = f"{method} /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    data = request.encode() * (2 if keep_alive_second else 1)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):  # until it closes the connection
            got += chunk
    return [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


@pytest.fixture(scope="module")
def sig() -> Iterator[SignalingProcess]:
    process = SignalingProcess("--ip-rate", "5", "--ip-burst", "20").start()
    yield process
    process.kill()


def test_made_up_methods_add_no_series_and_spend_the_ip_budget(sig: SignalingProcess) -> None:
    before = parse_text(metrics(sig))
    statuses: list[bytes] = []
    for i in range(300):
        lines = raw_request(sig.port, f"FOO{i:05d}", keep_alive_second=True)
        assert len(lines) == 1  # answered, and its connection closed: no second answer
        statuses.append(lines[0][9:12])
    for i in range(20):  # 8 KB method tokens: the same
        (line,) = raw_request(sig.port, "M" * 8000 + str(i))
        statuses.append(line[9:12])
    assert set(statuses) == {b"501", b"429"}
    assert statuses[:20] == [b"501"] * 20  # the burst; then the budget is spent
    assert statuses.count(b"429") >= 250
    after = parse_text(metrics(sig))
    labels = {dict(k).get("method") for (name, k) in after if name.endswith("requests_total")}
    assert labels <= {"GET", "POST", "other", None}
    # the series added: "other" by status (501, 429), the 429s', and the first /metrics'
    added = {key for key in after if key not in before}
    assert len(added) <= 4, added
    assert len(metrics(sig)) < 10_000


NETNS_CLIENT = textwrap.dedent(
    """
    import http.client, json, sys
    port, sources = int(sys.argv[1]), sys.argv[2:]
    out = {}
    for source in sources:
        statuses = []
        for _ in range(6):
            conn = http.client.HTTPConnection("::1", port, timeout=5, source_address=(source, 0))
            conn.request("POST", "/v1/calls", body=b"", headers={"Content-Type": "text/plain"})
            statuses.append(conn.getresponse().status)
            conn.close()
        out[source] = statuses
    print(json.dumps(out))
    """
)


@pytest.mark.timeout(120)
def test_ipv6_addresses_of_one_64_share_one_budget() -> None:
    with network_namespace() as ns:
        for prefix in ("2001:db8:1::/64", "2001:db8:2::/64"):
            ns.run("ip", "-6", "route", "add", "local", prefix, "dev", "lo")
        ns.run("sysctl", "-q", "-w", "net.ipv6.ip_nonlocal_bind=1")
        sig = SignalingProcess("--listen", "[::]:0", "--ip-rate", "0.01", "--ip-burst", "3")
        sig.spec.argv[:0] = ["ip", "netns", "exec", ns.name]
        sig.start()
        try:
            sources = ["2001:db8:1::a", "2001:db8:1::b", "2001:db8:1:0:ffff::1", "2001:db8:2::a"]
            done = ns.run(sys.executable, "-c", NETNS_CLIENT, str(sig.port), *sources)
            got = json.loads(done.stdout)
        finally:
            sig.kill()
    limited = [s.count(429) for s in got.values()]
    # one /64: its first address spends the budget (3), the next two find it spent
    assert got["2001:db8:1::a"] == [415, 415, 415, 429, 429, 429], got
    assert limited[1:3] == [6, 6], got
    assert got["2001:db8:2::a"][:3] == [415, 415, 415], got  # another /64: its own budget


def mint(
    sig: SignalingProcess, key: str = KEY, path: str = "/v1/realtime/client_secrets"
) -> httpx.Response:
    body = {"expires_after": {"seconds": 7200}, "session": {"instructions": "x" * 16000}}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{sig.url}{path}", json=body, headers=headers, timeout=10)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_live_ephemeral_keys_are_bounded_per_api_key_across_replicas(redis: RedisServer) -> None:
    flags = ("--redis", redis.url, "--max-ephemeral-keys", "5", "--key-burst", "1000")
    keys = f"{KEY},other-key"
    one = SignalingProcess(*flags, api_keys=keys).start()
    two = SignalingProcess(*flags, api_keys=keys).start()
    client = redis_lib.Redis.from_url(redis.url)
    try:
        minted = [mint(one if i % 2 else two).status_code for i in range(5)]
        assert minted == [200] * 5
        refused = [mint(one), mint(two)]
        assert [r.status_code for r in refused] == [429, 429]
        assert refused[0].json()["error"]["code"] == "rate_limit_exceeded"
        assert 7000 <= int(refused[0].headers["Retry-After"]) <= 7201  # when the oldest expires
        assert mint(one, "other-key").status_code == 200  # another key's own budget
        (live,) = [k for k in client.scan_iter("firsthop:ek-live:*") if client.zcard(k) == 5]
        assert 7000 <= client.ttl(live) <= 7202  # gone with its last key
        sessions = list(client.scan_iter("firsthop:ek:*"))
        assert len(sessions) == 6  # what was refused stored nothing
        assert sum(client.memory_usage(k) or 0 for k in sessions) < 6 * 20_000
        totals = {k: int(client.get(k) or 0) for k in client.scan_iter("firsthop:ek-bytes:*")}
        (counted,) = [k for k, n in totals.items() if n > 80_000]  # five sessions of 16 KB
        assert 7000 <= client.ttl(counted) <= 7202
    finally:
        client.close()
        one.kill()
        two.kill()


def test_the_bytes_of_an_api_keys_live_ephemeral_keys_are_bounded(redis: RedisServer) -> None:
    flags = ("--redis", redis.url, "--max-ephemeral-key-bytes", "50000", "--key-burst", "1000")
    sig = SignalingProcess(*flags, api_keys="bytes-key").start()  # (a tenant of its own)
    try:
        statuses = [mint(sig, "bytes-key").status_code for _ in range(5)]  # ~16 KB each
        assert statuses == [200, 200, 200, 429, 429]
    finally:
        sig.kill()


def test_the_keyless_dev_route_has_one_bound_in_all() -> None:
    dev = SignalingProcess("--dev", "--max-dev-ephemeral-keys", "2").start()
    try:
        path = "/v1/dev/realtime/client_secrets"
        statuses = [mint(dev, "", path).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert mint(dev).status_code == 200  # an API key's budget is not the dev route's
    finally:
        dev.kill()


def test_a_bound_that_cannot_be_met_is_refused_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "firsthop.services.cli", "signaling", "--max-ephemeral-keys", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0 and "--max-ephemeral-keys" in done.stderr


@pytest.mark.timeout(120)
def test_a_call_placed_the_moment_a_transceiver_is_up_finds_it(redis: RedisServer) -> None:
    """The directory's copy of the registry (read at most every 0.5 s) was up to half a second
    stale: 5 of 10 calls placed within 0.4 s of a start got 503 although the transceiver was
    registered. A miss now reads the registry again; a transceiver reports ready once it is
    registered; and signaling's /readyz means a call would be placed."""
    sig = SignalingProcess("--redis", redis.url, "--ingress", "127.0.0.1:3478", "--ip-rate", "0")
    sig.start()
    stop = threading.Event()

    def keep_the_copy_fresh() -> None:  # someone probing all along: the copy is always young
        while not stop.is_set():
            httpx.get(f"{sig.url}/healthz", timeout=5)
            stop.wait(0.05)

    prober = threading.Thread(target=keep_the_copy_fresh, daemon=True)
    prober.start()
    statuses: list[int] = []
    try:
        assert httpx.get(f"{sig.url}/readyz", timeout=5).status_code == 503
        for i in range(3):
            tx = TransceiverProcess("--region", "a", "--redis", redis.url, tx_id=f"tx-race-{i}")
            tx.start()
            try:
                headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
                resp = httpx.post(f"{sig.url}/v1/calls", content=OFFER, headers=headers, timeout=10)
                statuses.append(resp.status_code)
                assert httpx.get(f"{sig.url}/readyz", timeout=5).json()["ready"] is True
                if resp.status_code == 201:  # (then the transceiver has nothing to drain)
                    ended = httpx.delete(sig.url + resp.headers["Location"], headers=headers)
                    assert ended.status_code == 204
            finally:
                tx.stop()
            wait_until(lambda: httpx.get(f"{sig.url}/readyz", timeout=5).status_code == 503, 15)
    finally:
        stop.set()
        prober.join()
        sig.kill()
    assert statuses == [201] * 3


def test_behind_a_trusted_proxy_each_client_has_its_own_budget() -> None:
    """Behind an ingress every request came from the controller: one budget for everyone, so
    one client past it had every client refused (the k8s manifest loosened the limit to 200/s
    instead). With --trusted-proxy, the controller's X-Forwarded-For names the client."""
    sig = SignalingProcess("--trusted-proxy", "127.0.0.0/8", "--ip-rate", "0.01", "--ip-burst", "2")
    sig.start()
    try:

        def post(forwarded: str | None) -> int:
            headers = {"Content-Type": "text/plain"}
            if forwarded is not None:
                headers["X-Forwarded-For"] = forwarded
            return httpx.post(f"{sig.url}/v1/calls", headers=headers, timeout=5).status_code

        assert [post("203.0.113.9") for _ in range(3)] == [415, 415, 429]
        assert post("198.51.100.7") == 415  # another client: its own budget
        assert post("1.2.3.4, 203.0.113.9") == 429  # what the client prepends is not believed
        assert [post(None) for _ in range(3)] == [415, 415, 429]  # the proxy's own requests
    finally:
        sig.kill()
    plain = SignalingProcess("--ip-rate", "0.01", "--ip-burst", "2").start()  # none trusted
    try:
        headers = {"Content-Type": "text/plain"}
        statuses = [
            httpx.post(
                f"{plain.url}/v1/calls", headers={**headers, "X-Forwarded-For": f"203.0.113.{i}"}
            ).status_code
            for i in range(3)
        ]
        assert statuses == [415, 415, 429]  # the header is anyone's word: ignored
    finally:
        plain.kill()
