"""SRTP and SRTCP for one call (RFC 3711) through libsrtp (pylibsrtp), counting what fails.

`SrtpContext` holds a call's two libsrtp sessions, inbound and outbound. They are made from
keys exported by the DTLS handshake (RFC 5764 §4.2); `from_keying_material` does the split.
aiortc's DTLS transport builds the same sessions; `rtc/` hands its pair over once the
handshake is done. An inbound packet that fails to authenticate or is replayed returns None
and is counted (`auth_failed`, `replayed`, `malformed`): it costs no state. libsrtp keeps a
replay window per SSRC, so the caller of `unprotect` bounds the SSRCs first. A packet too
long to process (over 1,500 bytes with its trailer) is refused the same way.

Each packet goes to libsrtp from the C extension (`shared/_speedups.c`, given the four
calls' addresses once) where it is built: pylibsrtp's wrapper costs twice what its crypto
does on a voice packet (a buffer allocated, copies and checks in Python), and turns every
refusal into an exception whose text is then read. Without the extension, pylibsrtp's
`Session` methods do the same; a unit test holds the two paths to the same bytes and counts.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pylibsrtp
from pylibsrtp import Policy, Session
from pylibsrtp._binding import ffi, lib

from firsthop.shared import speedups

# RFC 5764 §4.1.2 profile -> (libsrtp profile, master key bytes, master salt bytes)
PROFILES: dict[str, tuple[int, int, int]] = {
    "SRTP_AES128_CM_SHA1_80": (Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 16, 14),
    "SRTP_AES128_CM_SHA1_32": (Policy.SRTP_PROFILE_AES128_CM_SHA1_32, 16, 14),  # (SDES only)
    "SRTP_AEAD_AES_128_GCM": (Policy.SRTP_PROFILE_AEAD_AES_128_GCM, 16, 12),
    "SRTP_AEAD_AES_256_GCM": (Policy.SRTP_PROFILE_AEAD_AES_256_GCM, 32, 12),
}


# `native.srtp_apply`'s ops, in the order `srtp_bind` takes them
PROTECT, UNPROTECT, PROTECT_RTCP, UNPROTECT_RTCP = range(4)
# libsrtp's srtp_err_status_t values a refused inbound packet is counted by
AUTH_FAIL = 7
REPLAY_FAIL, REPLAY_OLD = 9, 10

# The four calls as libsrtp 2 declares them, which `_speedups.c` calls them as: another
# libsrtp under pylibsrtp (3's take buffer lengths as size_t) is left to pylibsrtp's wrapper.
SRTP_CALLS = ("srtp_protect", "srtp_unprotect", "srtp_protect_rtcp", "srtp_unprotect_rtcp")
SRTP_CALL_TYPE = "srtp_err_status_t(*)(struct srtp_ctx_t_ *, void *, int *)"


def _bind(native: Any) -> bool:
    """Hand the four calls' addresses to the C extension; whether it makes them."""
    if native is None:
        return False
    calls = [ffi.addressof(lib, name) for name in SRTP_CALLS]
    if any(ffi.typeof(call).cname != SRTP_CALL_TYPE for call in calls):
        return False
    native.srtp_bind(*(int(ffi.cast("uintptr_t", call)) for call in calls))
    return True


# the C extension where it makes the calls, else None: pylibsrtp's wrapper
native: Any = speedups.native if _bind(speedups.native) else None


def _address(session: Session) -> int:
    """The libsrtp session (`srtp_t`) a pylibsrtp `Session` owns (and frees when it goes)."""
    return int(ffi.cast("uintptr_t", session._srtp[0]))


@dataclass
class SrtpCounts:
    auth_failed: int = 0
    replayed: int = 0
    malformed: int = 0  # too short or otherwise refused before authentication


