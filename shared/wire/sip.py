"""SIP messages (RFC 3261 §7, §20, §25): a bounded parser and the builders a UAS needs.

Purpose: the edge answers phone calls from SIP trunks. Every datagram on the SIP port is
hostile until the transaction layer has matched it to a trunk; this module is the pure codec
in front of that layer: no I/O, no clocks, stdlib only.

Strategy:

* ``parse_sip`` does the whole job once, within fixed bounds (`MAX_MESSAGE` bytes,
  `MAX_HEADERS` header fields): the start line, header fields unfolded (§7.3.1) with their
  names case-folded and compact forms expanded (§7.3.3), the body cut to Content-Length
  (§18.3: bytes past it in a datagram are discarded; fewer than it is an error). It returns
  a frozen ``SipMessage`` that keeps the fields in wire order as text.
* The fields a transaction and a dialog are keyed by are parsed on demand, each by one small
  function (``parse_via``, ``parse_name_addr``, ``parse_cseq``), with ``split_values`` for
  comma-separated lists (commas inside quotes and ``<>`` do not split, §7.3.1).
* ``SipRequest.check`` holds a request to what every request must carry (§8.1.1): Via with
  an RFC 3261 branch, From, To, Call-ID, CSeq whose method is the request's, Max-Forwards.
  A parse error of a request that names enough to be answered (`answerable`) gets a 400 with
  its reason; anything else is a counted drop.
* ``response_to`` builds a response the way §8.2.6.2 says: Via, From, To (with our tag),
  Call-ID and CSeq copied from the request, a Content-Length always.

Invariants:

* Garbage input raises only ``SipError`` subclasses, never ``IndexError``, ``ValueError``
  or ``UnicodeDecodeError`` (the message is decoded as UTF-8 with replacement first: SIP is
  UTF-8 text, and a bad byte is no reason to drop a call).
* A parsed message holds at most `MAX_HEADERS` fields and `MAX_MESSAGE` bytes in all.

Errors::

    SipError
     ├── MalformedSip     not a well-formed SIP message
     └── SipTooLarge      over a bound (answered with 513, §21.5.11, when answerable)

Each class has a ``reason`` used as the drop-counter label.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

MAX_MESSAGE = 16 * 1024  # bytes; a UDP datagram of a trunk's INVITE is well under (§18.1.1)
MAX_HEADERS = 128  # header fields in one message
MAX_CSEQ = (1 << 31) - 1  # §8.1.1.5: "less than 2**31"
BRANCH_COOKIE = "z9hG4bK"  # §8.1.1.7: an RFC 3261 branch starts so
SIP_VERSION = "SIP/2.0"
CRLF = "\r\n"

# §7.3.3 compact forms, and the other registered ones (RFC 3515, RFC 3892, RFC 4028, ...).
COMPACT = {
    "i": "call-id", "m": "contact", "e": "content-encoding", "l": "content-length",
    "c": "content-type", "f": "from", "s": "subject", "k": "supported", "t": "to",
    "v": "via", "o": "event", "r": "refer-to", "b": "referred-by", "u": "allow-events",
    "x": "session-expires", "a": "accept-contact", "j": "reject-contact",
    "d": "request-disposition", "y": "identity",
}  # fmt: skip
SHORT = {full: short for short, full in COMPACT.items()}  # call-id -> i, ...
# How names are written when we build a message (the rest: each word capitalised).
CANONICAL = {"call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate"}

_TOKEN = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")  # §25.1 token
_VIA = re.compile(r"^\s*SIP\s*/\s*2\.0\s*/\s*([A-Za-z0-9\-.!%*_+`'~]+)\s+(\S.*)$", re.I | re.S)
_STATUS = re.compile(r"^SIP/2\.0 ([1-6][0-9][0-9]) (.*)$", re.IGNORECASE)


class SipError(Exception):
    """Base class for every error this module raises on bad input."""

    reason = "sip_invalid"


class MalformedSip(SipError):
    reason = "sip_malformed"


class SipTooLarge(SipError):
    reason = "sip_too_large"


class TooManyValues(MalformedSip):
    """More Via or Record-Route values than any real path has (`MAX_HOPS`): not answered,
    since an answer copies each of them onto a line of its own (§8.2.6.2)."""

    reason = "sip_too_many_hops"


MAX_HOPS = 32  # Via and Record-Route values a request may carry (a real path has a handful)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # ('²'.isdigit() is True; int() refuses it)


def canonical_name(name: str) -> str:
    """A header name as we write it (`call-id` -> `Call-ID`, `content-length` -> ...)."""
    lower = name.lower()
    return CANONICAL.get(lower) or "-".join(part.capitalize() for part in lower.split("-"))


@dataclass(frozen=True)
class SipMessage:
    headers: tuple[tuple[str, str], ...]  # (lower-case full name, value) in wire order
    body: bytes

    def get(self, name: str) -> str | None:
        """The first field of `name` (any case, compact form or full)."""
        lower = name.lower()
        lower = COMPACT.get(lower, lower)
        for key, value in self.headers:
            if key == lower:
                return value
        return None

    def get_all(self, name: str) -> list[str]:
        """Every value of `name`, comma-separated lists split (§7.3.1), in order."""
        lower = name.lower()
        lower = COMPACT.get(lower, lower)
        return [v for key, value in self.headers if key == lower for v in split_values(value)]

    def vias(self) -> list[str]:
        return self.get_all("via")

    def _encode(self, start: str, compact: bool = False) -> bytes:
        """`compact`: the compact forms of the names that have one (§7.3.3, which every
        implementation must read), as a stateless answer uses to stay within its bound."""
        lines = [start]
        for name, value in self.headers:
            if name != "content-length":
                short = SHORT.get(name) if compact else None
                lines.append(f"{short or canonical_name(name)}: {value}")
        lines.append(f"{'l' if compact else 'Content-Length'}: {len(self.body)}")
        return (CRLF.join(lines) + CRLF + CRLF).encode() + self.body


@dataclass(frozen=True)
class SipRequest(SipMessage):
    method: str = ""
    uri: str = ""

    def encode(self) -> bytes:
        return self._encode(f"{self.method} {self.uri} {SIP_VERSION}")

    def check(self) -> None:
        """§8.1.1: what every request must carry; raise `MalformedSip` saying what is not."""
        for name in ("via", "from", "to", "call-id", "cseq"):
            if self.get(name) is None:
                raise MalformedSip(f"missing {canonical_name(name)}")
        vias = self.vias()
        if not vias:
            raise MalformedSip("empty Via")
        if len(vias) > MAX_HOPS or len(self.get_all("record-route")) > MAX_HOPS:
            raise TooManyValues(f"over {MAX_HOPS} Via or Record-Route values")
        via = parse_via(vias[0])
        if not via.branch.startswith(BRANCH_COOKIE) or len(via.branch) <= len(BRANCH_COOKIE):
            raise MalformedSip("Via branch must start with z9hG4bK (RFC 3261 §8.1.1.7)")
        number, method = parse_cseq(self.get("cseq") or "")
        if method != self.method:
            raise MalformedSip("CSeq method is not the request's")
        parse_name_addr(self.get("from") or "")
        parse_name_addr(self.get("to") or "")
        forwards = self.get("max-forwards")
        if forwards is not None and not (_digits(forwards) and len(forwards) <= 10):
            raise MalformedSip("bad Max-Forwards")

    @property
    def call_id(self) -> str:
        return self.get("call-id") or ""

    @property
    def cseq(self) -> int:
        return parse_cseq(self.get("cseq") or "")[0]


@dataclass(frozen=True)
class SipResponse(SipMessage):
    status: int = 0
    reason_phrase: str = ""

    def encode(self, compact: bool = False) -> bytes:
        return self._encode(f"{SIP_VERSION} {self.status} {self.reason_phrase}", compact)


# -- parsing ------------------------------------------------------------------------------


def parse_sip(data: bytes) -> SipRequest | SipResponse:
    """Parse one whole SIP message (a datagram, or one framed off a stream)."""
    if len(data) > MAX_MESSAGE:
        raise SipTooLarge(f"message over {MAX_MESSAGE} bytes")
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        raise MalformedSip("no empty line after the header")
    head = data[:head_end].decode("utf-8", "replace")
    lines = _unfold(head.split(CRLF))
    if not lines or not lines[0]:
        raise MalformedSip("no start line")
    headers = tuple(_header(line) for line in lines[1:])
    body = data[head_end + 4 :]
    length_field = None
    for name, value in headers:
        if name == "content-length":
            if length_field is not None and length_field != value:
                raise MalformedSip("two different Content-Length values")
            length_field = value
    if length_field is not None:
        if not _digits(length_field) or len(length_field) > 6:
            raise MalformedSip("bad Content-Length")
        length = int(length_field)
        if length > len(body):
            raise MalformedSip("body shorter than Content-Length")
        body = body[:length]  # §18.3: the rest of a datagram is discarded
    return _start(lines[0], headers, body)


def _unfold(lines: list[str]) -> list[str]:
    """§7.3.1: a line starting with whitespace continues the field above it."""
    out: list[str] = []
    for line in lines:
        if line[:1] in (" ", "\t") and len(out) > 1:
            out[-1] = out[-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
            if len(out) > MAX_HEADERS + 1:
                raise SipTooLarge(f"over {MAX_HEADERS} header fields")
    return out


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    name = name.rstrip(" \t")
    if not colon or not _TOKEN.match(name):
        raise MalformedSip("bad header line")
    lower = name.lower()
    return COMPACT.get(lower, lower), value.strip(" \t")


def _start(
    line: str, headers: tuple[tuple[str, str], ...], body: bytes
) -> SipRequest | SipResponse:
    if line.upper().startswith("SIP/"):
        match = _STATUS.match(line)
        if match is None:
            raise MalformedSip("bad status line")
        return SipResponse(headers, body, int(match[1]), match[2])
    parts = line.split(" ")
    if len(parts) != 3 or not parts[1]:
        raise MalformedSip("bad request line")
    method, uri, version = parts
    if not _TOKEN.match(method):
        raise MalformedSip("bad method")
    if version.upper() != SIP_VERSION:
        raise MalformedSip(f"unsupported version {version[:16]!r}")
    if ":" not in uri or any(c in uri for c in '<>"') or not uri.isprintable():
        raise MalformedSip("bad Request-URI")
    return SipRequest(headers, body, method, uri)


class SipStream:
    """Messages framed off a stream transport (TCP, TLS; §18.3): a message's end is its
    header's empty line plus its Content-Length (none: no body). Keep-alive CRLFs between
    messages (RFC 5626 §3.5.1) are skipped and counted (`pings`: answer each CRLFCRLF with
    CRLF). At most `MAX_MESSAGE` bytes are ever held: past that the stream is broken
    (`SipTooLarge`); a header whose Content-Length is not a number breaks it too
    (`MalformedSip`): on a stream nothing after it can be framed."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.pings = 0

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        out: list[bytes] = []
        while True:
            while buffer.startswith(b"\r\n"):
                if buffer.startswith(b"\r\n\r\n"):
                    self.pings += 1
                    del buffer[:4]
                else:
                    del buffer[:2]
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_MESSAGE:
                    raise SipTooLarge(f"a header over {MAX_MESSAGE} bytes")
                return out
            length = _stream_length(bytes(buffer[:end]))
            total = end + 4 + length
            if total > MAX_MESSAGE:
                raise SipTooLarge(f"message over {MAX_MESSAGE} bytes")
            if len(buffer) < total:
                return out
            out.append(bytes(buffer[:total]))
            del buffer[:total]


