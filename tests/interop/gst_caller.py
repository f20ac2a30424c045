"""A GStreamer `webrtcbin` caller (libnice ICE, GStreamer's own DTLS with its RSA
certificate): an interop peer for firsthop that shares no code with aiortc.

Run with the SYSTEM python3 (Debian's python3-gst-1.0; the test venv cannot import `gi`):

    /usr/bin/python3 tests/interop/gst_caller.py --freq 440 --seconds 3 --record out.pcm

It speaks JSON lines: it prints `{"offer": sdp}` (candidates gathered, in the SDP), reads
`{"answer": sdp}` on stdin, then prints events: `{"event": "ice", "state": ..., "t": s}`,
`{"event": "connected", "t": s}` (peer connection connected: ICE and DTLS done),
`{"event": "first_audio", "t": s}`, and at the end `{"event": "done", "bytes": n, ...}`.
Times are seconds since the offer was asked for. What it hears back (PCM16 mono 48 kHz) goes
to `--record`. It sends an `audiotestsrc` sine tone (Opus, payload type 111).
Exit status: 0 once it ran `--seconds` after connecting, 1 if the call failed or timed out.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("GstSdp", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

PIPELINE = (
    "webrtcbin name=wb bundle-policy=max-bundle "
    "audiotestsrc is-live=true wave=sine freq={freq} volume=0.3 ! audioconvert ! audioresample"
    " ! audio/x-raw,rate=48000,channels=1 ! opusenc ! rtpopuspay pt=111"
    " ! application/x-rtp,media=audio,encoding-name=OPUS,payload=111 ! wb."
)
RECEIVE = (
    "rtpopusdepay ! opusdec ! audioconvert ! audioresample"
    " ! audio/x-raw,format=S16LE,rate=48000,channels=1"
    " ! appsink name=sink emit-signals=true sync=false"
)


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class GstCaller:
    def __init__(self, freq: float, seconds: float, record: str, timeout: float) -> None:
        self.seconds = seconds
        self.timeout = timeout
        self.record = open(record, "wb")  # noqa: SIM115 - closed in run()
        self.received = 0
        self.loop = GLib.MainLoop()
        self.pipeline = Gst.parse_launch(PIPELINE.format(freq=freq))
        self.wb = self.pipeline.get_by_name("wb")
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}
        self.failed = ""
        self.offered = False
        self.wb.connect("pad-added", self.on_pad)
        self.wb.connect("notify::ice-connection-state", self.on_ice)
        self.wb.connect("notify::connection-state", self.on_state)
        self.wb.connect("notify::ice-gathering-state", self.on_gathering)
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_error)

    def mark(self, name: str, **extra: Any) -> None:
        if name not in self.marks:
            self.marks[name] = time.monotonic() - self.t0
            say(event=name, t=round(self.marks[name], 4), **extra)

    # -- signaling ---------------------------------------------------------------------------

    def start(self) -> None:
        self.wb.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.pipeline.set_state(Gst.State.PLAYING)
        GLib.timeout_add(int(self.timeout * 1000), self.on_timeout)

    def on_negotiation_needed(self, *_: Any) -> None:
        if self.offered:
            return
        self.offered = True
        self.t0 = time.monotonic()
        promise = Gst.Promise.new_with_change_func(self.on_offer, None)
        self.wb.emit("create-offer", None, promise)

    def on_offer(self, promise: Gst.Promise, *_: Any) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        if offer is None:
            GLib.idle_add(self.fail, f"create-offer gave no offer: {reply}")
            return
        self.wb.emit("set-local-description", offer, None)

    def on_gathering(self, *_: Any) -> None:
        gathering = self.wb.get_property("ice-gathering-state")
        if gathering != GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            return
        self.mark("gathered")
        sdp = self.wb.get_property("local-description").sdp.as_text()
        say(offer=sdp)
        threading.Thread(target=self.read_answer, daemon=True).start()

    def read_answer(self) -> None:
        line = sys.stdin.readline()
        if not line:
            GLib.idle_add(self.fail, "no answer on stdin")
            return
        GLib.idle_add(self.set_answer, json.loads(line)["answer"])

    def set_answer(self, text: str) -> bool:
        self.mark("answer")
        _, sdp = GstSdp.SDPMessage.new_from_text(text)
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, sdp)
        self.wb.emit("set-remote-description", answer, None)
        return False

    # -- states and media --------------------------------------------------------------------

    def on_ice(self, *_: Any) -> None:
        state = self.wb.get_property("ice-connection-state")
        say(event="ice", state=state.value_nick, t=round(time.monotonic() - self.t0, 4))
        if state == GstWebRTC.WebRTCICEConnectionState.FAILED:
            GLib.idle_add(self.fail, "ICE failed")

    def on_state(self, *_: Any) -> None:
        state = self.wb.get_property("connection-state")
        if state == GstWebRTC.WebRTCPeerConnectionState.CONNECTED:
            self.mark("connected")
            GLib.timeout_add(int(self.seconds * 1000), self.finish)
        elif state == GstWebRTC.WebRTCPeerConnectionState.FAILED:
            GLib.idle_add(self.fail, "peer connection failed (DTLS?)")

    def on_pad(self, _: Any, pad: Gst.Pad) -> None:
        if pad.get_direction() != Gst.PadDirection.SRC:
            return
        branch = Gst.parse_bin_from_description(RECEIVE, True)
        self.pipeline.add(branch)
        branch.sync_state_with_parent()
        pad.link(branch.get_static_pad("sink"))
        branch.get_by_name("sink").connect("new-sample", self.on_sample)

    def on_sample(self, sink: Any) -> Gst.FlowReturn:
        buffer = sink.emit("pull-sample").get_buffer()
        data = buffer.extract_dup(0, buffer.get_size())
        self.mark("first_audio")
        self.record.write(data)
        self.received += len(data)
        return Gst.FlowReturn.OK

    # -- the end -----------------------------------------------------------------------------

    def on_error(self, _: Any, message: Gst.Message) -> None:
        error, debug = message.parse_error()
        self.fail(f"{error.message} ({debug})")

    def on_timeout(self) -> bool:
        if "connected" not in self.marks:
            self.fail(f"not connected within {self.timeout} s")
        return False

    def fail(self, reason: str) -> bool:
        if not self.failed:
            self.failed = reason
            say(event="failed", reason=reason)
            self.loop.quit()
        return False

    def finish(self) -> bool:
        self.loop.quit()
        return False

    def run(self) -> int:
        self.start()
        try:
            self.loop.run()
        finally:
            self.pipeline.set_state(Gst.State.NULL)
            self.record.close()
        say(event="done", bytes=self.received, ok=not self.failed, **self.marks)
        return 1 if self.failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--freq", type=float, default=440.0)
    parser.add_argument("--seconds", type=float, default=3.0, help="to run once connected")
    parser.add_argument("--timeout", type=float, default=15.0, help="to connect, from start")
    parser.add_argument("--record", required=True, help="file for the audio heard back")
    args = parser.parse_args()
    Gst.init(None)
    return GstCaller(args.freq, args.seconds, args.record, args.timeout).run()


if __name__ == "__main__":
    sys.exit(main())
