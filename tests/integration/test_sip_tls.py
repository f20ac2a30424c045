"""SIP over TLS (RFC 3261 §26.2): `--sip-tls-listen` with a certificate, a real TLS client."""

from __future__ import annotations

import datetime
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from firsthop.shared.wire import sip

from ..sip_phone import Phone, PhoneStack
from ..support import free_tcp_port

pytestmark = pytest.mark.slow


def self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sip.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("sip.test")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "sip.pem", tmp / "sip.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_options_and_a_call_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_tcp_port()
    flags = ["--sip-tls-listen", f"127.0.0.1:{port}", "--sip-tls-cert", str(cert)]
    with PhoneStack.running(*flags, "--sip-tls-key", str(key)) as stack:
        context = ssl.create_default_context(cafile=str(cert))
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        with context.wrap_socket(raw, server_hostname="sip.test") as tls:
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
        stranger = socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0)
        )
        try:
            assert stranger.recv(100) == b""  # no trunk's: closed before any handshake
        finally:
            stranger.close()
