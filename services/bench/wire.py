"""`firsthop bench wire`: cost of the relay's first-packet decision.

The decision is what the relay does with the first datagram from an unknown client address:
pull the server ufrag out of the STUN Binding request and verify it as a route token. It is
timed on realistic browser-shaped Binding requests, next to a bare
``hmac.new(key, msg, "sha256").digest()`` over a token body in the same run, and reported
as a ratio to that baseline (aim: <= 2x).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import statistics
import struct
import time
import timeit
from collections.abc import Callable
from typing import Any

from firsthop.shared.wire import stun
from firsthop.shared.wire.route_token import (
    DestinationFilter,
    Keyring,
    encode_route_token,
    verify_route_token,
)

GOOG_NETWORK_INFO = 0xC057


def chrome_like_binding_request(server_ufrag: str, client_ufrag: str, password: str) -> bytes:
    """A Binding request shaped like Chromium's ICE checks (RFC 8445 §7.2.2)."""
    tid = os.urandom(12)
    attrs = [
        (stun.USERNAME, f"{server_ufrag}:{client_ufrag}".encode()),
        (GOOG_NETWORK_INFO, struct.pack("!HH", 1, 10)),
        (stun.ICE_CONTROLLING, os.urandom(8)),
        (stun.USE_CANDIDATE, b""),
        (stun.PRIORITY, struct.pack("!I", 1853824767)),
    ]
    return stun.build_stun(
        stun.BINDING,
        stun.REQUEST,
        tid,
        attrs,
        integrity_key=password.encode(),
        fingerprint=True,
    )


def _time_ns(fn: Callable[[], object], *, repeat: int, target_s: float) -> list[float]:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(1, int(number * target_s / 0.2))
    return [t / number * 1e9 for t in timer.repeat(repeat=repeat, number=number)]


def run(*, repeat: int = 7, target_s: float = 0.2, family: int = 4) -> dict[str, Any]:
    key = os.urandom(32)
    keys = Keyring({1: key, 2: os.urandom(32)})  # as the relay holds them
    now = int(time.time())
    host = "10.1.2.3" if family == 4 else "fd00::1:2:3"
    token = encode_route_token(
        key_id=1, key=key, cluster=7, host=host, port=5004, issued_at=now, nonce=b"\x01\x02\x03"
    )
    packet = chrome_like_binding_request(token, "Ab9z", "x" * 24)
    allow = DestinationFilter(["10.0.0.0/8", "fd00::/8"])
    body = token.encode()  # any 30/42-byte message of the token body's size
    body = body[: 30 if family == 4 else 42]
    extract = stun.binding_request_server_ufrag
    assert extract(packet) == token.encode()

    def baseline() -> object:
        return hmac.new(key, body, "sha256").digest()

    def ufrag_only() -> object:
        return extract(packet)

    def verify_only() -> object:
        return verify_route_token(token, keys, now, allow_dest=allow)

    def decision() -> object:
        ufrag = extract(packet)
        if ufrag is None:
            return None
        return verify_route_token(ufrag, keys, now, allow_dest=allow)

    cases = {
        "hmac_baseline": baseline,
        "ufrag_extract": ufrag_only,
        "token_verify": verify_only,
        "decision": decision,
    }
    # Interleave the cases round by round so machine noise hits each alike.
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            samples[name].extend(_time_ns(fn, repeat=1, target_s=target_s))
    result: dict[str, Any] = {"family": family, "packet_bytes": len(packet), "cases": {}}
    base = min(samples["hmac_baseline"])
    for name, values in samples.items():
        result["cases"][name] = {
            "ns_min": round(min(values), 1),
            "ns_median": round(statistics.median(values), 1),
            "ratio_to_hmac": round(min(values) / base, 2),
        }
    return result


def _main(args: argparse.Namespace) -> int:
    results = [run(repeat=args.repeat, target_s=args.seconds, family=f) for f in (4, 6)]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for res in results:
        print(f"IPv{res['family']} token, Binding request of {res['packet_bytes']} bytes")
        print(f"  {'case':<16}{'ns/op min':>12}{'median':>10}{'x hmac':>9}")
        for name, c in res["cases"].items():
            print(f"  {name:<16}{c['ns_min']:>12}{c['ns_median']:>10}{c['ratio_to_hmac']:>9}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("wire", help="first-packet decision vs a bare HMAC-SHA256")
    p.add_argument("--repeat", type=int, default=7, help="interleaved rounds per case")
    p.add_argument("--seconds", type=float, default=0.2, help="time per round per case")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
