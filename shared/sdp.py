"""SDP sanity checks and the few rewrites the edge needs (RFC 8866, RFC 8839, RFC 8843).

aiortc raises AssertionError or ValueError deep inside on many malformed offers, and a
signaling server must answer those with a 400 that says why. `check_offer` looks at an offer
before any WebRTC code does: size, line syntax, an audio m-line, at most 3 m-lines, ICE
credentials and a DTLS fingerprint for every m-line (session level counts), BUNDLE when there
is more than one m-line (all sessions share one ICE transport), and at most 20 candidates.

The transceiver is an ICE-lite agent (RFC 8445 §2.5): it never sends a check, so it never
needs the caller's candidates; `strip_candidates` removes them (and `end-of-candidates`) before
aiortc sees the offer, and `classify_candidate` says which ones would have been refused, for
the record. Pure: no I/O.

Errors::

    SdpError     the offer is unusable; `str(err)` is the reason for the 400
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_SDP_BYTES = 64 * 1024
MAX_MEDIA = 3
MAX_CANDIDATES = 20
ICE_UFRAG = re.compile(r"^[A-Za-z0-9+/]{4,256}$")  # RFC 8839 §5.4
ICE_PWD = re.compile(r"^[A-Za-z0-9+/]{22,256}$")
FINGERPRINT = re.compile(
    r"^(sha-1|sha-224|sha-256|sha-384|sha-512) [0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2})+$"
)
LINE = re.compile(r"^[a-z]=")
_OPUS_RTPMAP = re.compile(r"a=rtpmap:(\d+) opus/", re.IGNORECASE)
_FMTP = re.compile(r"a=fmtp:(\d+) (.*)")
_PT_ATTRIBUTE = re.compile(r"a=(?:rtpmap|fmtp|rtcp-fb):(\d+)[ /]")

# Candidate addresses an edge must never be made to send to (RFC 6890 special ranges).
ALWAYS_DENIED = (
    "127.0.0.0/8",
    "::1/128",
    "169.254.0.0/16",
    "fe80::/10",
    "224.0.0.0/4",
    "ff00::/8",
    "0.0.0.0/8",
    "::/128",
)
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")


class SdpError(ValueError):
    pass


@dataclass
class MediaSection:
    kind: str
    port: int
    proto: str
    mid: str | None = None
    ufrag: str | None = None
    pwd: str | None = None
    fingerprint: str | None = None
    setup: str | None = None
    candidates: list[str] = field(default_factory=list)
    opus: bool = False  # an a=rtpmap names opus/48000


@dataclass
class Offer:
    media: list[MediaSection]
    bundle: list[str]
    ice_lite: bool

    @property
    def has_data_channel(self) -> bool:
        return any(m.kind == "application" for m in self.media)

    @property
    def candidates(self) -> list[str]:
        return [c for m in self.media for c in m.candidates]


def _lines(sdp: str) -> list[str]:
    return [line for line in sdp.replace("\r\n", "\n").split("\n") if line.strip()]


def parse_offer(sdp: str) -> Offer:
    """Parse what the checks need; raise SdpError with a reason for anything unusable."""
    if len(sdp.encode("utf-8", "replace")) > MAX_SDP_BYTES:
        raise SdpError(f"SDP larger than {MAX_SDP_BYTES} bytes")
    lines = _lines(sdp)
    if not lines or not lines[0].startswith("v=0"):
        raise SdpError("SDP must start with v=0")
    session = MediaSection(kind="session", port=0, proto="")
    media: list[MediaSection] = []
    bundle: list[str] = []
    ice_lite = False
    current = session
    for line in lines:
        if not LINE.match(line):
            raise SdpError(f"malformed SDP line {line[:40]!r}")
        key, value = line[0], line[2:].strip()
        if key == "m":
            parts = value.split()
            # (ASCII digits, at most 5: '²'.isdigit() is True and int() refuses it, and
            # int() of 4,300 digits raises: both were a 500)
            port = parts[1] if len(parts) >= 4 else ""
            if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536):
                raise SdpError(f"malformed m-line {value[:40]!r}")
            current = MediaSection(kind=parts[0], port=int(parts[1]), proto=parts[2])
            media.append(current)
            if len(media) > MAX_MEDIA:
                raise SdpError(f"more than {MAX_MEDIA} m-lines")
            continue
        if key != "a":
            continue
        name, _, attr = value.partition(":")
        if name == "group" and attr.startswith("BUNDLE"):
            bundle = attr.split()[1:]
        elif name == "ice-lite":
            ice_lite = True
        elif name == "mid":
            current.mid = attr
        elif name == "ice-ufrag":
            current.ufrag = attr
        elif name == "ice-pwd":
            current.pwd = attr
        elif name == "fingerprint":
            current.fingerprint = attr
        elif name == "setup":
            current.setup = attr
        elif name == "candidate":
            current.candidates.append(attr)
        elif name == "rtpmap" and _OPUS_RTPMAP.match(line):
            current.opus = True
    if not media:
        raise SdpError("no m-line")
    for m in media:
        m.ufrag = m.ufrag or session.ufrag
        m.pwd = m.pwd or session.pwd
        m.fingerprint = m.fingerprint or session.fingerprint
    return Offer(media=media, bundle=bundle, ice_lite=ice_lite)


def check_offer(sdp: str) -> Offer:
    offer = parse_offer(sdp)
    if not any(m.kind == "audio" and m.port != 0 for m in offer.media):
        raise SdpError("offer has no audio m-line")
    if not any(m.kind == "audio" and m.port != 0 and m.opus for m in offer.media):
        raise SdpError("the audio m-line offers no Opus (a=rtpmap:<pt> opus/48000/2)")
    for m in offer.media:
        if m.kind not in ("audio", "video", "application"):
            raise SdpError(f"unsupported media kind {m.kind!r}")
        if m.port == 0:
            continue
        if m.ufrag is None or not ICE_UFRAG.match(m.ufrag):
            raise SdpError(f"{m.kind} m-line: missing or malformed a=ice-ufrag")
        if m.pwd is None or not ICE_PWD.match(m.pwd):
            raise SdpError(f"{m.kind} m-line: missing or malformed a=ice-pwd")
        if m.fingerprint is None or not FINGERPRINT.match(m.fingerprint):
            raise SdpError(f"{m.kind} m-line: missing or malformed a=fingerprint")
        if m.setup is not None and m.setup not in ("actpass", "active", "passive"):
            raise SdpError(f"{m.kind} m-line: bad a=setup {m.setup!r}")
        if m.kind == "application" and "SCTP" not in m.proto:
            raise SdpError("application m-line is not SCTP")
    live = [m for m in offer.media if m.port != 0]
    if len(live) > 1:
        mids = [m.mid for m in live]
        if None in mids or not offer.bundle or any(mid not in offer.bundle for mid in mids):
            raise SdpError("more than one m-line requires a=group:BUNDLE over all of them")
        if len({(m.ufrag, m.pwd) for m in live}) != 1:
            raise SdpError("bundled m-lines must share ICE credentials")
    if offer.ice_lite:
        raise SdpError("an ICE-lite caller cannot reach an ICE-lite server")
    if len(offer.candidates) > MAX_CANDIDATES:
        raise SdpError(f"more than {MAX_CANDIDATES} candidates")
    return offer


def strip_candidates(sdp: str) -> str:
    """Remove a=candidate and a=end-of-candidates lines (the ICE-lite server needs none)."""
    out = [
        line for line in _lines(sdp) if not line.startswith(("a=candidate:", "a=end-of-candidates"))
    ]
    return "\r\n".join(out) + "\r\n"


def only_opus(sdp: str) -> str:
    """The offer with its audio m-lines down to their Opus payload types (and their
    rtpmap/fmtp/rtcp-fb lines), so the answer has Opus alone: the transceiver sends the
    agent's voice as Opus, and a caller whose first codec was G.711 would have got Opus
    labelled as G.711. `check_offer` has made sure there is an Opus to keep."""
    lines = _lines(sdp)
    out: list[str] = []
    dropped: set[str] = set()
    audio = False
    for i, line in enumerate(lines):
        if line.startswith("m="):
            parts = line[2:].split()
            audio = parts[0] == "audio"
            if audio:
                section = lines[i + 1 :]
                end = next((j for j, x in enumerate(section) if x.startswith("m=")), None)
                body = section[:end]
                opus = {m.group(1) for x in body if (m := _OPUS_RTPMAP.match(x))}
                keep = [pt for pt in parts[3:] if pt in opus]
                dropped = {pt for pt in parts[3:] if pt not in opus}
                if keep:
                    line = "m=" + " ".join([*parts[:3], *keep])
        elif audio and dropped:
            m = _PT_ATTRIBUTE.match(line)
            if m and m.group(1) in dropped:
                continue
        out.append(line)
    return "\r\n".join(out) + "\r\n"


def mark_ice_lite(sdp: str) -> str:
    """Add a session-level a=ice-lite (RFC 8839 §5.3) before the first m-line."""
    lines = _lines(sdp)
    if "a=ice-lite" in lines:
        return sdp
    first_media = next(i for i, line in enumerate(lines) if line.startswith("m="))
    lines.insert(first_media, "a=ice-lite")
    return "\r\n".join(lines) + "\r\n"


def ask_for_opus_fec(sdp: str) -> str:
    """Say in an answer that we take Opus in-band FEC (RFC 7587 §6.1 `useinbandfec=1`, a
    receiver's parameter): without it a browser sends none, and a lost packet can only be
    concealed. Merged into the payload type's a=fmtp, or a new one after its a=rtpmap."""
    lines = _lines(sdp)
    opus = {m.group(1) for line in lines if (m := _OPUS_RTPMAP.match(line))}
    with_fmtp = {m.group(1) for line in lines if (m := _FMTP.match(line)) and m.group(1) in opus}
    out: list[str] = []
    for line in lines:
        fmtp = _FMTP.match(line)
        if fmtp and fmtp.group(1) in opus and "useinbandfec" not in fmtp.group(2):
            line = f"{line};useinbandfec=1"
        out.append(line)
        rtpmap = _OPUS_RTPMAP.match(line)
        if rtpmap and rtpmap.group(1) not in with_fmtp:
            out.append(f"a=fmtp:{rtpmap.group(1)} useinbandfec=1")
    return "\r\n".join(out) + "\r\n"


def classify_candidate(candidate: str, deny: Sequence[str] = ()) -> str | None:
    """Why a candidate would be refused (None: acceptable). `candidate` is the attribute
    value after ``a=`` or ``candidate:``."""
    parts = candidate.removeprefix("candidate:").split()
    if len(parts) < 8 or parts[6] != "typ":
        return "malformed"
    host = parts[4]
    if host.endswith(".local"):
        return "mdns"
    if parts[2].lower() != "udp":
        return "not_udp"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "malformed"
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 (RFC 4291 §2.5.5.2): judged as such
    for cidr in (*ALWAYS_DENIED, *deny):
        if ip in ipaddress.ip_network(cidr):
            return "denied_range"
    return None


def sdpfrag_credentials(frag: str) -> tuple[str | None, str | None, list[str]]:
    """ice-ufrag, ice-pwd and candidates from an application/trickle-ice-sdpfrag body
    (RFC 8840 §9)."""
    ufrag = pwd = None
    candidates: list[str] = []
    for line in _lines(frag):
        if line.startswith("a=ice-ufrag:"):
            ufrag = line.split(":", 1)[1].strip()
        elif line.startswith("a=ice-pwd:"):
            pwd = line.split(":", 1)[1].strip()
        elif line.startswith("a=candidate:"):
            candidates.append(line[2:])
    return ufrag, pwd, candidates


# -- the answer's audio stream, as the transceiver's media core needs it -----------------------

DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")  # RFC 3264 §5.1
_ANSWERING = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly"}
_SSRC_CNAME = re.compile(r"a=ssrc:(\d+) cname:(\S+)")
_MID = re.compile(r"a=mid:(\S+)")
_MID_EXTMAP = re.compile(r"a=extmap:(\d+)(?:/\w+)? urn:ietf:params:rtp-hdrext:sdes:mid$")


@dataclass(frozen=True)
class AudioStream:
    """What an answer settled for its first audio m-section (RFC 3264)."""

    ssrc: int  # ours (a=ssrc, RFC 5576)
    cname: str
    payload_type: int  # Opus
    mid: str | None
    mid_extension: int | None  # the extmap id of sdes:mid (RFC 8843 §15), if negotiated
    direction: str


def _audio_section(lines: list[str]) -> tuple[int, int]:
    start = next((i for i, x in enumerate(lines) if x.startswith("m=audio")), None)
    if start is None:
        raise SdpError("no audio m-line")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), len(lines))
    return start, end


