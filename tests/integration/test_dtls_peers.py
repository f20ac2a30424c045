"""DTLS with peers that have RSA certificates, through a real relay to a real transceiver and
echo agent: an aiortc peer with an RSA key and only the ECDHE-RSA suites, and GStreamer's
`webrtcbin` (libnice, GStreamer's own DTLS and RSA certificate) run by the system python3.

The transceiver answers `a=setup:active`: it is the DTLS client, so the caller's certificate
chooses the suite. Before the DTLS hook, both failed with `no shared cipher`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from firsthop.services.call.caller import Caller, ToneTrack, tone_power
from firsthop.services.transceiver.rtc import dtls_hooks
from tests.integration.test_transceiver import event_count
from tests.support import (
    AgentProcess,
    RelayProcess,
    TransceiverProcess,
    eventually,
    host_address,
    rsa_certificate,
    wait_until,
)

GST_CALLER = Path(__file__).parent.parent / "interop" / "gst_caller.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-gst-1.0 lives there, not in the venv

Stack = tuple[RelayProcess, AgentProcess, TransceiverProcess]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # libnice pins each socket to its interface (IP_UNICAST_IF): from its eth0 candidates a
    # loopback ingress is unreachable, so the relay's public socket is on the host's address.
    relay = RelayProcess(listen_host=host_address()).start()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(agent_url=agent.url).start()
    yield relay, agent, tx
    tx.kill()
    agent.kill()
    relay.kill()


def create_session(tx: TransceiverProcess, relay: RelayProcess, offer: str) -> str:
    status, body = tx.create_session(offer, [f"{relay.listen[0]}:{relay.listen[1]}"])
    assert status == 201, body
    return str(body["answer_sdp"])


def peer_with(certificate: Any) -> RTCPeerConnection:
    """A new aiortc peer connection whose DTLS uses `certificate`."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    dtls_hooks.dtls_for_any_peer(pc, certificate)
    return pc


def rsa_call(
    tx: TransceiverProcess, relay: RelayProcess, certificate: Any, edit: Callable[[str], str]
) -> tuple[str, bytes]:
    """A call from an aiortc peer with `certificate` (its offer changed by `edit`) until a
    second of its tone came back: the answer SDP and the last half second heard."""

    async def main() -> tuple[str, bytes]:
        c = Caller(ToneTrack(440), pc=peer_with(certificate))

        async def signal(offer: str) -> str:
            return await asyncio.to_thread(create_session, tx, relay, edit(offer))

        await c.start(signal)
        await asyncio.wait_for(c.wait_connected(), 15)
        await eventually(lambda: len(c.result.received) >= 96000)
        await c.close()
        return c.result.answer_sdp, bytes(c.result.received[-48000:])

    return asyncio.run(main())


def test_an_rsa_peer_connects_through_the_relay_and_hears_its_tone(stack: Stack) -> None:
    relay, _, tx = stack

    # an RSA key, ECDHE-RSA suites only
    answer, tail = rsa_call(tx, relay, rsa_certificate(), lambda offer: offer)
    assert "a=setup:active" in answer  # we were the client; the RSA peer chose the suite
    assert tone_power(tail, 440) > 0.001  # its own tone, echoed (silence is ~1e-8)


def test_an_rsa_peer_that_is_the_dtls_client_connects(stack: Stack) -> None:
    """An offer with `a=setup:active` makes the transceiver the DTLS server: its ECDSA
    certificate picks an ECDHE-ECDSA suite, and the peer authenticates with its RSA
    certificate (an RSA CertificateVerify, which our signature algorithms must allow)."""
    relay, _, tx = stack

    answer, tail = rsa_call(
        tx,
        relay,
        rsa_certificate(dtls_hooks.PEER_CIPHERS),
        lambda offer: offer.replace("a=setup:actpass", "a=setup:active"),
    )
    assert "a=setup:passive" in answer
    assert tone_power(tail, 440) > 0.001


def test_an_rsa_peer_with_a_wrong_fingerprint_is_rejected(stack: Stack) -> None:
    """The fingerprint check holds for RSA certificates: the offer's sha-256 fingerprint
    with its last byte changed fails the call, and no audio comes back."""
    relay, _, tx = stack
    before = event_count(tx, "ended_connection_failed")

    async def main() -> bytes:
        c = Caller(ToneTrack(440), pc=peer_with(rsa_certificate()))

        async def forged(offer: str) -> str:
            lines = offer.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("a=fingerprint:sha-256 "):
                    lines[i] = line[:-2] + ("00" if line[-2:] != "00" else "11")
            sdp = "\r\n".join(lines) + "\r\n"
            return await asyncio.to_thread(create_session, tx, relay, sdp)

        await c.start(forged)
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "ended_connection_failed") > before
        )
        await c.close()
        return bytes(c.result.received)

    assert tone_power(asyncio.run(main()), 440) < 0.0005


