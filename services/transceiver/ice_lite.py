"""One session's ICE-lite agent, sans-IO: which checks count, and where the media goes.

The transceiver is an ICE-lite agent (RFC 8445 §2.5): it sends no checks of its own to set a
call up; the caller's checks, arriving through the relay, both prove the caller and choose
the path. This module is the session's one ICE agent: it decides for every STUN datagram of
a session, and answers the checks it accepts (nothing else parses or answers STUN):

* A Binding request counts only if its USERNAME is ``<our ufrag>:<their ufrag>`` and its
  MESSAGE-INTEGRITY verifies with our password (RFC 8445 §7.3, RFC 8489 §9.1.3), and its
  FINGERPRINT, when present, matches. Anything else is dropped and counted, never answered:
  an answer to an unauthenticated packet turns the edge into a reflector, and a STUN error
  response is what used to establish a relay flow for a spoofed source.
* A transaction ID seen from one address and then from another is a captured check replayed
  from elsewhere: dropped. One seen before under these credentials, no longer among the
  recent ones (`MAX_RECENT`), is a capture sent again: dropped too (every accepted ID is
  kept in a Bloom filter, `SEEN_BITS`). A retransmission (recent, same address) is answered
  and does nothing else: it refreshes no consent and asks for no move.
* Consent (RFC 7675) is refreshed only by an authenticated check.
* The first authenticated check selects the media path, so media can flow at once.
* Once a path is selected, media moves to another address only when that address answers
  a check of our own, sent for the move: our Binding request, signed with the caller's
  password, with a transaction ID of ours, answered by a success response that verifies
  with it (a return-routability check, like QUIC path validation, RFC 9000 §8.2). So no
  captured datagram, replayed from whatever address, moves the media: only an address that
  answers us now does. Until then a new address gets, per check it sent, one STUN response
  (`Accepted.response`; the relay needs that success response to carry the flow at all)
  and at most one check of ours, never retransmitted on its own, so nothing goes to an
  address that did not ask for it.
* Where the media goes among the caller's addresses is the caller's choice (RFC 8445 §8.2:
  a lite agent sends on the pair the controlling agent nominated). A caller with several
  interfaces checks from each and sends its media from one, which it nominates by
  USE-CANDIDATE (libwebrtc, with a lite peer: on every check of its selected connection,
  and on another's when it moves). A move is asked for, and made once the address answers:
  * by a fresh authenticated check with USE-CANDIDATE (`NOMINATED`; a retransmission,
    the same transaction again, is answered and does nothing else);
  * by a fresh check while the media path has carried none of the caller's authenticated
    media for `MOVE_AFTER` (`SILENT`, `media_heard`): the caller left it, as in a NAT
    rebinding, where its next check comes from the new address (aioice's consent checks,
    4-6 s apart, carry no USE-CANDIDATE). Media, unlike a check, cannot be sent again by
    someone who captured it, so no one keeps a dead path looking alive;
  * by the caller's own media, authenticated (SRTP), from a proven address while the media
    path has been silent for `LATCH_AFTER` (`MEDIA`, `on_authentic_media`): a caller that
    moved sends its media from the new address 1-2 s before it nominates it.
  An address proven otherwise is kept aside (the caller's media is taken from it, ours is
  not sent there): an interface the caller does not use may go away mid-call. A later
  nomination of another address cancels the move a nomination asked for.
* Bounds: at most `MAX_PATHS` addresses per session (the least recently checked yields), one
  validation in flight (it lapses after `PROBE_TIMEOUT`), at most one started per
  `PROBE_INTERVAL`.

Time is passed in (monotonic seconds); randomness (transaction IDs, tie-breaker) is injected.
Nothing here does I/O: the caller sends what the verdicts carry and calls `on_deadline` at
`next_deadline()`.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from firsthop.shared.address import Address
from firsthop.shared.wire import stun

MAX_PATHS = 8  # authenticated client addresses remembered per session
MAX_RECENT = 64  # transaction IDs remembered with their source (retransmissions)
# Every transaction ID accepted under the current credentials, in a Bloom filter of this many
# bits (4 KiB, `SEEN_HASHES` positions an ID): a captured check replayed once its ID has left
# `MAX_RECENT` is still known. At 1,440 checks (an hour of libwebrtc's, one every 2.5 s) a
# fresh ID is taken for a replay 0.07 % of the time (3,000: 0.9 %); that check goes
# unanswered, and the caller's next one is answered.
SEEN_SHIFT = 15
SEEN_BITS = 1 << SEEN_SHIFT
SEEN_HASHES = 4
PROBE_TIMEOUT = 1.0  # a validation not answered by then lapses (s)
PROBE_INTERVAL = 0.5  # at most one validation started per half second
# A proven address the caller did not nominate takes the media only when the media path has
# carried none of the caller's authenticated media for this long (s): a NAT rebinding, whose
# new address checks next (aioice: consent every 4-6 s, RFC 7675, never nominating again).
MOVE_AFTER = 3.0
# The caller's authenticated media from a proven address takes the media path there when
# the path has carried nothing for this long (s): 12 of its 20 ms frames.
LATCH_AFTER = 0.25
# Why a validation's answer moves the media (`PathValidated.cause`): the caller nominated the
# address; the media path had fallen silent (`MOVE_AFTER`); the caller's authenticated media
# came from the address while the path was silent (`LATCH_AFTER`).
NOMINATED, SILENT, MEDIA = "nominated", "silent", "media"
# RFC 8445 §5.1.2.1: priority of a peer-reflexive candidate, component 1, as our check's
# PRIORITY (what the caller would learn us as; it knows us already, from the answer).
PRFLX_PRIORITY = (110 << 24) | (65535 << 8) | (256 - 1)


@dataclass(frozen=True, slots=True)
class Credentials:
    local_ufrag: str
    local_pwd: str
    remote_ufrag: str
    remote_pwd: str


@dataclass(frozen=True, slots=True)
class Accepted:
    """An authenticated check: send `response` back to its source; send `probe` if any."""

    selects: bool  # this check selected the session's first media path
    probe: bytes | None = None  # our Binding request to the check's source (validation)
    # The Binding success response (RFC 8489 §7.3.1, RFC 8445 §7.3.1.1): XOR-MAPPED-ADDRESS
    # of the source, signed with our password, FINGERPRINT; smaller than the check.
    response: bytes = field(default=b"", compare=False)


@dataclass(frozen=True, slots=True)
class Refused:
    """Dropped, not answered; `reason` is the counter."""

    reason: str


@dataclass(frozen=True, slots=True)
class PathValidated:
    """`client` answered our check: it is the caller's. The media now goes there, for
    `cause` (`NOMINATED`, `SILENT` or `MEDIA`); None: the caller's chosen path is alive
    and keeps it."""

    client: Address
    cause: str | None = SILENT


@dataclass(frozen=True, slots=True)
class _Probe:
    client: Address
    transaction_id: bytes
    expires: float
    cause: str | None  # why its answer moves the media there (None: it may not)


class LiteIce:
    def __init__(self, creds: Credentials, *, random: Callable[[int], bytes] = os.urandom) -> None:
        self.creds = creds
        self.selected: Address | None = None
        self.last_check: float | None = None  # last authenticated check (consent)
        self._random = random
        self._tie_breaker = random(8)
        self._paths: dict[Address, float] = {}  # authenticated address -> last check
        self._validated: set[Address] = set()
        self._recent: dict[bytes, Address] = {}  # transaction id -> its source
        self._seen = bytearray(SEEN_BITS // 8)  # every accepted ID (`SEEN_BITS`)
        self._seen_key = random(16)
        self.path_heard = float("-inf")  # the media path's last authenticated media
        self._probe: _Probe | None = None
        self._last_probe_start = float("-inf")
        self.forgotten: list[Address] = []  # paths evicted since the caller last looked

    # -- the caller's checks -------------------------------------------------------------------

    def on_request(self, now: float, client: Address, data: bytes) -> Accepted | Refused:
        try:
            msg = stun.parse_stun(data)
        except stun.StunError:
            return Refused("stun_malformed")
        if msg.method != stun.BINDING or msg.cls != stun.REQUEST:
            return Refused("stun_unexpected")
        creds = self.creds
        try:
            if msg.username != f"{creds.local_ufrag}:{creds.remote_ufrag}":
                return Refused("stun_auth_fail")
            stun.verify_message_integrity(data, msg, stun.short_term_key(creds.local_pwd))
            if msg.fingerprint_offset is not None:
                stun.verify_fingerprint(data, msg)
        except stun.StunError:
            return Refused("stun_auth_fail")
        transaction_id = msg.transaction_id
        seen = self._recent.get(transaction_id)
        if seen is not None and seen != client:
            return Refused("stun_replay")
        if seen is not None:  # a retransmission: answered again, and nothing else
            return Accepted(selects=False, response=self._success(transaction_id, client))
        if not self._first_sight(transaction_id):  # a check of long ago, sent again
            return Refused("stun_replay")
        if len(self._recent) >= MAX_RECENT:
            del self._recent[next(iter(self._recent))]
        self._recent[transaction_id] = client
        response = self._success(transaction_id, client)
        self.last_check = now
        self._note_path(client, now)
        if self.selected is None:
            self.selected, self.path_heard = client, now
            self._validated.add(client)
            return Accepted(selects=True, response=response)
        nominates = msg.get(stun.USE_CANDIDATE) is not None
        probe = self._probe
        if client == self.selected:
            if nominates and probe is not None and probe.cause == NOMINATED:
                self._probe = replace(probe, cause=None)  # the caller chose again: this one
            return Accepted(selects=False, response=response)
        cause = NOMINATED if nominates else SILENT if self._silent(now) else None
        if client in self._validated and cause is None:
            return Accepted(selects=False, response=response)  # a spare path of the caller's
        if probe is not None and probe.client == client:
            if cause is not None:
                self._probe = replace(probe, cause=cause)  # (its answer is still to come)
            return Accepted(selects=False, response=response)
        if nominates and probe is not None and probe.cause == NOMINATED:
            self._probe = replace(probe, cause=None)  # the caller chose again: not that one
        request = self._start_probe(now, client, cause)
        return Accepted(selects=False, probe=request, response=response)

    def _first_sight(self, transaction_id: bytes) -> bool:
        """Note `transaction_id` as seen; False if it was (or, rarely, looks it: a Bloom
        filter). The positions are a keyed hash's (a key of the call's own), so IDs that
        share bits (a caller that counts them) spread all the same."""
        digest = hashlib.blake2b(transaction_id, digest_size=8, key=self._seen_key).digest()
        seen, value, fresh = self._seen, int.from_bytes(digest, "big"), False
        for _ in range(SEEN_HASHES):
            bit = value & (SEEN_BITS - 1)
            value >>= SEEN_SHIFT
            byte, mask = bit >> 3, 1 << (bit & 7)
            if not seen[byte] & mask:
                seen[byte] |= mask
                fresh = True
        return fresh

    def media_heard(self, now: float) -> None:
        """The caller's authenticated media (SRTP or SRTCP) came from the media path."""
        self.path_heard = now

    def _silent(self, now: float) -> bool:
        """The media path has carried none of the caller's authenticated media for
        `MOVE_AFTER` (the caller left it: media, unlike a check, cannot be replayed)."""
        return now - self.path_heard >= MOVE_AFTER

    def _success(self, transaction_id: bytes, client: Address) -> bytes:
        """The answer to an authenticated check from `client` (RFC 8445 §7.3.1.1): the one
        ICE agent of the session is this one; nothing else parses or answers a check."""
        return stun.build_stun(
            stun.BINDING,
            stun.SUCCESS,
            transaction_id,
            [
                (
                    stun.XOR_MAPPED_ADDRESS,
                    stun.encode_xor_address(client[0], client[1], transaction_id),
                )
            ],
            integrity_key=stun.short_term_key(self.creds.local_pwd),
            fingerprint=True,
        )

    def _note_path(self, client: Address, now: float) -> None:
        paths = self._paths
        if client not in paths and len(paths) >= MAX_PATHS:
            lru = min((a for a in paths if a != self.selected), key=paths.__getitem__)
            del paths[lru]
            self._validated.discard(lru)
            if self._probe is not None and self._probe.client == lru:
                self._probe = None
            self.forgotten.append(lru)
        paths[client] = now

    def on_authentic_media(self, now: float, client: Address) -> bytes | None:
        """The caller's own media (SRTP or SRTCP that passed its authentication and replay
        checks) came from `client`, not the media path. If `client` has proved it is the
        caller's and the path has been silent for `LATCH_AFTER`, the caller has moved its
        media there (an interface gone; libwebrtc nominates the new one 1-2 s later): our
        check to `client` (returned, or one already in flight to it) moves the media once
        answered. None: nothing to send."""
        if (
            client == self.selected
            or client not in self._validated
            or now - self.path_heard < LATCH_AFTER
        ):
            return None
        probe = self._probe
        if probe is not None and probe.client == client:
            if probe.cause is None:
                self._probe = replace(probe, cause=MEDIA)
            return None
        return self._start_probe(now, client, MEDIA)

    # -- path validation -------------------------------------------------------------------------

    def _start_probe(self, now: float, client: Address, cause: str | None) -> bytes | None:
        if self._probe is not None or now - self._last_probe_start < PROBE_INTERVAL:
            return None
        creds = self.creds
        transaction_id = self._random(stun.TRANSACTION_ID_LENGTH)
        request = stun.build_stun(
            stun.BINDING,
            stun.REQUEST,
            transaction_id,
            [
                (stun.USERNAME, f"{creds.remote_ufrag}:{creds.local_ufrag}".encode()),
                (stun.PRIORITY, struct.pack("!I", PRFLX_PRIORITY)),
                (stun.ICE_CONTROLLED, self._tie_breaker),
            ],
            integrity_key=stun.short_term_key(creds.remote_pwd),
            fingerprint=True,
        )
        self._last_probe_start = now
        self._probe = _Probe(client, transaction_id, now + PROBE_TIMEOUT, cause)
        return request

    def probing(self) -> Address | None:
        """The address a validation is in flight to, if any."""
        return self._probe.client if self._probe is not None else None

    def on_response(self, now: float, client: Address, data: bytes) -> PathValidated | Refused:
        probe = self._probe
        try:
            msg = stun.parse_stun(data)
        except stun.StunError:
            return Refused("stun_malformed")
        if (
            probe is None
            or client != probe.client
            or msg.transaction_id != probe.transaction_id
            or msg.method != stun.BINDING
        ):
            return Refused("stun_unexpected")
        if msg.cls != stun.SUCCESS:
            self._probe = None
            return Refused("path_validation_refused")
        try:
            stun.verify_message_integrity(data, msg, stun.short_term_key(self.creds.remote_pwd))
        except stun.StunError:
            return Refused("stun_auth_fail")
        self._probe = None
        self._validated.add(client)
        cause = probe.cause
        if cause is None and (self.selected is None or self._silent(now)):
            cause = SILENT
        if cause is not None:
            self.selected, self.path_heard = client, now
        return PathValidated(client, cause)

    def next_deadline(self) -> float | None:
        return self._probe.expires if self._probe is not None else None

    def on_deadline(self, now: float) -> Refused | None:
        """Let an unanswered validation lapse (`Refused`); None when nothing is due. The
        caller's next check from that address starts another."""
        probe = self._probe
        if probe is None or now < probe.expires:
            return None
        self._probe = None
        return Refused("path_validation_timeout")

    # -- after the call -------------------------------------------------------------------------

    def call_ended(self, request: bytes) -> bytes:
        """The answer to an authenticated check (`on_request` accepted it) once the call has
        ended: a Binding error response 403 (RFC 8489 §14.8), signed with our password. A
        libwebrtc caller drops a pair on any error but 401/420/487/500, so its connection
        leaves "connected" at this check instead of after ~5 s of unanswered ones (if the
        call's DTLS end, `rtc/dtls_hooks.closing_datagram`, has not made it fail already). Smaller
        than the check it answers (that carries our ufrag, a route token)."""
        msg = stun.parse_stun(request)
        reason = b"call ended"
        return stun.build_stun(
            stun.BINDING,
            stun.ERROR,
            msg.transaction_id,
            [(stun.ERROR_CODE, struct.pack("!HBB", 0, 4, 3) + reason)],
            integrity_key=stun.short_term_key(self.creds.local_pwd),
            fingerprint=True,
        )

    # -- ICE restart ------------------------------------------------------------------------------

    def restart(self, creds: Credentials) -> None:
        """New credentials both ways (RFC 8445 §9); the media stays on its path."""
        self.creds = creds
        self._probe = None
        self._seen = bytearray(SEEN_BITS // 8)  # (the old checks no longer authenticate)
