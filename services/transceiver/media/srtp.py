"""SRTP and SRTCP for one call (RFC 3711) through libsrtp (pylibsrtp), counting what fails.

`SrtpContext` holds a call's two libsrtp sessions, inbound and outbound. They are made from
keys exported by the DTLS handshake (RFC 5764 §4.2); `from_keying_material` does the split.
aiortc's DTLS transport builds the same sessions; `rtc/` hands its pair over once the
handshake is done. An inbound packet that fails to authenticate or is replayed returns None
and is counted (`auth_failed`, `replayed`, `malformed`): it costs no state. libsrtp keeps a
replay window per SSRC, so the caller of `unprotect` bounds the SSRCs first. A packet too
long to process (over 1,500 bytes with its trailer) is refused the same way.

The sessions are libsrtp's own, in the libsrtp pylibsrtp ships (`LibSrtpSession`, through
its compiled cffi binding), and each packet goes to libsrtp from the C extension
(`shared/_speedups.c`, given the four calls' addresses once) where it is built: pylibsrtp's
`Session` wrapper cost twice what its crypto does on a voice packet (a buffer allocated,
copies and checks in Python), and turned every refusal into an exception whose text was
then read. Without the extension, cffi's calls into the same libsrtp do it; unit tests hold
the two paths to the same bytes and counts, and both to pylibsrtp's own `Session`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pylibsrtp
from pylibsrtp import Policy
from pylibsrtp._binding import ffi, lib

from firsthop.shared import speedups

# RFC 5764 §4.1.2 profile -> (libsrtp profile, master key bytes, master salt bytes)
PROFILES: dict[str, tuple[int, int, int]] = {
    "SRTP_AES128_CM_SHA1_80": (Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 16, 14),
    "SRTP_AES128_CM_SHA1_32": (Policy.SRTP_PROFILE_AES128_CM_SHA1_32, 16, 14),  # (SDES only)
    "SRTP_AEAD_AES_128_GCM": (Policy.SRTP_PROFILE_AEAD_AES_128_GCM, 16, 12),
    "SRTP_AEAD_AES_256_GCM": (Policy.SRTP_PROFILE_AEAD_AES_256_GCM, 32, 12),
}


# libsrtp's calls by op, in the order `native.srtp_bind` takes them, and the room each needs
# past the packet in a 1,500-byte buffer (SRTP's tag and MKI; SRTCP's index too)
PROTECT, UNPROTECT, PROTECT_RTCP, UNPROTECT_RTCP = range(4)
SRTP_CALLS = ("srtp_protect", "srtp_unprotect", "srtp_protect_rtcp", "srtp_unprotect_rtcp")
ROOM = (16 + 128, 0, 4 + 16 + 128, 0)
BUFFER = 1500
# libsrtp's srtp_err_status_t values
OK, BAD_PARAM, AUTH_FAIL, REPLAY_FAIL, REPLAY_OLD = 0, 2, 7, 9, 10
# The four calls as libsrtp 2 declares them, which `_speedups.c` calls them as: another
# libsrtp under pylibsrtp (3's take buffer lengths as size_t) is left to cffi's calls.
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


_CALLS = tuple(getattr(lib, name) for name in SRTP_CALLS)  # (through cffi)
# the C extension where it makes the calls, else None: cffi's (`LibSrtpSession.apply`)
native: Any = speedups.native if _bind(speedups.native) else None


class LibSrtpSession:
    """One libsrtp session (`srtp_t`) for one direction, in the libsrtp pylibsrtp ships (its
    compiled cffi binding; pylibsrtp's own `Session` keeps its `srtp_t` to itself), freed with
    this object. `address` is the session's, for the C extension's calls."""

    __slots__ = ("address", "_srtp")

    def __init__(self, key: bytes, ssrc_type: int, profile: int) -> None:
        policy = ffi.new("srtp_policy_t *")
        for set_from_profile, part in (
            (lib.srtp_crypto_policy_set_from_profile_for_rtp, ffi.addressof(policy, "rtp")),
            (lib.srtp_crypto_policy_set_from_profile_for_rtcp, ffi.addressof(policy, "rtcp")),
        ):
            if set_from_profile(part, profile) != OK:
                raise ValueError(f"libsrtp refused profile {profile}")
        master = ffi.new("unsigned char[]", key)  # (libsrtp copies what it needs)
        policy.key = master
        policy.ssrc.type = ssrc_type
        policy.allow_repeat_tx = 1  # a retransmitted packet is not a fault of ours
        srtp = ffi.new("srtp_t *")
        status = lib.srtp_create(srtp, policy)
        if status != OK:
            raise ValueError(f"libsrtp refused the session ({status})")
        self._srtp = ffi.gc(srtp, lambda made: lib.srtp_dealloc(made[0]))
        self.address = int(ffi.cast("uintptr_t", srtp[0]))

    def apply(self, op: int, packet: bytes) -> bytes | int:
        """The packet through libsrtp's call `op` (from the C extension, else through cffi):
        the packet processed, or libsrtp's status when it refuses it."""
        if native is not None:
            return native.srtp_apply(op, self.address, packet)  # type: ignore[no-any-return]
        if len(packet) > BUFFER - ROOM[op]:
            return BAD_PARAM
        buffer = ffi.new("char[]", BUFFER)
        buffer[0 : len(packet)] = packet
        length = ffi.new("int *", len(packet))
        status: int = _CALLS[op](self._srtp[0], buffer, length)
        return status if status != OK else ffi.buffer(buffer, length[0])[:]


@dataclass
class SrtpCounts:
    auth_failed: int = 0
    replayed: int = 0
    malformed: int = 0  # too short or otherwise refused before authentication


class SrtpContext:
    def __init__(self, inbound: LibSrtpSession, outbound: LibSrtpSession) -> None:
        self._in = inbound
        self._out = outbound
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
        return cls(
            LibSrtpSession(keys[theirs] + salts[theirs], Policy.SSRC_ANY_INBOUND, libsrtp_profile),
            LibSrtpSession(keys[mine] + salts[mine], Policy.SSRC_ANY_OUTBOUND, libsrtp_profile),
        )

    @classmethod
    def from_sdes(cls, theirs: bytes, ours: bytes, profile: str) -> SrtpContext:
        """The pair from SDP security descriptions (RFC 4568): each side sends with the
        key (16 bytes, then the salt) it put in its own `a=crypto`."""
        libsrtp_profile, key_len, salt_len = PROFILES[profile]
        for key in (theirs, ours):
            if len(key) != key_len + salt_len:
                raise ValueError(f"{profile} needs {key_len + salt_len} bytes of key and salt")
        return cls(
            LibSrtpSession(theirs, Policy.SSRC_ANY_INBOUND, libsrtp_profile),
            LibSrtpSession(ours, Policy.SSRC_ANY_OUTBOUND, libsrtp_profile),
        )

    # -- inbound: None when it does not authenticate (counted) ----------------------------------

    def unprotect_rtp(self, data: bytes) -> bytes | None:
        return self._unprotect(UNPROTECT, data)

    def unprotect_rtcp(self, data: bytes) -> bytes | None:
        return self._unprotect(UNPROTECT_RTCP, data)

    def _unprotect(self, op: int, data: bytes) -> bytes | None:
        plain = self._in.apply(op, data)
        if isinstance(plain, bytes):
            return plain
        self._refused(plain)
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
        return _protected(self._out.apply(PROTECT, data))

    def protect_rtcp(self, data: bytes) -> bytes:
        return _protected(self._out.apply(PROTECT_RTCP, data))


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
