"""Loss and jitter: a caller behind a userspace impairment proxy (5 % loss and 10-40 ms
delay, both ways), through a real relay, transceiver and echo agent.

What the agent hears has no holes (a lost packet is repaired from the next one's in-band
FEC, or concealed), and the caller's echo has no more silent 20 ms slots than its own
downlink lost (before: the uplink's losses came back as holes too, 2.2x the loss rate)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from firsthop.services.bench.impair import ImpairedPath, Impairment
from firsthop.services.call.caller import Caller, ToneTrack, tone_power
from firsthop.services.transceiver.jitter import Frame
from firsthop.services.transceiver.opus import OpusDecoder
from firsthop.services.transceiver.rtc import hooks
from tests.integration.test_transceiver import event_count
from tests.support import AgentProcess, RelayProcess, TransceiverProcess, wait_until

LINK = Impairment(loss=0.05, delay=0.010, jitter=0.030)
CALL_SECONDS = 10.0
FREQ = 440.0


class SlotCaller(Caller):
    """Notes which 20 ms slots (by RTP timestamp) came back with the tone. It receives
    through the transceiver's own jitter buffer and decoder, with no concealment: aiortc's
    stock receive path turns one lost packet into a run of several silent frames, and
    reordering into more, which would measure the caller, not the edge."""

    def __init__(self) -> None:
        super().__init__(ToneTrack(FREQ))
        self.loud: set[int] = set()
        self._first: int | None = None
        self._decoder = OpusDecoder()
        for transceiver in self.pc.getTransceivers():
            hooks.low_latency_receiver(transceiver.receiver, self._on_opus)

    def _on_opus(self, frame: Frame) -> None:
        if frame.lost:
            return  # a downlink loss: a silent slot
        pcm = self._decoder.decode(frame.data)
        if self._first is None:
            self._first = frame.timestamp
        if tone_power(pcm, FREQ) > 0.002:
            self.loud.add(((frame.timestamp - self._first) & 0xFFFFFFFF) // 960)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[RelayProcess, TransceiverProcess]]:
    relay = RelayProcess().start()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(agent_url=agent.url).start()
    yield relay, tx
    tx.kill()
    agent.kill()
    relay.kill()


def test_losses_are_repaired_toward_the_agent_and_the_echo_loses_only_the_downlinks(
    stack: tuple[RelayProcess, TransceiverProcess],
) -> None:
    relay, tx = stack
    path = ImpairedPath(relay.listen, up=LINK, down=LINK, seed=7).start()
    decoded_before = event_count(tx, "frames_decoded")
    repaired_before = event_count(tx, "frames_repaired")

    callers: list[SlotCaller] = []
    sessions: list[str] = []

    async def signal(offer: str) -> str:
        where = [f"{path.listen[0]}:{path.listen[1]}"]
        status, body = await asyncio.to_thread(tx.create_session, offer, where)
        assert status == 201, body
        sessions.append(str(body["session_id"]))
        return str(body["answer_sdp"])

    async def main() -> None:
        caller = SlotCaller()  # on this loop: aiortc binds its futures to it
        callers.append(caller)
        await caller.start(signal)
        await asyncio.wait_for(caller.wait_connected(), 10)
        await asyncio.sleep(CALL_SECONDS)  # the call itself: it runs in real time
        status, _ = await asyncio.to_thread(
            tx.request, "DELETE", f"/internal/v1/sessions/{sessions[0]}"
        )
        assert status == 204
        await caller.close()

    try:
        asyncio.run(main())
    finally:
        path.stop()
    (caller,) = callers
    track = caller.track
    assert isinstance(track, ToneTrack)
    sent = track._pts // 960 + 1
    # the transceiver adds up the call's counts once it has torn it down
    wait_until(lambda: event_count(tx, "frames_decoded") > decoded_before)
    decoded = event_count(tx, "frames_decoded") - decoded_before
    repaired = event_count(tx, "frames_repaired") - repaired_before
    up_lost = path.counts["up_lost"] / (path.counts["up"] + path.counts["up_lost"])
    down_lost = path.counts["down_lost"] / (path.counts["down"] + path.counts["down_lost"])
    # toward the agent: every slot the caller sent has audio, real or repaired
    assert repaired > 0.5 * up_lost * sent, (repaired, up_lost, sent)
    assert (decoded + repaired) >= 0.99 * sent, (decoded, repaired, sent)
    # the echo: slots silent at the caller, in its steady part (1 s in, to 0.5 s before
    # the end), are no more than what the downlink itself lost, within 1.5 % (a few
    # frames: the downlink's share of the steady part is not exactly its share of the
    # call). Unrepaired, the uplink's losses came back as holes too: twice as many.
    assert caller.loud, "the caller heard no echo at all"
    first, last = min(caller.loud) + 50, max(caller.loud) - 25
    slots = range(first, last + 1)
    silent = sum(1 for s in slots if s not in caller.loud) / len(slots)
    print(
        f"sent {sent}, agent got {decoded:.0f} + {repaired:.0f} repaired; "
        f"lost up {up_lost:.3f} down {down_lost:.3f}; caller silent {silent:.3f}"
    )
    assert silent <= down_lost + 0.015, (silent, down_lost)
