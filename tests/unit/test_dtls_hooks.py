"""The DTLS hooks. `dtls_hooks.dtls_for_any_peer`: a transceiver session keeps its own ECDSA P-256
certificate and offers the ECDHE-RSA suites too, so peers with RSA certificates connect.
`dtls_hooks.closing_datagram`: an established association ends with a renegotiation request, then
close_notify, which an OpenSSL peer (aiortc's) refuses and then reads. And the pinned-version
check still stands in front of them. (How libwebrtc takes the request: tests/e2e.)"""

from __future__ import annotations

import asyncio
import struct

import aiortc
import pytest
from aiortc import RTCCertificate, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcdtlstransport import SRTP_PROFILES
from cryptography.hazmat.primitives.asymmetric import ec
from OpenSSL import SSL

from firsthop.services.transceiver.rtc import RtcSession, SessionCallbacks, dtls_hooks, hooks
from tests.support import eventually

RSA_SUITES = {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-AES128-SHA"}
ECDSA_SUITES = {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES128-SHA"}


def offered(certificate: RTCCertificate) -> set[str]:
    """The DTLS 1.2 cipher suites a handshake with `certificate` offers (or accepts); the
    TLS 1.3 names OpenSSL also lists do not apply to DTLS 1.2."""
    ctx = certificate._create_ssl_context(SRTP_PROFILES)
    return {s for s in SSL.Connection(ctx, None).get_cipher_list() if not s.startswith("TLS_")}


def test_stock_aiortc_offers_only_ecdsa_suites() -> None:
    """Why the hook exists: if a new aiortc offers RSA suites itself, it can go."""
    suites = offered(RTCCertificate.generateCertificate())
    assert ECDSA_SUITES <= suites
    assert not suites & RSA_SUITES


def test_the_hooked_certificate_offers_rsa_and_ecdsa_suites() -> None:
    suites = offered(dtls_hooks.DtlsCertificate.generateCertificate())
    assert ECDSA_SUITES | RSA_SUITES <= suites
    assert all(s.startswith("ECDHE-") for s in suites)  # forward secrecy only
    assert not any("NULL" in s or "RC4" in s or "3DES" in s for s in suites)


def test_a_session_answers_with_its_own_ecdsa_p256_certificate_and_the_wide_suites() -> None:
    callbacks = SessionCallbacks(
        audio=lambda pcm: None,
        state=lambda s: None,
        message=lambda m: None,
        selected=lambda: None,
        milestone=lambda m: None,
        count=lambda c: None,
    )

    async def main() -> tuple[RTCCertificate, str]:
        caller = RTCPeerConnection()
        caller.addTransceiver("audio")
        await caller.setLocalDescription(await caller.createOffer())
        session = RtcSession(lambda data, addr: None, callbacks, candidates=[("127.0.0.1", 3478)])
        answer = await session.answer(caller.localDescription.sdp, ("ufrag", "p" * 24))
        await session.pc.close()
        await caller.close()
        return dtls_hooks.dtls_certificate(session.pc), answer

    certificate, answer = asyncio.run(main())
    assert isinstance(certificate, dtls_hooks.DtlsCertificate)
    key = certificate._key
    assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)
    assert ECDSA_SUITES | RSA_SUITES <= offered(certificate)
    # the answer's fingerprint is this certificate's: the DTLS transports use it
    sha256 = next(f.value for f in certificate.getFingerprints() if f.algorithm == "sha-256")
    assert f"a=fingerprint:sha-256 {sha256}" in answer
    assert "a=setup:active" in answer  # we are the DTLS client: the peer's suites choose


def test_a_peer_connection_with_transports_is_refused() -> None:
    """A transport takes the certificate of the moment it is made: one made before the hook
    would answer with aiortc's own certificate, so the hook refuses rather than half-apply."""

    async def main() -> None:
        for make in ("addTransceiver", "createDataChannel"):
            pc = RTCPeerConnection()
            getattr(pc, make)("audio")
            with pytest.raises(ValueError, match="DTLS transports already"):
                dtls_hooks.dtls_for_any_peer(pc)
            await pc.close()

    asyncio.run(main())


def test_a_new_peer_connection_offers_the_hooked_certificate() -> None:
    async def main() -> tuple[str, str]:
        pc = RTCPeerConnection()
        certificate = dtls_hooks.dtls_for_any_peer(pc)
        pc.addTransceiver("audio")
        await pc.setLocalDescription(await pc.createOffer())
        await pc.close()
        fingerprint = next(f for f in certificate.getFingerprints() if f.algorithm == "sha-256")
        return fingerprint.value, pc.localDescription.sdp

    fingerprint, offer = asyncio.run(main())
    assert f"a=fingerprint:sha-256 {fingerprint}" in offer


def test_the_version_check_guards_the_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks.check_pinned_versions()  # the pinned aiortc: fine
    monkeypatch.setattr(aiortc, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match="hooks.py"):
        hooks.check_pinned_versions()


def test_the_dtls_hook_points_are_where_expected() -> None:
    async def main() -> dict[str, bool]:
        return hooks.hook_points()

    points = asyncio.run(main())
    dtls = {k: v for k, v in points.items() if "Certificate" in k or "certificate" in k}
    assert len(dtls) >= 2 and all(dtls.values()), dtls


# -- the close: renegotiation request, then close_notify ---------------------------------------

HANDSHAKE, ALERT = 22, 21  # DTLS record content types (RFC 6347 §4.1)


def dtls_pair() -> tuple[SSL.Connection, SSL.Connection]:
    """A client and a server as aiortc makes them (memory BIOs), not yet shaken hands."""
    client = SSL.Connection(
        dtls_hooks.DtlsCertificate.generateCertificate()._create_ssl_context(SRTP_PROFILES)
    )
    client.set_connect_state()
    server = SSL.Connection(RTCCertificate.generateCertificate()._create_ssl_context(SRTP_PROFILES))
    server.set_accept_state()
    return client, server


def flush(source: SSL.Connection, dest: SSL.Connection) -> bytes:
    try:
        data = bytes(source.bio_read(65536))
    except SSL.WantReadError:
        return b""
    dest.bio_write(data)
    return data


def handshake(client: SSL.Connection, server: SSL.Connection) -> None:
    done: set[int] = set()
    for _ in range(10):
        for i, side in enumerate((client, server)):
            try:
                side.do_handshake()
                done.add(i)
            except SSL.WantReadError:
                pass
        flush(client, server)
        flush(server, client)
        if len(done) == 2:
            return
    raise AssertionError("no handshake")


def records(datagram: bytes) -> list[tuple[int, int, int]]:
    """(content type, epoch, sequence number) of each record in a DTLS datagram."""
    found = []
    while datagram:
        kind, _, epoch, seq_hi, seq_lo, length = struct.unpack("!BHHHIH", datagram[:13])
        found.append((kind, epoch, seq_hi << 32 | seq_lo))
        datagram = datagram[13 + length :]
    return found


def read_until_closed(ssl: SSL.Connection) -> None:
    with pytest.raises(SSL.ZeroReturnError):  # the close_notify
        ssl.recv(1500)


@pytest.mark.parametrize("role", ["client", "server"])
def test_the_close_is_a_renegotiation_request_then_close_notify(role: str) -> None:
    """A client's request is a ClientHello, a server's a HelloRequest: a handshake record in
    the new epoch, one sequence number after the close_notify that follows it in the same
    datagram (OpenSSL sends no close_notify once a renegotiation began)."""
    client, server = dtls_pair()
    handshake(client, server)
    ours, peer = (client, server) if role == "client" else (server, client)
    datagram = dtls_hooks.closing_datagram(ours)
    (request, close_notify) = records(datagram)
    assert request[:2] == (HANDSHAKE, 1) and close_notify[:2] == (ALERT, 1)
    assert request[2] == close_notify[2] + 1
    peer.bio_write(datagram)
    read_until_closed(peer)  # the request refused (or taken) first, then close_notify
    reply = records(flush(peer, ours))
    if role == "client":  # OpenSSL refuses a client's renegotiation: a warning alert
        assert [r[0] for r in reply] == [ALERT]
    assert dtls_hooks.closing_datagram(ours) == b""  # once


def test_a_handshake_not_done_is_not_touched() -> None:
    client, server = dtls_pair()
    with pytest.raises(SSL.WantReadError):
        client.do_handshake()
    flush(client, server)
    with pytest.raises(SSL.WantReadError):
        server.do_handshake()
    flush(server, client)  # the client has the server's flight, unread
    assert dtls_hooks.closing_datagram(client) == b""
    assert dtls_hooks.closing_datagram(server) == b""
    handshake(client, server)  # and it completes as if nothing had happened
    client.send(b"still here")
    flush(client, server)
    assert server.recv(1500) == b"still here"


def test_the_close_hook_points_are_where_expected() -> None:
    async def main() -> dict[str, bool]:
        return hooks.hook_points()

    points = asyncio.run(main())
    close = {k: v for k, v in points.items() if k.startswith(("RTCDtlsTransport.", "RTCIce"))}
    assert {"RTCDtlsTransport._ssl", "RTCDtlsTransport.stop: shutdown"} <= set(close)
    assert all(close.values()), close


def test_the_hook_points_cover_dtls_hooks_too() -> None:
    async def main() -> tuple[set[str], dict[str, bool]]:
        pc = RTCPeerConnection()
        dtls = pc.addTransceiver("audio").receiver.transport
        points = dtls_hooks.hook_points(pc, dtls)
        await pc.close()
        return set(points), hooks.hook_points()

    mine, everything = asyncio.run(main())
    assert len(mine) >= 6 and mine <= set(everything)


# -- the SRTP keys the media core takes from the handshake -------------------------------------


@pytest.mark.parametrize("offer_setup", ["actpass", "active"], ids=["we-client", "we-server"])
def test_srtp_keyed_from_the_export_talks_to_aiortcs_own_sessions(offer_setup: str) -> None:
    """`hooks.srtp_keying` plus `SrtpContext.from_keying_material` give the keys aiortc's own
    DTLS transport derives (RFC 5764 §4.2): what ours protects, the peer's aiortc unprotects,
    and the other way round, with the transceiver as the DTLS client (an actpass offer) and
    as the server (an offer that is active)."""
    from firsthop.services.transceiver.media.srtp import SrtpContext
    from firsthop.shared.wire.rtp import pack_header

    async def main() -> tuple[bytes, bytes, bytes]:
        caller, answerer = RTCPeerConnection(), RTCPeerConnection()
        dtls_hooks.dtls_for_any_peer(answerer)
        caller.addTransceiver("audio")
        await caller.setLocalDescription(await caller.createOffer())
        offer = caller.localDescription.sdp.replace("a=setup:actpass", f"a=setup:{offer_setup}")
        await answerer.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        await answerer.setLocalDescription(await answerer.createAnswer())
        answer = answerer.localDescription.sdp
        await caller.setRemoteDescription(RTCSessionDescription(answer, "answer"))

        def connected() -> bool:
            return {caller.connectionState, answerer.connectionState} == {"connected"}

        await eventually(connected, 15)
        material, profile = hooks.srtp_keying(answerer.getTransceivers()[0].receiver.transport)
        ours = SrtpContext.from_keying_material(
            material, profile, client="a=setup:active" in answer
        )
        theirs = caller.getTransceivers()[0].receiver.transport  # the caller's aiortc sessions
        rtp = pack_header(111, 7, 960, 0x1234) + b"voice"
        heard_by_them = theirs._rx_srtp.unprotect(ours.protect_rtp(rtp))
        heard_by_us = ours.unprotect_rtp(
            theirs._tx_srtp.protect(pack_header(111, 9, 0, 99) + b"hi")
        )
        await caller.close()
        await answerer.close()
        return rtp, heard_by_them, heard_by_us or b""

    sent, heard_by_them, heard_by_us = asyncio.run(main())
    assert heard_by_them == sent
    assert heard_by_us.endswith(b"hi")
