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
* per DTLS transport, once connected: the SRTP keying material its handshake exports
  (`srtp_keying`, read through its `_ssl`), from which the call's media core
  (`media/core.py`) keys its own SRTP sessions. aiortc itself moves no RTP: the session
  makes its transceivers inactive, and the SRTP sessions aiortc keyed too are never used;
* in `dtls_hooks.py`: DTLS with peers that have RSA certificates (`dtls_for_any_peer`), and
  a close that makes a browser's connection fail at once (`close_with_renegotiation`);
  in `sctp_hooks.py`: bounds on what a caller's data channels make aiortc keep
  (`bound_sctp`);
"""

from __future__ import annotations

from typing import Any

import aioice
import aiortc
from aiortc import (
    RTCConfiguration,
    RTCPeerConnection,
)
from aiortc.rtcicetransport import RTCIceGatherer, RTCIceTransport

from firsthop.services.transceiver.media.srtp import PROFILES
from firsthop.services.transceiver.rtc import dtls_hooks, sctp_hooks
from firsthop.services.transceiver.rtc.lite_connection import LiteConnection

PINNED = {"aiortc": "1.16.", "aioice": "0.13."}

# RFC 5764 §4.2: a client and a server master key, then a client and a server master salt.
SRTP_KEYING_BYTES = {name: 2 * (key + salt) for name, (_, key, salt) in PROFILES.items()}


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


def srtp_keying(dtls_transport: Any) -> tuple[bytes, str]:
    """The SRTP keying material a connected DTLS transport's handshake exports (RFC 5764
    §4.2), and the protection profile it negotiated (§4.1.2): the call's media core keys its
    own SRTP sessions from them (`SrtpContext.from_keying_material`); aiortc's stay unused."""
    ssl = dtls_transport._ssl
    profile = ssl.get_selected_srtp_profile() if ssl is not None else b""
    if not profile:
        raise RuntimeError("the DTLS transport negotiated no SRTP profile")
    name = profile.decode()
    if name not in SRTP_KEYING_BYTES:
        raise RuntimeError(f"the DTLS transport negotiated {name}, which firsthop does not key")
    material = ssl.export_keying_material(b"EXTRACTOR-dtls_srtp", SRTP_KEYING_BYTES[name])
    return bytes(material), name


def hook_points() -> dict[str, bool]:
    """Whether every aiortc/aioice internal this module relies on is where we expect it."""
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
        "RTCPeerConnection.__iceTransports": hasattr(pc, "_RTCPeerConnection__iceTransports"),
        **dtls_hooks.hook_points(pc, receiver.transport),
        **sctp_hooks.hook_points(RTCSctpTransport(receiver.transport)),
    }
