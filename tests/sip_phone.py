"""What the SIP tests share: the phone edge as processes, and a scripted phone for the cases
a stock user agent will not produce on cue (a CANCEL at a chosen moment, a forged source).

`PhoneStack`: Redis, a relay reading flows from it, the echo agent, a transceiver publishing
its phone calls' flows there, and signaling with `--sip-listen` and a trunk for loopback.
`Phone`: a SIP UA over real UDP sockets (`shared/wire/sip.py` builds its messages, as any UA's
stack would) with G.711 RTP toward the media address our answer names. The calls with real
user agents (baresip, sipp) are in `tests/integration/test_sip_calls.py`.
"""

from __future__ import annotations

import itertools
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from firsthop.shared.rtp_offer import parse_rtp_offer
from firsthop.shared.wire import g711, rtp, sip
from firsthop.shared.wire.sip import SipRequest, SipResponse

from .support import (
    AgentProcess,
    RedisServer,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    free_sip_port,
    start_all,
)


@dataclass
class PhoneStack:
    redis: RedisServer
    relay: RelayProcess
    agent: AgentProcess
    tx: TransceiverProcess
    sig: SignalingProcess
    sip: tuple[str, int]

    def live_sessions(self) -> list[str]:
        """The transceiver sessions of the trunk's live calls (from the call map in Redis,
        where signaling keeps a SIP call's record like any call's, owned by `sip:<trunk>`)."""
        import redis as redis_client

        client = redis_client.Redis.from_url(self.redis.url, decode_responses=True)
        try:
            records = [client.hgetall(key) for key in client.scan_iter("firsthop:call:*")]
        finally:
            client.close()
        return [str(r["session_id"]) for r in records if r.get("owner") == "sip:local"]

    def signaling_event(self, event: str) -> float:
        """One of signaling's counted events (`firsthop_signaling_events_total`)."""
        import urllib.request

        from firsthop.shared.metrics import parse_text

        with urllib.request.urlopen(f"{self.sig.url}/metrics", timeout=5) as resp:
            metrics = parse_text(resp.read().decode())
        return metrics.get(("firsthop_signaling_events_total", frozenset({("event", event)})), 0.0)

    def call_record(self, call_id: str) -> dict[str, str]:
        """Signaling's record of a call (`firsthop:call:{call_id}`; empty once it is over)."""
        import redis as redis_client

        client = redis_client.Redis.from_url(self.redis.url, decode_responses=True)
        try:
            return {str(k): str(v) for k, v in client.hgetall(f"firsthop:call:{call_id}").items()}
        finally:
            client.close()

    @classmethod
    @contextmanager
    def running(
        cls,
        *signaling: str,
        trunk: str = "127.0.0.1/32",
        agent: AgentProcess | None = None,
        transceiver: tuple[str, ...] = (),
    ) -> Iterator[PhoneStack]:
        """`agent` (default: echo) is the transceiver's and signaling's `echo`; more agents
        may be named with `signaling` flags (their processes the caller's to run);
        `transceiver`: more flags of the transceiver's."""
        redis = RedisServer()
        redis.start()
        try:
            relay = RelayProcess(redis_url=redis.url)
            agent = agent or AgentProcess("echo", metrics=True)
            tx = TransceiverProcess(
                "--redis", redis.url, "--region", "a", *transceiver, agent_url=agent.url
            )
            sip_port = free_sip_port()
            sig = SignalingProcess(
                *["--redis", redis.url, "--ingress", f"a={relay.listen[0]}:{relay.listen[1]}"],
                *["--agent-url", f"echo={agent.url}"],
                *["--sip-listen", f"127.0.0.1:{sip_port}", "--sip-trunk", f"local={trunk}"],
                *signaling,
            )
            procs = [relay, agent, tx, sig]
            start_all(*procs)
            try:
                yield cls(redis, relay, agent, tx, sig, ("127.0.0.1", sip_port))
            finally:
                for p in procs:
                    p.kill()
        finally:
            redis.kill()


