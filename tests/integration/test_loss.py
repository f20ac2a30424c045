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
from firsthop.services.bench.loss import SlotCaller, silent_slots
from tests.integration.test_transceiver import event_count
from tests.support import AgentProcess, RelayProcess, TransceiverProcess, wait_until

# serial: its gap bound is a few 20 ms slots, and a stall from another test's load would count
# (alone, after the rest)
pytestmark = pytest.mark.serial

LINK = Impairment(loss=0.05, delay=0.010, jitter=0.030)
CALL_SECONDS = 10.0


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
    sent = caller.sent
    # the transceiver adds up the call's counts once it has torn it down
    wait_until(lambda: event_count(tx, "frames_decoded") > decoded_before)
    decoded = event_count(tx, "frames_decoded") - decoded_before
    repaired = event_count(tx, "frames_repaired") - repaired_before
    up_lost = path.counts["up_lost"] / (path.counts["up"] + path.counts["up_lost"])
    down_lost = path.counts["down_lost"] / (path.counts["down"] + path.counts["down_lost"])
    # toward the agent: every slot the caller sent has audio, real or repaired
    assert repaired > 0.5 * up_lost * sent, (repaired, up_lost, sent)
    assert (decoded + repaired) >= 0.99 * sent, (decoded, repaired, sent)
    # The echo, in its steady part (1 s in, to 0.5 s before the end): a slot without the
    # tone at the caller is one its downlink lost (or one in a burst past what the
    # caller's buffer marks, `MAX_CONCEALED`). The edge itself sends the tone in every
    # slot but a handful (the output cushion a jittery uplink builds, a burst longer than
    # the repair bound). Unrepaired, the uplink's losses came back as holes too: as many
    # again as the downlink's.
    assert caller.loud, "the caller heard no echo at all"
    silent, edge_gaps, slots = silent_slots(caller)
    print(
        f"sent {sent}, agent got {decoded:.0f} + {repaired:.0f} repaired; "
        f"lost up {up_lost:.3f} down {down_lost:.3f}; caller silent {len(silent)} of "
        f"{slots}, {len(edge_gaps)} not lost on the downlink: {edge_gaps}"
    )
    # The bounds: 2.5 % of the slots (about 10). Run alone on one VM (2026-12-05), the edge's
    # own gaps were 0, 0, 5 and 5 in four runs (5 had been past the 1 % bound then); the
    # uplink's 5 % unrepaired would be twice the bound.
    assert len(silent) / slots <= down_lost + 0.025, (silent, down_lost)
    assert len(edge_gaps) <= 0.025 * slots, edge_gaps