class SrtpContext:
    def __init__(self, inbound: Session, outbound: Session) -> None:
        self._in = inbound  # (held: they own the libsrtp sessions the addresses name)
        self._out = outbound
        self._in_at = _address(inbound)
        self._out_at = _address(outbound)
        self.counts = SrtpCounts()

    @classmethod
    def from_keying_material(cls, material: bytes, profile: str, *, client: bool) -> SrtpContext:
        """The pair from RFC 5764 §4.2's exported bytes: client key, server key, client salt,
        server salt; the DTLS client sends with the client's."""
        libsrtp_profile, key_len, salt_len = PROFILES[profile]
        if len(material) != 2 * (key_len + salt_len):
            raise ValueError(f"{profile} needs {2 * (key_len + salt_len)} bytes of keying")
        keys = (material[:key_len], material[key_len : 2 * key_len])
        salts = (material[2 * key_len : 2 * key_len + salt_len], material[2 * key_len + salt_len :])
        mine, theirs = (0, 1) if client else (1, 0)

        def session(side: int, kind: int) -> Session:
            policy = Policy(
                key=keys[side] + salts[side], ssrc_type=kind, srtp_profile=libsrtp_profile
            )
            policy.allow_repeat_tx = True  # a retransmitted packet is not a fault of ours
            return Session(policy)

        return cls(
            session(theirs, Policy.SSRC_ANY_INBOUND), session(mine, Policy.SSRC_ANY_OUTBOUND)
        )

    @classmethod
    def from_sdes(cls, theirs: bytes, ours: bytes, profile: str) -> SrtpContext:
        """The pair from SDP security descriptions (RFC 4568): each side sends with the
        key (16 bytes, then the salt) it put in its own `a=crypto`."""
        libsrtp_profile, key_len, salt_len = PROFILES[profile]
        for key in (theirs, ours):
            if len(key) != key_len + salt_len:
                raise ValueError(f"{profile} needs {key_len + salt_len} bytes of key and salt")

        def session(key: bytes, kind: int) -> Session:
            policy = Policy(key=key, ssrc_type=kind, srtp_profile=libsrtp_profile)
            policy.allow_repeat_tx = True
            return Session(policy)

        return cls(
            session(theirs, Policy.SSRC_ANY_INBOUND), session(ours, Policy.SSRC_ANY_OUTBOUND)
        )

    # -- inbound: None when it does not authenticate (counted) ----------------------------------

    def unprotect_rtp(self, data: bytes) -> bytes | None:
        if native is not None:
            plain = native.srtp_apply(UNPROTECT, self._in_at, data)
            if isinstance(plain, bytes):
                return plain
            self._refused(plain)
            return None
        try:
            return self._in.unprotect(data)
        except (pylibsrtp.Error, ValueError) as exc:
            self._refused(_status(exc))
            return None

    def unprotect_rtcp(self, data: bytes) -> bytes | None:
        if native is not None:
            plain = native.srtp_apply(UNPROTECT_RTCP, self._in_at, data)
            if isinstance(plain, bytes):
                return plain
            self._refused(plain)
            return None
        try:
            return self._in.unprotect_rtcp(data)
        except (pylibsrtp.Error, ValueError) as exc:
            self._refused(_status(exc))
            return None

    def _refused(self, status: int) -> None:
        if status == AUTH_FAIL:
            self.counts.auth_failed += 1
        elif status in (REPLAY_FAIL, REPLAY_OLD):
            self.counts.replayed += 1
        else:
            self.counts.malformed += 1

    # -- outbound -------------------------------------------------------------------------------

    def protect_rtp(self, data: bytes) -> bytes:
        if native is not None:
            return _protected(native.srtp_apply(PROTECT, self._out_at, data))
        return self._out.protect(data)

    def protect_rtcp(self, data: bytes) -> bytes:
        if native is not None:
            return _protected(native.srtp_apply(PROTECT_RTCP, self._out_at, data))
        return self._out.protect_rtcp(data)


def _status(exc: Exception) -> int:
    """The libsrtp status a pylibsrtp refusal stands for (its text is pylibsrtp's `ERRORS`
    entry; a packet too long for its buffer is a ValueError)."""
    if isinstance(exc, pylibsrtp.Error) and str(exc) in pylibsrtp.ERRORS:
        return pylibsrtp.ERRORS.index(str(exc))
    return 2  # bad_param


def _protected(result: bytes | int) -> bytes:
    """What we send is ours: libsrtp refusing it is a bug, raised as pylibsrtp would."""
    if isinstance(result, int):
        raise pylibsrtp.Error(
            pylibsrtp.ERRORS[result] if result < len(pylibsrtp.ERRORS) else str(result)
        )
    return result


class PlainRtp:
    """A phone call's RTP, which a trunk sends in the clear (RTP/AVP): the same interface
    as `SrtpContext`, passing packets through. Where media may come from is the relay's
    pinned flow and the session table's path (docs/security.md, SIP media)."""

    counts = SrtpCounts()  # nothing ever fails: always zero

    def unprotect_rtp(self, data: bytes) -> bytes | None:
        return data

    def unprotect_rtcp(self, data: bytes) -> bytes | None:
        return data

    def protect_rtp(self, data: bytes) -> bytes:
        return data

    def protect_rtcp(self, data: bytes) -> bytes:
        return data


PLAIN_RTP = PlainRtp()