def tone(freq: float, seconds: float, rate: int = 8000, level: float = 8000.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def power_at(pcm: bytes, freq: float, rate: int = 8000) -> float:
    """The share of `pcm`'s energy within 30 Hz of `freq`."""
    samples = np.frombuffer(pcm, "<i2").astype(float)
    if len(samples) < 64:
        return 0.0
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples)))) ** 2
    freqs = np.fft.rfftfreq(len(samples), 1 / rate)
    total = spectrum.sum() or 1.0
    return float(spectrum[np.abs(freqs - freq) < 30].sum() / total)


@dataclass
class Phone:
    """One SIP user agent on 127.0.0.1 (`host`: another loopback address, a stranger)."""

    edge: tuple[str, int]
    host: str = "127.0.0.1"
    sock: socket.socket = field(init=False)
    media: socket.socket = field(init=False)
    call_id: str = field(default_factory=lambda: secrets.token_hex(8))
    tag: str = field(default_factory=lambda: secrets.token_hex(4))
    cseq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    remote_tag: str | None = None
    answer: str | None = None

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.host, 0))
        self.sock.settimeout(5.0)
        self.media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.media.bind((self.host, 0))
        self.media.settimeout(0.02)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def offer(self, codecs: str = "0 8 101") -> bytes:
        port = self.media.getsockname()[1]
        return (
            f"v=0\r\no=phone 1 1 IN IP4 {self.host}\r\ns=-\r\nc=IN IP4 {self.host}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP {codecs}\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\na=sendrecv\r\n"
        ).encode()

    def request(
        self, method: str, *, user: str = "echo", body: bytes = b"", branch: str | None = None,
        cseq: int | None = None, cseq_method: str | None = None,
    ) -> SipRequest:  # fmt: skip
        to = f"<sip:{user}@{self.edge[0]}:{self.edge[1]}>"
        if self.remote_tag and method not in ("CANCEL",):
            to += f";tag={self.remote_tag}"
        branch = branch or sip.BRANCH_COOKIE + secrets.token_hex(6)
        headers = [
            ("Via", f"SIP/2.0/UDP {self.host}:{self.port};branch={branch};rport"),
            ("Max-Forwards", "70"),
            ("From", f"<sip:+15550100@{self.host}>;tag={self.tag}"),
            ("To", to),
            ("Call-ID", self.call_id),
            ("CSeq", f"{cseq if cseq is not None else next(self.cseq)} {cseq_method or method}"),
            ("Contact", f"<sip:+15550100@{self.host}:{self.port}>"),
        ]
        if body:
            headers.append(("Content-Type", "application/sdp"))
        uri = f"sip:{user}@{self.edge[0]}:{self.edge[1]}"
        return sip.request(method, uri, headers, body)

    def send(self, message: SipRequest) -> None:
        self.sock.sendto(message.encode(), self.edge)

    def receive(self, timeout: float = 5.0) -> SipRequest | SipResponse:
        self.sock.settimeout(timeout)
        data, _ = self.sock.recvfrom(65536)
        return sip.parse_sip(data)

    def responses_until_final(self, timeout: float = 10.0) -> list[SipResponse]:
        got: list[SipResponse] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.receive(deadline - time.monotonic())
            if isinstance(message, SipResponse):
                got.append(message)
                if message.status >= 200:
                    return got
        raise AssertionError(f"no final response, got {[r.status for r in got]}")

    def cancel(self, invite: SipRequest, timeout: float = 10.0) -> None:
        """CANCEL `invite` (its branch and CSeq, §9.1) and wait for the INVITE's 487."""
        branch = sip.parse_via(invite.vias()[0]).branch
        self.send(self.request("CANCEL", branch=branch, cseq=invite.cseq, cseq_method="CANCEL"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.receive(deadline - time.monotonic())
            if isinstance(message, SipResponse) and message.status == 487:
                return
        raise AssertionError("no 487 for the cancelled INVITE")

    def invite(
        self, user: str = "echo", codecs: str = "0 8 101"
    ) -> tuple[SipRequest, list[SipResponse]]:
        invite = self.request("INVITE", user=user, body=self.offer(codecs))
        self.send(invite)
        responses = self.responses_until_final()
        final = responses[-1]
        self.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
        if final.status >= 300:  # the ACK of a non-2xx: the INVITE's branch (§17.1.1.3)
            branch = sip.parse_via(invite.vias()[0]).branch
            self.send(
                self.request("ACK", user=user, branch=branch, cseq=invite.cseq, cseq_method="ACK")
            )
        else:
            self.answer = final.body.decode()
            self.send(self.request("ACK", user=user, cseq=invite.cseq, cseq_method="ACK"))
        return invite, responses

    @property
    def media_target(self) -> tuple[str, int]:
        assert self.answer is not None
        offer = parse_rtp_offer(self.answer)
        return offer.address, offer.port

    def talk(self, pcm8k: bytes, payload_type: int = 0, seconds: float | None = None) -> bytes:
        """Send `pcm8k` as G.711 RTP in real time (20 ms packets) to our answer's media
        address while reading what comes back; what was heard, decoded (8 kHz PCM)."""
        encode = g711.ulaw_encode if payload_type == 0 else g711.alaw_encode
        decode = g711.ulaw_decode if payload_type == 0 else g711.alaw_decode
        payload = encode(pcm8k)
        ssrc, heard = secrets.randbits(32), bytearray()
        frames = len(payload) // 160
        start = time.monotonic()
        for i in range(frames):
            packet = rtp.RtpPacket(payload_type, i, 160 * i, ssrc, payload[i * 160 : (i + 1) * 160])
            self.media.sendto(packet.encode(), self.media_target)
            while time.monotonic() < start + (i + 1) * 0.02:
                try:
                    data = self.media.recv(2048)
                except TimeoutError:
                    continue
                if not rtp.is_rtcp(data):
                    got = rtp.parse_rtp(data)
                    if got.payload_type == payload_type:
                        heard += decode(got.payload)
        return bytes(heard)

    def close(self) -> None:
        self.sock.close()
        self.media.close()


def require(program: str) -> str:
    """A real peer the test needs: missing is a failure, never a skip."""
    import shutil

    path = shutil.which(program)
    assert path, f"{program} is not installed: run scripts/ensure-system-deps (make test does)"
    return path


def write_wav(path: str, pcm: bytes, rate: int = 8000) -> None:
    import wave

    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def baresip_call(
    edge: tuple[str, int],
    user: str,
    pcm: bytes,
    seconds: int,
    workdir: str,
    transport: str = "udp",
    mediaenc: str | None = None,
    auth: tuple[str, str] | None = None,
) -> tuple[bytes, str]:
    """baresip (Debian's) calls sip:USER@edge, plays `pcm` (8 kHz) as its microphone for
    `seconds` and hangs up; what it decoded from us (8 kHz PCM) and its log. `auth`: the
    user name and password it answers a Digest challenge with."""
    import glob
    import os
    import subprocess
    import wave

    program = require("baresip")
    source = os.path.join(workdir, "in.wav")
    write_wav(source, pcm)
    config = "\n".join(
        [
            "poll_method epoll",
            "sip_listen 127.0.0.1:0",
            "net_interface 127.0.0.1",
            f"audio_source aufile,{source}",
            f"audio_player aufile,{os.path.join(workdir, 'out.wav')}",
            "audio_srate 8000",
            "audio_channels 1",
            "module_path /usr/lib/baresip/modules",
            *(f"module {m}.so" for m in ("g711", "aufile", "account", "sndfile", "srtp")),
            "module_app menu.so",  # (its commands: -e "d URI" dials)
            f"snd_path {workdir}",
            "",
        ]
    )
    with open(os.path.join(workdir, "config"), "w") as f:
        f.write(config)
    with open(os.path.join(workdir, "accounts"), "w") as f:
        enc = f";mediaenc={mediaenc}" if mediaenc else ""
        if auth is not None:
            enc += f";auth_user={auth[0]};auth_pass={auth[1]}"
        f.write(f"<sip:caller@127.0.0.1>;regint=0{enc}\n")
    open(os.path.join(workdir, "contacts"), "w").close()
    run = subprocess.run(
        [
            *(program, "-f", workdir, "-t", str(seconds)),
            *("-e", f"d sip:{user}@{edge[0]}:{edge[1]};transport={transport}"),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 20,
        stdin=subprocess.DEVNULL,
    )
    log = run.stdout + run.stderr
    dumps = glob.glob(os.path.join(workdir, "dump-*-dec.wav"))
    if not dumps:
        return b"", log
    with wave.open(dumps[0]) as w:
        return w.readframes(w.getnframes()), log


SIPP_HEAD = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="{name}">
"""


def sipp_invite(user: str, codecs: str = "8 101") -> str:
    """A sipp UAC's INVITE, answered and acknowledged, as scenario XML."""
    return f"""
  <send retrans="500"><![CDATA[
      INVITE sip:{user}@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: <sip:{user}@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=sipp 1 1 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP {codecs}
      a=rtpmap:8 PCMA/8000
      a=rtpmap:101 telephone-event/8000
      a=fmtp:101 0-16
  ]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200"/>
  <send><![CDATA[
      ACK sip:{user}@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: <sip:{user}@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0
  ]]></send>
"""


def sipp_invite_answering_a_challenge(user: str, username: str, password: str) -> str:
    """`sipp_invite`, first challenged (401, RFC 3261 §22.2): acknowledged, then sent again
    with sipp's own Digest answer (CSeq 2). The BYE after it takes CSeq 3."""
    first, _, _ = sipp_invite(user).partition('  <recv response="100"')
    ack = sipp_invite(user).split("  <send><![CDATA[", 1)[1].split("]]></send>", 1)[0]
    again = (
        sipp_invite(user)
        .replace(
            "CSeq: 1 INVITE",
            f"CSeq: 2 INVITE\n      [authentication username={username} password={password}]",
        )
        .replace("CSeq: 1 ACK", "CSeq: 2 ACK")
    )
    return (
        first
        + '  <recv response="100" optional="true"/>\n  <recv response="401" auth="true"/>\n'
        + "  <send><![CDATA["
        + ack
        + "]]></send>\n"
        + again
    )


SIPP_BYE = """
  <send retrans="500"><![CDATA[
      BYE sip:echo@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: <sip:echo@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0
  ]]></send>
  <recv response="200" crlf="true"/>
"""


def play_pcap(path: str, pause_ms: int = 1200) -> str:
    return (
        f'  <nop><action><exec play_pcap_audio="{path}"/></action></nop>\n'
        f'  <pause milliseconds="{pause_ms}"/>\n'
    )


def run_sipp(
    edge: tuple[str, int],
    scenario: str,
    workdir: str,
    *args: str,
    calls: int = 1,
    timeout: float = 60,
) -> tuple[int, str]:
    """sipp (Debian's sip-tester) runs `scenario` (its XML body) against the edge: its exit
    status (0: every call passed) and what it said."""
    import os
    import subprocess

    program = require("sipp")
    path = os.path.join(workdir, "scenario.xml")
    with open(path, "w") as f:
        f.write(SIPP_HEAD.format(name="firsthop") + scenario + "</scenario>\n")
    argv = [program, f"{edge[0]}:{edge[1]}", "-sf", path, "-m", str(calls), "-i", "127.0.0.1"]
    argv += ["-mi", "127.0.0.1", "-timeout", str(int(timeout)), "-timeout_error", "-nostdin", *args]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 15, cwd=workdir)
    return run.returncode, run.stdout[-3000:] + run.stderr[-3000:]
