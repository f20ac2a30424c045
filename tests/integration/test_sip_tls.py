"""SIP over TLS (RFC 3261 §26.2): `--sip-tls-listen` with a certificate, a real TLS client."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest

from firsthop.shared.wire import sip

from ..sip_phone import Phone, PhoneStack
from ..support import free_tcp_port, make_cert

pytestmark = pytest.mark.slow


def test_options_and_a_call_over_tls(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    port = free_tcp_port()
    flags = ["--sip-tls-listen", f"127.0.0.1:{port}", "--sip-tls-cert", str(cert)]
    with PhoneStack.running(*flags, "--sip-tls-key", str(key)) as stack:
        context = ssl.create_default_context(cafile=str(cert))
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            phone = Phone(stack.sip)  # (its messages; sent over the TLS connection here)
            try:
                options = phone.request("OPTIONS").encode().replace(b"/UDP", b"/TLS")
                tls.sendall(options)
                answer = sip.parse_sip(tls.recv(65536))
                assert isinstance(answer, sip.SipResponse) and answer.status == 200
                invite = phone.request("INVITE", body=phone.offer())
                tls.sendall(invite.encode().replace(b"/UDP", b"/TLS"))
                statuses: list[int] = []
                while not statuses or statuses[-1] < 200:
                    message = sip.parse_sip(tls.recv(65536))
                    assert isinstance(message, sip.SipResponse)
                    statuses.append(message.status)
                assert statuses[-1] == 200 and b"RTP/AVP" in message.body
            finally:
                phone.close()
        # a trunk's address that starts a handshake and never finishes it: closed after
        # TLS_HANDSHAKE (5 s), not the 300 s a trickle of bytes had kept it
        stalled = socket.create_connection(("127.0.0.1", port), timeout=15)
        try:
            stalled.sendall(b"\x16\x03\x01")  # (the start of a ClientHello's record)
            started = time.monotonic()
            assert stalled.recv(100) == b""
            assert time.monotonic() - started < 10
        finally:
            stalled.close()
        stranger = socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0)
        )
        try:
            assert stranger.recv(100) == b""  # no trunk's: closed before any handshake
        finally:
            stranger.close()
        # a TLS peer that drops its connection without close_notify (an EOF in violation of
        # the protocol, which trio reports as a broken stream), and one that resets it: that
        # connection ends, nothing else does (this used to end the whole SIP front)
        for abrupt in range(4):
            dropped = context.wrap_socket(
                socket.create_connection(("127.0.0.1", port), timeout=5),
                server_hostname="localhost",
            )
            dropped.sendall(b"OPTIONS sip:x SIP/2.0\r\n")  # (half a message)
            if abrupt % 2:
                dropped.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" + bytes(4)
                )
            socket.socket(fileno=dropped.detach()).close()  # (no close_notify: the raw close)
        again = context.wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost"
        )
        with again:
            phone = Phone(stack.sip)
            try:
                again.sendall(phone.request("OPTIONS").encode().replace(b"/UDP", b"/TLS"))
                answer = sip.parse_sip(again.recv(65536))
                assert isinstance(answer, sip.SipResponse) and answer.status == 200
                phone.send(phone.request("OPTIONS"))  # and over UDP, the same front
                assert phone.responses_until_final()[-1].status == 200
            finally:
                phone.close()
