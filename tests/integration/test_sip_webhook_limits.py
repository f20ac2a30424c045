"""A webhook receiver that misbehaves (`--sip-webhook`, `signaling/sip.py` `_tell_app`), as
a real signaling sees it: only the answer's status is read, each post has its deadline in
all, and no post is made for a call that has ended. The receivers are raw sockets here, so
they can answer as no HTTP server library would."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis as redis_lib

from firsthop.shared.metrics import parse_text
from tests.sip_phone import Phone, PhoneStack
from tests.support import SignalingProcess, free_sip_port, wait_until

SECRET = "whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB"
HUGE = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n" + bytes(65536)
REFUSED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"


class Receiver:
    """A webhook endpoint on loopback: each post gets `answer`, then the connection is held
    open (a body that never ends, for a `HUGE` answer); notes the posts and when signaling
    closed each connection."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.posts = 0
        self.bodies: list[bytes] = []
        self.closed_after: list[float] = []  # seconds from our answer to signaling's close
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")),
                0,
            )  # fmt: skip
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            self.bodies.append(body)
            self.posts += 1
            conn.sendall(self.answer)
            answered = time.monotonic()
            conn.settimeout(30)
            try:
                while conn.recv(65536):  # (the rest of the post's body)
                    pass
            except OSError:
                pass
            self.closed_after.append(time.monotonic() - answered)


@contextmanager
def signaling_with(receiver: Receiver) -> Iterator[tuple[SignalingProcess, Phone]]:
    port = free_sip_port()
    sig = SignalingProcess(
        *["--sip-listen", f"127.0.0.1:{port}", "--sip-trunk", "local=127.0.0.1/32"],
        *["--sip-webhook", receiver.url, "--sip-webhook-secret", SECRET],
    ).start()
    phone = Phone(("127.0.0.1", port))
    try:
        yield sig, phone
    finally:
        phone.close()
        sig.kill()
        receiver.listener.close()


def events(sig: SignalingProcess) -> dict[str, float]:
    samples = parse_text(httpx.get(f"{sig.url}/metrics", timeout=5).text)
    return {
        dict(labels)["event"]: value
        for (name, labels), value in samples.items()
        if name == "firsthop_signaling_events_total"
    }


def test_a_huge_answer_is_taken_at_its_status_and_its_connection_closed() -> None:
    """A 200 whose body never ends (a gigabyte announced): signaling had read bodies whole
    (300 MiB took it from 58 to 659 MB, per ringing call) and held the connection of the
    pool placement uses. Now the post is delivered at its status, and the connection closed
    at once."""
    receiver = Receiver(HUGE)
    with signaling_with(receiver) as (sig, phone):
        phone.send(phone.request("INVITE", body=phone.offer()))
        wait_until(lambda: events(sig).get("sip_webhooks_delivered") == 1, timeout=10)
        wait_until(lambda: receiver.closed_after, timeout=10)
        assert receiver.posts == 1 and receiver.closed_after[0] < 3.0, receiver.closed_after
        assert not events(sig).get("sip_webhook_failures")


def test_no_post_is_retried_for_a_call_that_has_ended() -> None:
    """A receiver that fails (500) is tried again after 0.5 s, then 1 s; a CANCEL in
    between ends the ringing call, and with it the posting (it had gone on to its third)."""
    receiver = Receiver(REFUSED)
    with signaling_with(receiver) as (sig, phone):
        invite = phone.request("INVITE", body=phone.offer())
        phone.send(invite)
        wait_until(lambda: receiver.posts == 1, timeout=10)
        phone.cancel(invite)
        time.sleep(2.0)  # (longer than the 0.5 s and 1 s back-offs: a post would have come)
        assert receiver.posts == 1


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_an_accept_whose_app_went_away_still_ends_cleanly() -> None:
    """The app's accept is cut off (its client gave up) while the call is being placed, and
    the trunk then cancels. The accept had been cancelled with its request: the call stayed
    "accepted" for good, the ringing call's task polled it with no pause (more than half a
    core, until the record expired an hour later), and the transceiver's session was never
    ended. Now the placing finishes, the call's end ends the session, and nothing spins."""
    receiver = Receiver(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    flags = ["--sip-webhook", receiver.url, "--sip-webhook-secret", SECRET]
    with PhoneStack.running(*flags) as stack:
        phone = Phone(stack.sip)
        try:
            invite = phone.request("INVITE", body=phone.offer())
            phone.send(invite)
            wait_until(lambda: receiver.bodies, timeout=10)
            call_id = json.loads(receiver.bodies[0])["data"]["call_id"]
            os.kill(stack.tx.pid, signal.SIGSTOP)  # placing waits on the transceiver
            try:
                with pytest.raises(httpx.TimeoutException):
                    httpx.post(
                        f"{stack.sig.url}/v1/realtime/calls/{call_id}/accept",
                        json={"type": "realtime", "model": "echo"},
                        headers={"Authorization": f"Bearer {SignalingProcess.API_KEY}"},
                        timeout=0.5,
                    )
                phone.cancel(invite)
                before, t0 = cpu_seconds(stack.sig.pid), time.monotonic()
                time.sleep(1.0)  # (a window to measure signaling's CPU in)
                busy = (cpu_seconds(stack.sig.pid) - before) / (time.monotonic() - t0)
            finally:
                os.kill(stack.tx.pid, signal.SIGCONT)
            assert busy < 0.2, f"signaling {busy:.0%} of a core while the call waits"
            wait_until(lambda: sessions(stack) == 0, timeout=20)  # placed, then ended
            # and the ringing call is over, its record gone (it had waited on "accepted")
            with redis_lib.Redis.from_url(stack.redis.url) as ringing:
                wait_until(lambda: not list(ringing.scan_iter("firsthop:sipcall:*")), timeout=20)
        finally:
            phone.close()


def sessions(stack: PhoneStack) -> float:
    samples = parse_text(httpx.get(f"{stack.tx.api}/metrics", timeout=5).text)
    return sum(v for (name, _), v in samples.items() if name == "firsthop_transceiver_sessions")