def _stream_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        if line[:1] in (b" ", b"\t"):
            continue  # a folded line belongs to the header above it, as `parse_sip` reads it
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() in (b"content-length", b"l"):
            text = value.strip().decode("ascii", "replace")
            if not _digits(text) or len(text) > 6:
                raise MalformedSip("bad Content-Length on a stream")
            return int(text)
    return 0


def salvage_request(data: bytes) -> SipRequest | None:
    """The header of a request that failed to parse, if it names enough to be answered (a
    Via, From, To, Call-ID and CSeq we can copy into a 400 or 513); else None, and it is
    only a counted drop. Bounded like `parse_sip`; raises nothing."""
    try:
        head = data[:MAX_MESSAGE].split(b"\r\n\r\n", 1)[0].decode("utf-8", "replace")
        lines = _unfold(head.split(CRLF))
        method = lines[0].split(" ", 1)[0]
        if not _TOKEN.match(method) or method.upper().startswith("SIP/"):
            return None
        headers = tuple(
            h for h in (_header(line) for line in lines[1:]) if h[0] != "content-length"
        )
        message = SipRequest(headers, b"", method, "sip:invalid")
        if any(not message.get(n) for n in ("via", "from", "to", "call-id", "cseq")):
            return None
        vias = message.vias()
        if not vias:
            return None
        parse_via(vias[0])
        parse_cseq(message.get("cseq") or "")
        return message
    except SipError:
        return None


