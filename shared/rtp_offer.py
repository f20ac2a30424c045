"""Offer/answer for a phone call's plain RTP audio (RFC 3264, RFC 8866), pure.

A SIP trunk offers one audio stream over RTP/AVP (or RTP/SAVP with SDES keys, RFC 4568),
named by a connection address and a port, with G.711 (static payload types 0 and 8, RFC
3551 §6), maybe Opus, and `telephone-event` for DTMF (RFC 4733). No ICE, no DTLS.

* `parse_rtp_offer(sdp)`: the first audio stream of an offer (`RtpOffer`), bounded: at most
  `MAX_SDP_BYTES`, `MAX_FORMATS` payload types; `SdpError` says why an offer is unusable
  (the SIP layer answers it with 488, RFC 3261 §21.4.26);
* `choose_codec(offer, prefer)`: the first of our codecs, in our order of preference, that
  the offer has;
* `choose_crypto(offer)`: for an `RTP/SAVP` offer, the first `a=crypto` (SDES, RFC 4568) we
  can take: AES_CM_128_HMAC_SHA1_80 or _32 with one inline key of 30 bytes (key and salt),
  no MKI, no lifetime shorter than 2^31 packets (`Crypto`);
* `build_rtp_answer(...)`: the answer: one audio stream, the chosen codec and
  telephone-event when offered, the direction that answers the offer's (§6.1), and RTCP at
  the RTP port (`a=rtcp`, RFC 3605: the relay has one port; `a=rtcp-mux` when offered).

Invariants: every port, payload type and clock rate in a parsed offer is in range; an
answer names only payload types the offer had.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass, field

from firsthop.shared.sdp import SdpError

MAX_SDP_BYTES = 8 * 1024  # a trunk's offer is a few hundred bytes
MAX_FORMATS = 32
STATIC = {0: ("pcmu", 8000), 8: ("pcma", 8000), 9: ("g722", 8000)}  # RFC 3551 §6
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
ANSWERING = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly"}
TELEPHONE_EVENT = "telephone-event"


@dataclass(frozen=True)
class RtpOffer:
    address: str  # where the offerer receives RTP (c=), an IP literal
    port: int  # 0: the stream is refused or held off (RFC 3264 §5.1)
    formats: tuple[int, ...]  # payload types, in the offer's order of preference
    codecs: dict[int, tuple[str, int]] = field(default_factory=dict)  # pt -> (name, rate)
    direction: str = "sendrecv"
    ptime: int | None = None
    secure: bool = False  # RTP/SAVP
    crypto: tuple[str, ...] = ()  # a=crypto lines' values (RFC 4568)
    rtcp_mux: bool = False  # RTCP on the RTP port (RFC 5761)

    @property
    def telephone_event(self) -> int | None:
        """The payload type of RFC 4733 events at 8 kHz, if offered."""
        for pt in self.formats:
            if self.codecs.get(pt) == (TELEPHONE_EVENT, 8000):
                return pt
        return None


def parse_rtp_offer(sdp: bytes | str) -> RtpOffer:
    text = sdp.decode("utf-8", "replace") if isinstance(sdp, bytes) else sdp
    if len(text) > MAX_SDP_BYTES:
        raise SdpError(f"SDP over {MAX_SDP_BYTES} bytes")
    session_address: str | None = None
    media_address: str | None = None
    session_direction = "sendrecv"
    audio: list[str] | None = None
    attributes: list[str] = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        if len(line) < 2 or line[1] != "=":
            raise SdpError("bad SDP line")
        kind, value = line[0], line[2:]
        if kind == "m":
            if audio is not None:
                break  # only the first audio stream is ours; later ones are refused
            parts = value.split()
            if parts and parts[0] == "audio":
                audio = parts
            continue
        if kind == "c":
            address = _connection(value)
            if audio is None:
                session_address = address
            else:
                media_address = address
        elif kind == "a" and value in DIRECTIONS and audio is None:
            session_direction = value
        elif kind == "a" and audio is not None:
            attributes.append(value)
    if audio is None:
        raise SdpError("no audio stream")
    return _audio(audio, attributes, media_address or session_address, session_direction)


def _connection(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError("bad c= line")
    try:
        address = ipaddress.ip_address(parts[2].split("/", 1)[0])
    except ValueError as exc:
        raise SdpError("c= must be an IP address") from exc
    if address.is_multicast:
        raise SdpError("multicast media is not supported")
    return str(address)


def _audio(
    parts: list[str], attributes: list[str], address: str | None, direction: str
) -> RtpOffer:
    if len(parts) < 4:
        raise SdpError("bad m= line")
    port_text, proto, format_texts = parts[1].split("/", 1)[0], parts[2], parts[3:]
    if not _number(port_text, 5) or int(port_text) > 65535:
        raise SdpError("bad m= port")
    if proto not in ("RTP/AVP", "RTP/SAVP", "RTP/AVPF", "RTP/SAVPF"):
        raise SdpError(f"unsupported transport {proto[:20]}")
    if len(format_texts) > MAX_FORMATS or not all(
        _number(f, 3) and int(f) < 128 for f in format_texts
    ):
        raise SdpError("bad payload types")
    if address is None:
        raise SdpError("no c= line for the audio stream")
    formats = tuple(int(f) for f in format_texts)
    codecs = {pt: STATIC[pt] for pt in formats if pt in STATIC}
    ptime: int | None = None
    crypto: list[str] = []
    rtcp_mux = False
    for value in attributes:
        name, _, rest = value.partition(":")
        if name == "rtpmap":
            pt_text, _, encoding = rest.partition(" ")
            codec = _rtpmap(pt_text, encoding)
            if codec is not None and codec[0] in formats:
                codecs[codec[0]] = codec[1]
        elif name == "ptime" and _number(rest.strip(), 4):
            ptime = int(rest.strip())
        elif name == "crypto" and len(crypto) < 8:
            crypto.append(rest.strip())
        elif value == "rtcp-mux":
            rtcp_mux = True
        elif value in DIRECTIONS:
            direction = value
    return RtpOffer(
        address, int(port_text), formats, codecs, direction, ptime,
        secure="SAVP" in proto, crypto=tuple(crypto), rtcp_mux=rtcp_mux,
    )  # fmt: skip


def _rtpmap(pt_text: str, encoding: str) -> tuple[int, tuple[str, int]] | None:
    name, _, rest = encoding.strip().partition("/")
    rate = rest.split("/", 1)[0]
    if not _number(pt_text, 3) or int(pt_text) > 127 or not _number(rate, 7) or not name:
        return None
    return int(pt_text), (name.lower(), int(rate))


# RFC 4568 §6.2 crypto-suites we take -> libsrtp's profile names (media/srtp.py PROFILES)
SDES_SUITES = {
    "AES_CM_128_HMAC_SHA1_80": "SRTP_AES128_CM_SHA1_80",
    "AES_CM_128_HMAC_SHA1_32": "SRTP_AES128_CM_SHA1_32",
}
SDES_KEY_BYTES = 30  # 16 of key, 14 of salt (RFC 4568 §6.1)


@dataclass(frozen=True)
class Crypto:
    tag: int
    suite: str  # an SDES_SUITES name
    key: bytes  # key || salt, SDES_KEY_BYTES


def choose_crypto(offer: RtpOffer) -> Crypto | None:
    for line in offer.crypto:
        crypto = _crypto(line)
        if crypto is not None:
            return crypto
    return None


def _crypto(line: str) -> Crypto | None:
    parts = line.split()
    if len(parts) < 3 or not _number(parts[0], 9) or parts[1] not in SDES_SUITES:
        return None
    if len(parts) > 3:  # session parameters (UNENCRYPTED_SRTP, KDR, ...): none we take
        return None
    method, _, info = parts[2].partition(":")
    if method != "inline" or "|" in info and not _plain_lifetime(info):
        return None
    try:
        key = base64.b64decode(info.split("|", 1)[0], validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(key) != SDES_KEY_BYTES:
        return None
    return Crypto(int(parts[0]), parts[1], key)


def _plain_lifetime(info: str) -> bool:
    """`key|2^31` (a lifetime) is fine; an MKI (`key|...|1:4`, or `key|1:4`) is not."""
    extras = info.split("|")[1:]
    return len(extras) == 1 and ":" not in extras[0]


def _number(text: str, digits: int) -> bool:
    return 0 < len(text) <= digits and text.isascii() and text.isdigit()


def choose_codec(offer: RtpOffer, prefer: tuple[str, ...] = ("pcmu", "pcma")) -> int | None:
    """The payload type of our most preferred codec (`(name, 8000)`, or Opus at 48 kHz) the
    offer has; None if none."""
    for name in prefer:
        for pt in offer.formats:
            codec = offer.codecs.get(pt)
            if codec is not None and codec[0] == name:
                return pt
    return None


def build_rtp_answer(
    offer: RtpOffer,
    *,
    payload_type: int,
    address: str,
    port: int,
    session_id: int,
    version: int = 1,
    direction: str | None = None,
    crypto: Crypto | None = None,
) -> str:
    """The answer to `offer`: our `address`:`port`, the chosen codec, telephone-event when
    offered, and `direction` (default: the one answering the offer's, RFC 3264 §6.1)."""
    if payload_type not in offer.codecs:
        raise ValueError("the answer's codec must be one the offer had")
    family = "IP6" if ":" in address else "IP4"
    name, rate = offer.codecs[payload_type]
    formats = [payload_type]
    event = offer.telephone_event
    if event is not None:
        formats.append(event)
    lines = [
        "v=0",
        f"o=firsthop {session_id} {version} IN {family} {address}",
        "s=firsthop",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} {'RTP/SAVP' if crypto else 'RTP/AVP'} {' '.join(map(str, formats))}",
        f"a=rtpmap:{payload_type} {name.upper() if rate == 8000 else name}/{rate}",
    ]
    if event is not None:
        lines += [f"a=rtpmap:{event} {TELEPHONE_EVENT}/8000", f"a=fmtp:{event} 0-16"]
    if crypto is not None:  # our key for what we send (RFC 4568 §6.1: the offer's tag)
        inline = base64.b64encode(crypto.key).decode()
        lines.append(f"a=crypto:{crypto.tag} {crypto.suite} inline:{inline}")
    # RFC 3605: our RTCP is at the RTP port too (the relay has one); RFC 5761 if offered.
    lines += ["a=ptime:20", f"a=rtcp:{port}"] + (["a=rtcp-mux"] if offer.rtcp_mux else [])
    lines.append(f"a={direction or ANSWERING.get(offer.direction, 'inactive')}")
    return "\r\n".join(lines) + "\r\n"
