"""Every reach into aiortc's and aioice's private parts, in one place, with its version check.

firsthop uses stock `RTCPeerConnection`s for offer/answer, the DTLS handshake and SCTP (the
data channel), bent in a few documented places; each bend is a function here (or in
`dtls_hooks.py`, `sctp_hooks.py`), and nothing else in the project touches a private
attribute of aiortc or aioice. They hold for the pinned minors (`PINNED`, also pinned in
pyproject.toml): `check_pinned_versions` refuses to run on others, and `hook_points`
(asserted by a test) says whether every attribute used is where expected.

The bends:

* **one ICE agent** (`use_lite_connection`): each ICE transport of the peer connection runs
  on a `LiteConnection` (`lite_connection.py`) instead of an `aioice.Connection`. It is put
  in the gatherer's and the transport's `_connection`, and in the transport's
  `_recv`/`_send` (bound at its construction), before the answer is made. aioice then
  parses and answers nothing: the session table's `LiteIce` authenticates and answers
  every check and selects the path; the connection carries DTLS to and from it;
* per DTLS transport, once connected: the two SRTP sessions its handshake keyed
  (`srtp_sessions`), which the call's media core (`media/core.py`) then uses alone. aiortc
  itself moves no RTP: the session makes its transceivers inactive;
* in `dtls_hooks.py`: DTLS with peers that have RSA certificates (`dtls_for_any_peer`), and
  a close that makes a browser's connection fail at once (`close_with_renegotiation`);
  in `sctp_hooks.py`: bounds on what a caller's data channels make aiortc keep
  (`bound_sctp`);
"""

from __future__ import annotations

from typing import Any

import aioice
import aiortc
import pylibsrtp
from aiortc import (
    RTCConfiguration,
    RTCPeerConnection,
)
from aiortc.rtcicetransport import RTCIceGatherer, RTCIceTransport

from firsthop.services.transceiver.rtc import dtls_hooks, sctp_hooks
from firsthop.services.transceiver.rtc.lite_connection import LiteConnection

PINNED = {"aiortc": "1.16.", "aioice": "0.13."}


def check_pinned_versions() -> None:
    """Refuse to run on aiortc/aioice versions the hooks were not checked against."""
    found = {"aiortc": aiortc.__version__, "aioice": aioice.__version__}
    for name, prefix in PINNED.items():
        if not found[name].startswith(prefix):
            raise RuntimeError(
                f"{name} {found[name]} is installed; firsthop's hooks are checked against "
                f"{prefix}x only (see services/transceiver/rtc/hooks.py)"
            )


# -- ICE ----------------------------------------------------------------------------------


def ice_transports(pc: RTCPeerConnection) -> list[RTCIceTransport]:
    """Every ICE transport the peer connection made (one with BUNDLE)."""
    return list(pc._RTCPeerConnection__iceTransports)  # type: ignore[attr-defined]


def use_lite_connection(transport: RTCIceTransport, connection: LiteConnection) -> None:
    """Run `transport` (and its gatherer) on `connection` instead of aioice's: before the
    answer is made, so the answer's credentials and candidates are its."""
    transport.iceGatherer._connection = connection  # type: ignore[assignment]
    transport._connection = connection  # type: ignore[assignment]
    transport._recv = connection.recv
    transport._send = connection.send


# -- RTP and SRTP -------------------------------------------------------------------------------


def srtp_sessions(dtls_transport: Any) -> tuple[pylibsrtp.Session, pylibsrtp.Session]:
    """The (inbound, outbound) libsrtp sessions a connected DTLS transport keyed from its
    handshake (RFC 5764 §4.2)."""
    inbound, outbound = dtls_transport._rx_srtp, dtls_transport._tx_srtp
    if inbound is None or outbound is None:
        raise RuntimeError("the DTLS transport has no SRTP keys yet")
    return inbound, outbound


def hook_points() -> dict[str, bool]:
    """Whether every aiortc/aioice internal this module relies on is where we expect it."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport
    from aiortc.rtcsctptransport import RTCSctpTransport

    conn = aioice.Connection(ice_controlling=False)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    receiver = pc.getTransceivers()[0].receiver
    return {
        "RTCIceGatherer._connection": "_connection" in RTCIceGatherer.__init__.__code__.co_names,
        **{
            f"RTCIceTransport.{name}": name in RTCIceTransport.__init__.__code__.co_names
            for name in ("_connection", "_recv", "_send")
        },
        **{
            f"RTCIceTransport uses Connection.{name}": hasattr(conn, name)
            for name in (
                "recv",
                "send",
                "connect",
                "close",
                "get_event",
                "add_remote_candidate",
                "gather_candidates",
                "local_candidates",
                "remote_candidates",
                "local_username",
                "local_password",
                "ice_controlling",
            )
        },  # fmt: skip
        "RTCDtlsTransport._rx_srtp": "_rx_srtp" in RTCDtlsTransport.__init__.__code__.co_names,
        "RTCDtlsTransport._tx_srtp": "_tx_srtp" in RTCDtlsTransport.__init__.__code__.co_names,
        "RTCPeerConnection.__iceTransports": hasattr(pc, "_RTCPeerConnection__iceTransports"),
        **dtls_hooks.hook_points(pc, receiver.transport),
        **sctp_hooks.hook_points(RTCSctpTransport(receiver.transport)),
    }