@pytest.mark.parametrize("hooked", [False, True], ids=["stock", "hooked"])
def test_stock_aiortc_finds_no_shared_cipher_with_an_rsa_peer(hooked: bool) -> None:
    """The same two peers in one process (aiortc's own ICE on loopback): the answerer is the
    DTLS client, as the transceiver is; stock aiortc fails, the hooked one connects."""

    async def main() -> tuple[str, str]:
        rsa_peer, answerer = RTCPeerConnection(), RTCPeerConnection()
        dtls_hooks.dtls_for_any_peer(rsa_peer, rsa_certificate())
        if hooked:
            dtls_hooks.dtls_for_any_peer(answerer)
        rsa_peer.addTransceiver("audio")
        await rsa_peer.setLocalDescription(await rsa_peer.createOffer())
        await answerer.setRemoteDescription(rsa_peer.localDescription)
        await answerer.setLocalDescription(await answerer.createAnswer())
        await rsa_peer.setRemoteDescription(
            RTCSessionDescription(answerer.localDescription.sdp, "answer")
        )

        def settled() -> bool:
            states = {rsa_peer.connectionState, answerer.connectionState}
            return states == {"connected"} or "failed" in states

        await eventually(settled, 15)
        states = rsa_peer.connectionState, answerer.connectionState
        await rsa_peer.close()
        await answerer.close()
        return states

    states = asyncio.run(main())
    if hooked:
        assert states == ("connected", "connected")
    else:
        assert "failed" in states, states


def candidates_on(offer: str, relay: RelayProcess) -> str:
    """`offer` with only its candidates on the relay's interface. libnice offers one per
    interface, and the namespace tests' veth pairs can push this host past the transceiver's
    bound (20 candidates: a 400); the transceiver uses none of them (it is ICE-lite and
    learns the caller from its checks), so the check needs none but the one it will use."""
    host = relay.listen[0]
    return "".join(
        line + "\r\n"
        for line in offer.splitlines()
        if not line.startswith("a=candidate:") or f" {host} " in line
    )


def run_gst_caller(
    tx: TransceiverProcess,
    relay: RelayProcess,
    freq: float,
    record: str,
    *,
    seconds: float = 2.5,
    prefix: tuple[str, ...] = (),
    offer_edit: Callable[[str], str] | None = None,
) -> list[dict[str, Any]]:
    """Run the GStreamer caller to its end (`seconds` once connected; `prefix`: the command
    it runs under, `ip netns exec NS`, say); its JSON lines (the offer's and the events).
    Its offer goes to the transceiver with only its candidates on the relay's interface,
    unless `offer_edit` says otherwise."""
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import gi; gi.require_version('GstWebRTC', '1.0')"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, (
        f"{SYSTEM_PYTHON} cannot import GStreamer's webrtc bindings ({probe.stderr.strip()}): "
        "run scripts/ensure-system-deps gstreamer (Debian: gstreamer1.0-plugins-bad "
        "gstreamer1.0-nice python3-gst-1.0 gir1.2-gst-plugins-bad-1.0)"
    )
    argv = [*prefix, SYSTEM_PYTHON, str(GST_CALLER), "--freq", str(freq), "--seconds", str(seconds)]
    edit = offer_edit if offer_edit is not None else partial(candidates_on, relay=relay)
    lines: list[dict[str, Any]] = []
    with subprocess.Popen(
        [*argv, "--record", record, "--timeout", "15"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # shown on the test's stderr once it ended
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        killer = threading.Timer(40 + seconds, proc.kill)  # bounds the whole run, however it hangs
        killer.start()
        try:
            for line in proc.stdout:
                if not line.startswith("{"):  # GLib's debug log (G_MESSAGES_DEBUG) is here too
                    sys.stderr.write(line)
                    continue
                lines.append(json.loads(line))
                if "offer" in lines[-1]:
                    answer = create_session(tx, relay, edit(lines[-1]["offer"]))
                    proc.stdin.write(json.dumps({"answer": answer}) + "\n")
                    proc.stdin.flush()
            proc.wait()
        finally:
            killer.cancel()
            proc.kill()
            sys.stderr.write(proc.stderr.read()[-8000:])
    return lines


def test_a_gstreamer_webrtcbin_caller_connects_through_the_relay_and_hears_its_tone(
    stack: Stack,
) -> None:
    relay, _, tx = stack
    upstream = relay.metric("firsthop_relay_packets_total", direction="upstream")
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "heard.pcm")
        lines = run_gst_caller(tx, relay, 440.0, record)
        heard = Path(record).read_bytes()
    done = lines[-1]
    assert done.get("event") == "done" and done["ok"], lines
    print(json.dumps({"gst_offer_to_connected_s": done["connected"], **done}))
    assert len(heard) >= 96000, len(heard)  # at least a second came back
    tail = heard[-48000:]
    assert tone_power(tail, 440) > 0.001, tone_power(tail, 440)  # its own tone (silence ~1e-8)
    assert tone_power(tail, 440) > 20 * tone_power(tail, 620)  # and not noise
    # through the relay (the transceiver's answer names only the relay's ingress)
    assert relay.metric("firsthop_relay_packets_total", direction="upstream") > upstream + 100
