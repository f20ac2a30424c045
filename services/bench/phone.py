"""`firsthop bench phone`: a phone call (SIP, G.711 RTP) next to a WebRTC call, same run.

One stack (Redis, relay, transceiver, echo agent, signaling with `--sip-listen`), and in
interleaved rounds, through the same relay port to the same transceiver and agent:

* answer: a phone's INVITE -> our 200 OK, next to a WebRTC caller's POST /v1/calls -> 201
  (both carry the answer; both place the call on the transceiver);
* mouth-to-ear: tone bursts after silence, each burst's first 20 ms frame leaving the caller
  to the first frame of it heard back (the echo agent returns it). The WebRTC caller is
  aiortc (`echo.one_call`: Opus, its jitter buffer, a frame played from its arrival); the
  phone is a plain G.711 UA here (no jitter buffer of its own: a frame plays on arrival);
* CPU: N phone calls at once, then N WebRTC calls, each for the window: the transceiver's
  CPU per call (all its threads, /proc).

Figures are reported side by side; nothing is asserted. Every process started here is
stopped before `run` returns; nothing is pinned.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import math
import secrets
import socket
import statistics
import threading
import time
import urllib.request
from typing import Any

from firsthop.services.bench.echo import FREQ, mouth_to_ear, one_call
from firsthop.services.bench.measure import BenchError, cpu_sample, report, settings
from firsthop.services.bench.procs import Stack
from firsthop.services.call.caller import Caller, ToneTrack
from firsthop.services.launch import HOST, Spec, free_port, redis_command, signaling_command
from firsthop.shared.rtp_offer import parse_rtp_offer
from firsthop.shared.wire import g711, rtp, sip

KEY = "bench-" + secrets.token_hex(8)
RATE = 8000
FRAME = 160  # samples of 20 ms at 8 kHz
DEFAULTS: dict[str, Any] = {"rounds": 3, "bursts": 6, "calls": 4, "seconds": 8.0}
QUICK: dict[str, Any] = {"rounds": 1, "bursts": 3, "calls": 2, "seconds": 3.0}
PERIOD, BURST = 0.6, 0.2  # s: a burst every PERIOD, BURST long


def _tone(freq: float, samples: int, start: int = 0) -> bytes:
    out = array.array(
        "h", (int(9800 * math.sin(2 * math.pi * freq * (start + i) / RATE)) for i in range(samples))
    )
    return out.tobytes()


def _power(pcm: bytes, freq: float) -> float:
    """Goertzel power of `freq` in PCM16 at 8 kHz, normalised (a full-scale 0.3 tone ~0.02)."""
    samples = array.array("h")
    samples.frombytes(pcm)
    coeff = 2 * math.cos(2 * math.pi * freq / RATE)
    s1 = s2 = 0.0
    for x in samples:
        s1, s2 = x / 32768 + coeff * s1 - s2, s1
    return (s1 * s1 + s2 * s2 - coeff * s1 * s2) / max(1, len(samples)) ** 2


class Phone:
    """A G.711 (PCMU) SIP phone on loopback: INVITE, ACK, paced RTP out, RTP in, BYE."""

    def __init__(self, edge: tuple[str, int]) -> None:
        self.edge = edge
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((HOST, 0))
        self.sock.settimeout(10)
        self.media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.media.bind((HOST, 0))
        self.media.settimeout(0.005)
        self.call_id, self.tag, self.remote_tag = secrets.token_hex(8), secrets.token_hex(4), ""
        self.target: tuple[str, int] | None = None

    def _request(self, method: str, cseq: int, body: bytes = b"") -> bytes:
        to = f"<sip:echo@{self.edge[0]}:{self.edge[1]}>" + (
            f";tag={self.remote_tag}" if self.remote_tag else ""
        )
        port = self.sock.getsockname()[1]
        headers = [
            ("Via", f"SIP/2.0/UDP {HOST}:{port};branch={sip.BRANCH_COOKIE}{secrets.token_hex(6)}"),
            ("Max-Forwards", "70"),
            ("From", f"<sip:bench@{HOST}>;tag={self.tag}"),
            ("To", to),
            ("Call-ID", self.call_id),
            ("CSeq", f"{cseq} {method}"),
            ("Contact", f"<sip:bench@{HOST}:{port}>"),
        ]
        if body:
            headers.append(("Content-Type", "application/sdp"))
        return sip.request(
            method, f"sip:echo@{self.edge[0]}:{self.edge[1]}", headers, body
        ).encode()

    def _final(self) -> sip.SipResponse:
        while True:
            message = sip.parse_sip(self.sock.recv(65536))
            if isinstance(message, sip.SipResponse) and message.status >= 200:
                return message

    def call(self) -> float:
        """INVITE until 200 OK (seconds), then ACK."""
        port = self.media.getsockname()[1]
        offer = (
            f"v=0\r\no=bench 1 1 IN IP4 {HOST}\r\ns=-\r\nc=IN IP4 {HOST}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n"
        ).encode()
        start = time.monotonic()
        self.sock.sendto(self._request("INVITE", 1, offer), self.edge)
        ok = self._final()
        took = time.monotonic() - start
        if ok.status != 200:
            raise BenchError(f"phone call answered {ok.status}")
        self.remote_tag = sip.parse_name_addr(ok.get("to") or "").tag or ""
        answer = parse_rtp_offer(ok.body)
        self.target = (answer.address, answer.port)
        self.sock.sendto(self._request("ACK", 1), self.edge)
        return took

    def stream(
        self, seconds: float, bursts: int = 0
    ) -> tuple[list[float], list[tuple[float, float]]]:
        """Send RTP in real time for `seconds` (a tone all along, or silence with `bursts`
        tone bursts); (each burst's first frame's send time, (arrival, tone power) of each
        frame heard)."""
        assert self.target is not None
        ssrc, onsets, heard = secrets.randbits(32), [], []
        frames = int(seconds / 0.02)
        first_burst = frames - bursts * int(PERIOD / 0.02) if bursts else 0
        start = time.monotonic()
        for i in range(frames):
            if bursts:
                k, phase = divmod(i - first_burst, int(PERIOD / 0.02))
                loud = i >= first_burst and phase < int(BURST / 0.02)
                if loud and phase == 0:
                    onsets.append(time.monotonic())
            else:
                loud = True
            pcm = _tone(FREQ, FRAME, i * FRAME) if loud else bytes(2 * FRAME)
            packet = rtp.RtpPacket(0, i & 0xFFFF, i * FRAME, ssrc, g711.ulaw_encode(pcm)).encode()
            self.media.sendto(packet, self.target)
            while time.monotonic() < start + (i + 1) * 0.02:
                try:
                    data = self.media.recv(2048)
                except TimeoutError:
                    continue
                if not rtp.is_rtcp(data) and bursts:
                    heard.append(
                        (
                            time.monotonic(),
                            _power(g711.ulaw_decode(rtp.parse_rtp(data).payload), FREQ),
                        )
                    )
        return onsets, heard

    def hangup(self) -> None:
        self.sock.sendto(self._request("BYE", 2), self.edge)
        try:
            self._final()
        except TimeoutError:
            pass
        self.sock.close()
        self.media.close()


def _phone_m2e(onsets: list[float], heard: list[tuple[float, float]]) -> list[float | None]:
    out: list[float | None] = []
    for onset in onsets:
        hit = next(
            (at for at, power in heard if onset <= at < onset + 0.9 * PERIOD and power > 0.002),
            None,
        )
        out.append(round((hit - onset) * 1000, 2) if hit is not None else None)
    return out


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 1) if got else None


def run(*, rounds: int, bursts: int, calls: int, seconds: float) -> dict[str, Any]:
    redis_port = free_port(socket.SOCK_STREAM)
    url = f"redis://{HOST}:{redis_port}/0"
    stack = Stack(relay_redis=url)
    rows: list[dict[str, Any]] = []
    try:
        stack._start(Spec("redis", redis_command(redis_port), ready_tcp=redis_port))
        stack.start(tx_args=("--redis", url, "--region", "local"))
        sig_args = [
            *("--redis", url, "--region", "local", "--api-keys", KEY),
            *("--ingress", f"local={HOST}:{stack.relay_port}"),
            *("--agent-url", f"echo={stack.agent_url}"),
            *("--sip-listen", f"{HOST}:0", "--sip-trunk", "bench=127.0.0.0/8"),
        ]
        bound = stack._start(
            Spec("signaling", signaling_command(port=0, extra=sig_args), announces=True)
        ).bound
        http, edge = f"http://{HOST}:{bound['listen'][1]}", (HOST, bound["sip"][1])
        tx_pid = next(c.pid for c in stack.children if c.spec.name == "transceiver")
        posts: list[float] = []

        def answer(offer: str) -> str:
            req = urllib.request.Request(
                f"{http}/v1/calls?agent=echo", data=offer.encode(), method="POST",
                headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {KEY}"},
            )  # fmt: skip
            t0 = time.monotonic()
            with urllib.request.urlopen(req, timeout=15) as resp:
                body = str(resp.read().decode())
            posts.append(time.monotonic() - t0)
            return body

        for rnd in range(1, rounds + 1):
            # mouth-to-ear, one call each
            onsets, frames, _, _ = asyncio.run(
                one_call(answer, bursts=bursts, burst_s=BURST, period_s=PERIOD)
            )
            webrtc_m2e, _ = mouth_to_ear(onsets, frames, PERIOD)
            phone = Phone(edge)
            invite = phone.call()
            phone_onsets, heard = phone.stream(1.0 + bursts * PERIOD, bursts)
            phone.hangup()
            # CPU per call, N at once each
            cpu = {
                "phone": _cpu_phones(edge, calls, seconds, tx_pid),
                "webrtc": _cpu_webrtc(answer, calls, seconds, tx_pid),
            }
            rows.append({
                "round": rnd,
                "answer_ms": {
                    "phone": round(invite * 1000, 1), "webrtc": round(posts[0] * 1000, 1)
                },
                "mouth_to_ear_ms": {"phone": _phone_m2e(phone_onsets, heard), "webrtc": webrtc_m2e},
                "cpu_pct_per_call": cpu,
            })  # fmt: skip
            posts.clear()
    finally:
        stack.stop()
    return {
        "config": {"rounds": rounds, "bursts": bursts, "calls": calls, "seconds": seconds},
        "rows": rows,
        "summary": _summary(rows),
    }


def _cpu_window(tx_pid: int, seconds: float) -> float:
    time.sleep(1.0)  # (settled)
    before, t0 = cpu_sample({"tx": tx_pid}), time.monotonic()
    time.sleep(seconds)
    after, t1 = cpu_sample({"tx": tx_pid}), time.monotonic()
    if before is None or after is None:
        raise BenchError("the transceiver went away")
    return 100 * (after["tx"][0] - before["tx"][0]) / 1e9 / (t1 - t0)


def _cpu_phones(edge: tuple[str, int], calls: int, seconds: float, tx_pid: int) -> float:
    phones = [Phone(edge) for _ in range(calls)]
    for p in phones:
        p.call()
    threads = [threading.Thread(target=p.stream, args=(seconds + 2.5,)) for p in phones]
    for t in threads:
        t.start()
    try:
        return round(_cpu_window(tx_pid, seconds) / calls, 2)
    finally:
        for t in threads:
            t.join()
        for p in phones:
            p.hangup()


def _cpu_webrtc(answer: Any, calls: int, seconds: float, tx_pid: int) -> float:
    async def main() -> float:
        callers = [Caller(ToneTrack(FREQ)) for _ in range(calls)]

        async def signal(offer: str) -> str:
            return await asyncio.to_thread(answer, offer)

        try:
            for c in callers:
                await c.start(signal)
            for c in callers:
                await asyncio.wait_for(c.wait_connected(), 15)
            return await asyncio.to_thread(_cpu_window, tx_pid, seconds)
        finally:
            for c in callers:
                await c.close()

    return round(asyncio.run(main()) / calls, 2)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("phone", "webrtc"):
        out[kind] = {
            "answer_ms_p50": _median([r["answer_ms"][kind] for r in rows]),
            "mouth_to_ear_ms_p50": _median([v for r in rows for v in r["mouth_to_ear_ms"][kind]]),
            "cpu_pct_per_call": _median([r["cpu_pct_per_call"][kind] for r in rows]),
        }
    return out


def render(result: dict[str, Any]) -> str:
    c, s = result["config"], result["summary"]
    lines = [
        f"firsthop bench phone: {c['rounds']} round(s); answer and mouth-to-ear one call at "
        f"a time ({c['bursts']} tone bursts), CPU with {c['calls']} calls at once for "
        f"{c['seconds']} s",
        "each through the same relay port to the same transceiver and echo agent, in the same run",
        "",
        f"{'':10} {'answer ms p50':>14} {'mouth-to-ear ms p50':>20} {'transceiver % per call':>24}",
    ]
    for kind, label in (("phone", "SIP/G.711"), ("webrtc", "WebRTC")):
        row = s[kind]
        answer, m2e, cpu = row["answer_ms_p50"], row["mouth_to_ear_ms_p50"], row["cpu_pct_per_call"]
        lines.append(f"{label:10} {answer!s:>14} {m2e!s:>20} {cpu!s:>24}")
    lines.append(
        "(mouth-to-ear: the WebRTC caller is aiortc, with Opus and its jitter buffer; the "
        "phone plays a frame on arrival)"
    )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)
    return report("phone", args, lambda: run(**chosen), render)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "phone", help="a SIP phone call next to a WebRTC call: answer, mouth-to-ear, CPU"
    )
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--bursts", type=int, default=None)
    p.add_argument("--calls", type=int, default=None, help="calls at once for the CPU window")
    p.add_argument("--seconds", type=float, default=None, help="the CPU window")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)
