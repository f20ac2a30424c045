"""The DTLS bends of aiortc's private parts: with any standard peer, and a close that ends
a browser's connection at once. Part of `hooks.py`'s reach, under its version check
(`hooks.check_pinned_versions`, aiortc 1.16): `hook_points` here is merged into
`hooks.hook_points`, asserted by a test; nothing else in the project touches these
attributes.

Per peer connection, DTLS with any standard peer (`dtls_for_any_peer`): aiortc's SSL
context offers only ECDHE-ECDSA suites, so a peer with an RSA certificate (GStreamer's
`webrtcbin`, many embedded stacks) that is the DTLS server (we answer `a=setup:active`) finds
no shared cipher. The connection keeps its own ECDSA P-256 certificate (and fingerprint); its
context also offers the ECDHE-RSA suites (`PEER_CIPHERS`). The suite only names how the
*server* authenticates: a client may offer RSA suites with an ECDSA certificate of its own.

Per DTLS transport, its close (`close_with_renegotiation`): before its `close_notify`,
an established DTLS 1.2 association sends a renegotiation request (`closing_datagram`).
libwebrtc counts a DTLS transport its peer closed with `close_notify` as still connected;
BoringSSL takes a handshake record after the handshake as a fatal error, so the browser's
DTLS transport, and its peer connection, fail at once instead of at its next consent check.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiortc import RTCCertificate, RTCPeerConnection
from OpenSSL import SSL

# RFC 8827 §6.5 makes ECDHE-ECDSA-AES128-GCM-SHA256 (P-256) mandatory; the RSA ones are for
# peers with RSA certificates, the CBC-SHA ones for older DTLS 1.2 stacks (embedded SDKs).
# ECDHE only (forward secrecy). ECDSA first: when we are the DTLS server, with our ECDSA
# certificate, only those can be chosen anyway.
PEER_CIPHERS = ":".join(
    [
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-RSA-AES256-SHA",
    ]
)


class DtlsCertificate(RTCCertificate):
    """aiortc's certificate whose SSL context offers `ciphers` instead of aiortc's
    ECDHE-ECDSA-only list. OpenSSL's default signature algorithms stay in force; they allow
    RSA (rsa_pss_rsae_*, rsa_pkcs1_*) as well as ECDSA, for the peer's key exchange and
    certificate. The peer's fingerprint is still checked by aiortc, with the SDP's algorithm
    over the peer's DER certificate, whatever its key type."""

    def __init__(self, key: Any, cert: Any, ciphers: str = PEER_CIPHERS) -> None:
        super().__init__(key, cert)
        self.ciphers = ciphers

    def _create_ssl_context(self, srtp_profiles: Any) -> SSL.Context:
        ctx = super()._create_ssl_context(srtp_profiles)
        ctx.set_cipher_list(self.ciphers.encode())
        return ctx


def dtls_for_any_peer(
    pc: RTCPeerConnection, certificate: DtlsCertificate | None = None
) -> DtlsCertificate:
    """Make the DTLS transports `pc` will make use `certificate`: by default a fresh ECDSA
    P-256 key and certificate (aiortc's own builder) offering `PEER_CIPHERS`. Call it on a
    new peer connection, before any transceiver or data channel (each makes its transport
    then, with the certificate of that moment) and before the offer or answer (the SDP's
    fingerprint is the certificate's)."""
    if pc.getTransceivers() or pc.sctp is not None:
        raise ValueError("dtls_for_any_peer: the peer connection has DTLS transports already")
    if certificate is None:
        certificate = DtlsCertificate.generateCertificate()
    pc._RTCPeerConnection__certificates = [certificate]  # type: ignore[attr-defined]
    return certificate


def _pending(ssl: SSL.Connection) -> bytes:
    try:
        return bytes(ssl.bio_read(65536))
    except SSL.WantReadError:
        return b""