def split_values(value: str) -> Iterator[str]:
    """A comma-separated field's values (§7.3.1); commas in quotes or `<>` do not split."""
    depth, quoted, escaped, start = 0, False, False, 0
    for i, c in enumerate(value):
        if escaped:
            escaped = False
        elif quoted:
            if c == "\\":
                escaped = True
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            item = value[start:i].strip()
            if item:
                yield item
            start = i + 1
    item = value[start:].strip()
    if item:
        yield item


def parse_params(text: str) -> dict[str, str]:
    """`;name=value;flag` parameters (§25.1 generic-param), names case-folded; the first of
    a repeated name wins."""
    params: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, value = part.partition("=")
        name = name.strip().lower()
        if not _TOKEN.match(name):
            raise MalformedSip("bad parameter")
        params.setdefault(name, value.strip().strip('"'))
    return params


@dataclass(frozen=True)
class Via:
    transport: str  # UDP, TCP, TLS, ...
    host: str
    port: int | None
    params: dict[str, str] = field(default_factory=dict)

    @property
    def branch(self) -> str:
        return self.params.get("branch", "")


def parse_via(value: str) -> Via:
    """One via-parm (§20.42): `SIP/2.0/UDP host[:port];branch=...`."""
    match = _VIA.match(value)
    if match is None:
        raise MalformedSip("bad Via")
    sent_by, _, params = match[2].partition(";")
    # (whitespace around the colons dropped; not a regex: `\s*:\s*` backtracks over a run
    # of blanks with no colon in it at every position of it, so its cost was the square of
    # the run's length: 0.5 s for 16,000 spaces in one datagram)
    host, port = split_host_port(":".join(part.strip() for part in sent_by.split(":")))
    return Via(match[1].upper(), host, port, parse_params(params))


