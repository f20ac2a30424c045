"""The transceiver's loop gather (`rtc/bridge.py`) on a real process: a backlog on the media
socket is read at once, not a batch a gather (a flood must not turn the gather into kernel
drops), and what the loop did is in /metrics."""

from __future__ import annotations

import os
import signal
import socket
import time

from firsthop.shared.metrics import parse_text
from tests.support import TransceiverProcess, start_all

# Datagrams queued while the transceiver is stopped: 4 of its reads, and within what a
# socket holds at the kernel's default buffer limit (512 of these at rmem_max 212992).
BACKLOG = 300


def drops(tx: TransceiverProcess) -> float:
    status, body = tx.request("GET", "/metrics")
    assert status == 200
    series = parse_text(body.decode())
    return sum(v for (name, _), v in series.items() if name == "firsthop_transceiver_drops_total")


def read_everything(tx: TransceiverProcess, sent: int) -> None:
    deadline = time.monotonic() + 15
    while drops(tx) < sent:
        assert time.monotonic() < deadline, "the transceiver did not read its backlog"
        time.sleep(0.05)


def test_a_read_that_fills_its_batch_stops_the_next_gather() -> None:
    for gather_ms, gathering in (("2", True), ("0", False)):
        tx = TransceiverProcess("--gather-ms", gather_ms)
        start_all(tx)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # Not framed by a relay: each is a counted drop ("unframed"), after it is read.
            os.kill(tx.pid, signal.SIGSTOP)  # the whole backlog waits in the socket
            try:
                for i in range(BACKLOG):
                    sender.sendto(b"junk %d" % i, tx.media)
            finally:
                os.kill(tx.pid, signal.SIGCONT)
            read_everything(tx, BACKLOG)
            left = tx.event_count("loop_work_left")
            if gathering:  # each full read told the loop to come back at once
                assert left >= 1, left
            else:  # a loop that never gathers keeps no such count
                assert left == 0 and tx.event_count("loop_gathers") == 0
        finally:
            sender.close()
            tx.kill()