def closing_datagram(ssl: SSL.Connection) -> bytes:
    """The datagram that ends `ssl`, an established DTLS 1.2 association on memory BIOs:
    a renegotiation request (our ClientHello, or HelloRequest if we are the server), then
    `close_notify`; b"" for anything else, left untouched (a handshake not done yet, one
    closed already).

    Why (issue #11): libwebrtc maps `close_notify` to DtlsTransportState::kClosed, which
    W3C's aggregate state still counts as connected; any other read error is kFailed, and
    the peer connection is "failed" at once. BoringSSL refuses renegotiation in DTLS: a
    handshake record after the handshake (other than a retransmitted Finished) is an
    unexpected record, a fatal error (ssl/d1_pkt.cc). RFC 8827 §6.5 has a WebRTC peer
    reject renegotiation (and implement none: none is carried out here, the request only
    ends an association being closed); OpenSSL (aiortc, GStreamer) answers no_renegotiation
    (a warning) and goes on to the `close_notify`.

    OpenSSL sends no `close_notify` once a renegotiation has begun (SSL_shutdown: "shutdown
    while in init"), so it is made first and put after the request: the request has the
    later record sequence number, but records within a datagram are read in order and DTLS
    takes an earlier number still inside its replay window (RFC 6347 §4.1.2.6)."""
    handshake_done = ssl.get_finished() is not None and ssl.get_peer_finished() is not None
    closing = ssl.get_shutdown() & SSL.SENT_SHUTDOWN
    if not handshake_done or closing or ssl.get_protocol_version_name() != "DTLSv1.2":
        return b""
    pending = _pending(ssl)  # (aiortc flushes after every call: normally nothing)
    try:
        ssl.shutdown()
    except SSL.Error:
        return pending
    close_notify = _pending(ssl)
    try:
        ssl.renegotiate()
        ssl.do_handshake()  # a client writes its ClientHello, then wants the ServerHello
    except SSL.WantReadError:
        pass
    except SSL.Error:
        return pending + close_notify
    ssl.set_shutdown(ssl.get_shutdown() | SSL.SENT_SHUTDOWN)  # (a server's handshake clears it)
    return pending + _pending(ssl) + close_notify


def close_with_renegotiation(transport: Any) -> None:
    """Make `transport` (an RTCDtlsTransport) end with `closing_datagram` when it is stopped
    while connected: after the peer connection has closed SCTP and stopped the senders, as
    aiortc's stop() would send `close_notify` (it then finds it sent). With BUNDLE, the
    transport is stopped for each transceiver and for SCTP: the first stop sends it."""
    stop = transport.stop

    async def stop_with_renegotiation() -> None:
        if transport.state == "connected" and transport._ssl is not None:
            data = closing_datagram(transport._ssl)
            if data:
                with contextlib.suppress(ConnectionError):
                    await transport.transport._send(data)
        await stop()

    transport.stop = stop_with_renegotiation


def dtls_certificate(pc: RTCPeerConnection) -> RTCCertificate:
    """The certificate `pc`'s next DTLS transport will use."""
    certificate: RTCCertificate = pc._RTCPeerConnection__certificates[0]  # type: ignore[attr-defined]
    return certificate


def hook_points(pc: RTCPeerConnection, dtls: Any) -> dict[str, bool]:
    """Whether every aiortc internal this module relies on is where we expect it, on `pc`
    (a fresh peer connection) and `dtls`, its first DTLS transport."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    return {
        "RTCDtlsTransport._ssl": "_ssl" in RTCDtlsTransport.__init__.__code__.co_names,
        "RTCDtlsTransport.stop: shutdown": ("shutdown" in RTCDtlsTransport.stop.__code__.co_names),
        "RTCIceTransport._send": hasattr(dtls.transport, "_send"),
        "RTCPeerConnection.__certificates": hasattr(pc, "_RTCPeerConnection__certificates"),
        "RTCCertificate._create_ssl_context": hasattr(RTCCertificate, "_create_ssl_context"),
        "RTCDtlsTransport.start: _create_ssl_context": (
            "_create_ssl_context" in RTCDtlsTransport.start.__code__.co_names
        ),
    }
