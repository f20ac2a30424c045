"""Whether a caller's SCTP packet (RFC 9260, over its DTLS) may reach aiortc's parser: pure.

aiortc reads a packet's chunks and their parameters as they claim to be, and a caller with
its own SCTP stack can claim anything (measured by a helper's attacker read, stop 50):

* a parameter whose length is 0 (in a HEARTBEAT, ABORT, ERROR, INIT or RECONFIG chunk):
  aiortc's `decode_params` never moves past it, and the one thread every call on the
  transceiver shares loops for good while its memory grows ~110 MB a second. 20 bytes did it;
* a SACK's gap blocks are walked TSN by TSN whatever we have in flight: 358 blocks of
  (1, 65535) in one datagram cost 1.65 s;
* chunks too short for their fields (a DATA chunk under 16 bytes, a SACK shorter than its
  blocks, a FORWARD TSN whose stream list is cut short, a RECONFIG parameter cut short) and
  an INIT bundled with other chunks raise inside aiortc, which ends the caller's call;
* one packet of 362 HEARTBEATs has 362 answers sent, of RECONFIGs 90.

So a packet is looked at first, in one pass over its bytes (no object made): `check` says
`MALFORMED` for one aiortc would misread, `REFUSED` for one no real stack sends (a second
chunk of a kind a packet carries at most one of, more than `MAX_RECONFIGS` RECONFIGs or
`MAX_CONTROL` chunks other than DATA, a SACK whose blocks span more than `MAX_GAP_SPAN`
TSNs, an INIT once the association has been up: aiortc would start it again, its TSNs
anew), and None for the rest. aiortc checks the CRC32c and the verification tag itself.
What a real stack sends passes: usrsctp's FORWARD TSN names a stream once per abandoned
chunk, so its list is not limited here (`rtc/sctp_hooks.py` keeps each stream's last).
"""

from __future__ import annotations

import struct

MALFORMED, REFUSED = "malformed", "refused"

DATA, INIT, INIT_ACK, SACK, HEARTBEAT, HEARTBEAT_ACK, ABORT, SHUTDOWN = 0, 1, 2, 3, 4, 5, 6, 7
SHUTDOWN_ACK, ERROR, COOKIE_ECHO, COOKIE_ACK, SHUTDOWN_COMPLETE = 8, 9, 10, 11, 14
RECONFIG, FORWARD_TSN = 130, 192
# Where a chunk's parameters start in its body (RFC 9260 §3.2.1, RFC 6525 §3.1).
PARAMS_AT = {
    INIT: 16,
    INIT_ACK: 16,
    HEARTBEAT: 0,
    HEARTBEAT_ACK: 0,
    ABORT: 0,
    ERROR: 0,
    RECONFIG: 0,
}
# The fixed fields aiortc reads from a chunk's body (a SACK's and FORWARD TSN's lists aside).
MIN_BODY = {DATA: 12, INIT: 16, INIT_ACK: 16, SACK: 12, SHUTDOWN: 4, FORWARD_TSN: 4}
# Chunks a real stack sends at most one of in a packet (each answered, or a state change).
ONCE = frozenset(
    {
        INIT,
        INIT_ACK,
        SACK,
        HEARTBEAT,
        HEARTBEAT_ACK,
        ABORT,
        SHUTDOWN,
        SHUTDOWN_ACK,
        ERROR,
        COOKIE_ECHO,
        COOKIE_ACK,
        SHUTDOWN_COMPLETE,
        FORWARD_TSN,
    }
)
MAX_CONTROL = 8  # chunks other than DATA in one packet (361 empty ERRORs cost aiortc 0.86 ms)
# RFC 6525 parameters aiortc reads, and the bytes each needs: an outgoing SSN reset request
# (12, then 2 a stream), a response (8), an add-outgoing-streams request (8).
RECONFIG_PARAMS = {13: 12, 16: 8, 17: 8}
MAX_RECONFIG_PARAMS = 2  # a request and a response, as RFC 6525 §3.1 allows in one chunk
MAX_RECONFIGS = 2  # RECONFIG chunks a packet (each parameter answered: 8 had drawn 16 sends)
MAX_GAP_SPAN = 1024  # TSNs a SACK's gap blocks span in all (we have far fewer in flight)

_HEADER = struct.Struct("!BBH")
_PAIR = struct.Struct("!HH")
_SACK_COUNTS = struct.Struct("!HH")


def check(packet: bytes, established: bool = False) -> str | None:
    """None if `packet` may go to aiortc; else why not (`MALFORMED` or `REFUSED`).
    `established`: the association has been up (an INIT would start it again)."""
    length = len(packet)
    if length < 16:  # the common header and one chunk's
        return MALFORMED
    seen: set[int] = set()
    kinds = control = reconfigs = 0
    pos = 12
    while pos <= length - 4:  # (as aiortc walks them: a tail under 4 bytes is ignored)
        kind, _, size = _HEADER.unpack_from(packet, pos)
        if size < 4 or pos + size > length:
            return MALFORMED
        body = memoryview(packet)[pos + 4 : pos + size]
        verdict = _check_chunk(kind, body)
        if verdict is not None:
            return verdict
        if kind in ONCE:
            if kind in seen:
                return REFUSED
            seen.add(kind)
        if kind == RECONFIG:
            reconfigs += 1
            if reconfigs > MAX_RECONFIGS:
                return REFUSED
        if kind != DATA:
            control += 1
            if control > MAX_CONTROL or (established and kind == INIT):
                return REFUSED
        kinds += 1
        pos += size + (-size % 4)
    if INIT in seen and kinds > 1:  # RFC 9260 §6.10: an INIT is bundled with nothing
        return MALFORMED
    return None


def _check_chunk(kind: int, body: memoryview) -> str | None:
    if len(body) < MIN_BODY.get(kind, 0):
        return MALFORMED
    if kind in PARAMS_AT:
        return _check_params(kind, body[PARAMS_AT[kind] :])
    if kind == SACK:
        gaps, dups = _SACK_COUNTS.unpack_from(body, 8)
        if len(body) < 12 + 4 * (gaps + dups):
            return MALFORMED
        span = 0
        for i in range(gaps):
            start, end = _PAIR.unpack_from(body, 12 + 4 * i)
            if start > end:  # (aiortc's SACK handling raised on one)
                return MALFORMED
            span += end - start + 1
        return REFUSED if span > MAX_GAP_SPAN else None
    if kind == FORWARD_TSN and (len(body) - 4) % 4:
        return MALFORMED
    return None


def _check_params(kind: int, params: memoryview) -> str | None:
    """A chunk's parameters, walked as aiortc's `decode_params` walks them (a tail under 4
    bytes ignored); each must hold its own header and fit."""
    pos, count = 0, 0
    while pos <= len(params) - 4:
        ptype, size = _PAIR.unpack_from(params, pos)
        if size < 4 or pos + size > len(params):
            return MALFORMED
        count += 1
        if kind == RECONFIG:
            if count > MAX_RECONFIG_PARAMS:
                return REFUSED
            need = RECONFIG_PARAMS.get(ptype)
            value = size - 4
            if need is not None and (value < need or (ptype == 13 and value % 2)):
                return MALFORMED
        pos += size + (-size % 4)
    return None