def split_host_port(text: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]`, `[v6]:port` (§25.1 hostport)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise MalformedSip("bad host")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise MalformedSip("bad host")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = text.partition(":")
    if not host or any(c in host for c in ' \t;,<>"/'):
        raise MalformedSip("bad host")
    if not port_text:
        return host, None
    if not _digits(port_text) or len(port_text) > 5 or not 0 < int(port_text) < 65536:
        raise MalformedSip("bad port")
    return host, int(port_text)


@dataclass(frozen=True)
class NameAddr:
    display: str
    uri: str
    params: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")


def parse_name_addr(value: str) -> NameAddr:
    """From, To, Contact, Refer-To (§20.10): `"Name" <uri>;params`, `<uri>;params` or a
    bare `uri;params` (whose `;` parameters belong to the header, §20.10)."""
    text = value.strip()
    if "<" in text:
        start, end = text.find("<"), text.find(">")
        if end < start:
            raise MalformedSip("bad name-addr")
        display, uri, rest = text[:start].strip().strip('"'), text[start + 1 : end], text[end + 1 :]
    else:
        display, (uri, _, rest) = "", text.partition(";")
        rest = ";" + rest if rest else ""
    uri = uri.strip()
    if ":" not in uri or any(c in uri for c in ' <>"'):
        raise MalformedSip("bad URI")
    rest = rest.strip()
    if rest and not rest.startswith(";"):
        raise MalformedSip("bad name-addr")
    return NameAddr(display, uri, parse_params(rest))


def parse_cseq(value: str) -> tuple[int, str]:
    number, _, method = value.strip().partition(" ")
    method = method.strip()
    if not _digits(number) or len(number) > 10 or int(number) > MAX_CSEQ:
        raise MalformedSip("bad CSeq number")
    if not _TOKEN.match(method):
        raise MalformedSip("bad CSeq method")
    return int(number), method


def uri_user(uri: str) -> str | None:
    """The user part of a sip:/sips:/tel: URI (`sip:echo@host` -> `echo`)."""
    scheme, _, rest = uri.partition(":")
    if scheme.lower() == "tel":
        return rest.split(";", 1)[0] or None
    if scheme.lower() not in ("sip", "sips") or "@" not in rest:
        return None
    return rest.split("@", 1)[0].split(";", 1)[0] or None


def refer_notify_status(notify: SipMessage) -> int | None:
    """The status a REFER's NOTIFY reports (RFC 3515 §2.4.5: `Event: refer`, a
    `message/sipfrag` body whose first line is a status line, the target's answer so far);
    None if `notify` is no such NOTIFY."""
    event = (notify.get("event") or "").partition(";")[0].strip().lower()
    kind = (notify.get("content-type") or "").partition(";")[0].strip().lower()
    if event != "refer" or kind != "message/sipfrag":
        return None
    first = notify.body[:256].split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
    match = _STATUS.match(first) or _STATUS.match(first + " ")  # (a reason may be empty)
    return int(match.group(1)) if match else None


# -- building -----------------------------------------------------------------------------


def response_to(
    request: SipRequest,
    status: int,
    reason: str,
    *,
    to_tag: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    via_received: tuple[str, int] | None = None,
) -> SipResponse:
    """§8.2.6.2: Via (all, in order), From, To, Call-ID and CSeq copied; our tag on To when
    the request's has none; `via_received` = the source the request came from, written on
    the top Via (`received`, and `rport` when asked, RFC 3581 §4)."""
    copied: list[tuple[str, str]] = []
    vias = request.vias()
    if via_received is not None and vias:
        vias[0] = _via_with_source(vias[0], via_received)
    copied += [("via", v) for v in vias]
    copied.append(("from", request.get("from") or ""))
    to = request.get("to") or ""
    if to_tag is not None and _untagged(to):
        to = f"{to};tag={to_tag}"
    copied.append(("to", to))
    copied.append(("call-id", request.call_id))
    copied.append(("cseq", request.get("cseq") or ""))
    copied += [(name.lower(), value) for name, value in headers]
    return SipResponse(tuple(copied), body, status, reason)


def _untagged(to: str) -> bool:
    """Whether a To has no tag; one we cannot read goes back as it came (a 400 says why)."""
    try:
        return parse_name_addr(to).tag is None
    except SipError:
        return False


def _via_with_source(via: str, source: tuple[str, int]) -> str:
    head, _, params = via.partition(";")
    kept = []
    rport = False
    for part in params.split(";") if params else []:
        name = part.split("=", 1)[0].strip().lower()
        if name == "rport":
            rport = True
        elif name != "received":
            kept.append(part.strip())
    kept.append(f"received={source[0]}")
    if rport:
        kept.append(f"rport={source[1]}")
    return ";".join([head.strip(), *kept])


def request(
    method: str, uri: str, headers: Iterable[tuple[str, str]], body: bytes = b""
) -> SipRequest:
    """A request we send (BYE, REFER, OPTIONS): the caller gives every field but the length."""
    return SipRequest(tuple((n.lower(), v) for n, v in headers), body, method, uri)