def audio_direction(sdp: str) -> str:
    """The first audio m-section's direction attribute (sendrecv when it has none)."""
    lines = _lines(sdp)
    start, end = _audio_section(lines)
    return next((x[2:] for x in lines[start:end] if x[2:] in DIRECTIONS), "sendrecv")


def answering_direction(offer_sdp: str) -> str:
    """What an endpoint that would send and receive answers to the offer's audio direction."""
    return _ANSWERING.get(audio_direction(offer_sdp), "inactive")


def set_audio_direction(sdp: str, direction: str) -> str:
    """`sdp` with the first audio m-section's direction attribute set to `direction`."""
    lines = _lines(sdp)
    start, end = _audio_section(lines)
    body = [x for x in lines[start + 1 : end] if x[2:] not in DIRECTIONS]
    lines[start + 1 : end] = [*body, f"a={direction}"]
    return "\r\n".join(lines) + "\r\n"


def audio_stream(answer_sdp: str) -> AudioStream:
    """The SSRC, CNAME, Opus payload type, MID and direction of an answer's audio."""
    lines = _lines(answer_sdp)
    start, end = _audio_section(lines)
    section = lines[start:end]
    ssrc = next((m for x in section if (m := _SSRC_CNAME.match(x))), None)
    opus = next((m for x in section if (m := _OPUS_RTPMAP.match(x))), None)
    if ssrc is None or opus is None:
        raise SdpError("the audio answer names no a=ssrc cname or no Opus")
    mid = next((m.group(1) for x in section if (m := _MID.match(x))), None)
    extension = next((int(m.group(1)) for x in section if (m := _MID_EXTMAP.match(x))), None)
    return AudioStream(
        ssrc=int(ssrc.group(1)),
        cname=ssrc.group(2),
        payload_type=int(opus.group(1)),
        mid=mid,
        mid_extension=extension if extension is not None and 1 <= extension <= 14 else None,
        direction=audio_direction(answer_sdp),
    )
