"""One call's failure ends that call only: an exception injected at each stage of a call, in a
real transceiver process (`tests/faults/sitecustomize.py` makes one function per stage raise
for calls named ``boom-<stage>``), while a bystander call on the same transceiver goes on.

Before, whatever a session raised that it did not expect (the `ValueError` of an agent link
whose opening failed, for one) left its task, ended the transceiver's sessions nursery, and
every call on the process dropped with it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from firsthop.services.call.caller import Caller, ToneTrack
from tests.integration.test_transceiver import event_count, hears
from tests.support import AgentProcess, TransceiverProcess, eventually, wait_until

FAULTS = Path(__file__).parent.parent / "faults"
BYSTANDER_TONE, TONE = 440.0, 700.0


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    process = AgentProcess("echo").start()
    yield process
    process.kill()


@pytest.fixture(scope="module")
def tx(agent: AgentProcess) -> Iterator[TransceiverProcess]:
    process = TransceiverProcess("--accept-direct", agent_url=agent.url)
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH")) if p)
    process.spec.env["PYTHONPATH"] = path
    process.start()
    yield process
    process.kill()


def direct(tx: TransceiverProcess) -> list[str]:
    return [f"{tx.media[0]}:{tx.media[1]}"]


async def call(
    tx: TransceiverProcess, call_id: str, *, data_channel: bool = False, connect: bool = True
) -> tuple[Caller, str]:
    tone = ToneTrack(TONE if call_id.startswith("boom") else BYSTANDER_TONE)
    caller = Caller(tone, data_channel=data_channel)
    created: dict[str, str] = {}

    async def signal(offer: str) -> str:
        status, body = await asyncio.to_thread(
            tx.create_session, offer, direct(tx), call_id=call_id
        )
        assert status == 201, body
        created.update(body)
        return str(body["answer_sdp"])

    await caller.start(signal)
    if connect:
        await asyncio.wait_for(caller.wait_connected(), 10)
    return caller, created["session_id"]


def alive(tx: TransceiverProcess) -> bool:
    return tx.proc is not None and tx.proc.poll() is None


def links_to(port: int) -> int:
    """TCP connections established to `port` on loopback (the transceiver's agent links)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if row[3] == "01" and int(row[2].split(":")[1], 16) == port)


@pytest.mark.timeout(60)
def test_a_link_that_opens_as_its_call_ends_is_closed(
    tx: TransceiverProcess, agent: AgentProcess
) -> None:
    """The agent link's connect finishes in the tick the call ends: the session is cancelled
    while it waits for the answer, although the link is open. It is told goodbye and closed,
    not left open to an agent that goes on talking to a call that is over. (First in this
    module: no other call's link may come and go while it counts.)"""
    port = agent.port
    wait_until(lambda: links_to(port) == 0)

    async def main() -> dict[str, str]:
        caller, session_id = await call(tx, "race-connect-1", connect=False)
        reason: dict[str, str] = await asyncio.to_thread(tx.end_reason, session_id, 15)
        await caller.close()
        return reason

    assert asyncio.run(main())["reason"] == "connection_closed"  # (the hook ends the session)
    wait_until(lambda: links_to(port) == 0, 10)
    assert alive(tx)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stage", ["agent_connect", "agent", "media", "events"])
def test_a_call_that_raises_mid_call_ends_alone(tx: TransceiverProcess, stage: str) -> None:
    before = event_count(tx, f"session_error_{stage}")

    async def main() -> tuple[list[str], bool]:
        bystander, _ = await call(tx, f"calm-{stage}")
        await eventually(lambda: hears(bystander, BYSTANDER_TONE), 10)
        # (one whose agent cannot be connected ends before its caller has connected)
        events = stage == "events"
        faulty, session_id = await call(tx, f"boom-{stage}-1", data_channel=events, connect=events)
        if events:
            channel = faulty.channel
            assert channel is not None
            await eventually(lambda: channel.readyState == "open", 5)
            channel.send(json.dumps({"type": "hello"}))
        reason = await asyncio.to_thread(tx.end_reason, session_id, 15)
        assert reason["reason"] == "session_error", reason
        told = [m for m in faulty.result.events if isinstance(m, str)]
        mark = len(bystander.result.received)
        await eventually(lambda: hears(bystander, BYSTANDER_TONE, since=mark), 10)
        still = bystander.pc.connectionState == "connected"
        await bystander.close()
        await faulty.close()
        return told, still

    told, bystander_connected = asyncio.run(main())
    assert alive(tx)
    assert bystander_connected
    wait_until(lambda: event_count(tx, f"session_error_{stage}") == before + 1)
    if stage == "events":  # its data channel was open: it was told why
        states = [json.loads(m) for m in told]
        assert {"type": "call.state", "state": "failed", "reason": "session_error"} in states


@pytest.mark.timeout(120)
def test_setup_and_close_failures_end_only_their_call(tx: TransceiverProcess) -> None:
    setup_before = event_count(tx, "session_error_setup")
    close_before = event_count(tx, "session_error_close")

    async def main() -> None:
        bystander, _ = await call(tx, "calm-setup-close")
        await eventually(lambda: hears(bystander, BYSTANDER_TONE), 10)
        # setup: the internal API answers 500 (signaling tries another transceiver)
        offer_caller = Caller()
        statuses: list[tuple[int, dict[str, str]]] = []

        async def signal(offer: str) -> str:
            got = await asyncio.to_thread(
                tx.create_session, offer, direct(tx), call_id="boom-setup-1"
            )
            statuses.append(got)
            raise ConnectionError("refused")

        with pytest.raises(ConnectionError):
            await offer_caller.start(signal)
        await offer_caller.close()
        assert statuses[0][0] == 500 and statuses[0][1] == {"error": "session setup failed"}
        # close: the agent codec's goodbye and the peer connection's close both raise
        closing, session_id = await call(tx, "boom-close-1")
        status, _ = await asyncio.to_thread(
            tx.request, "DELETE", f"/internal/v1/sessions/{session_id}"
        )
        assert status == 204
        reason = await asyncio.to_thread(tx.end_reason, session_id, 10)
        assert reason["reason"] == "deleted"
        mark = len(bystander.result.received)
        await eventually(lambda: hears(bystander, BYSTANDER_TONE, since=mark), 10)
        await closing.close()
        await bystander.close()

    asyncio.run(main())
    assert alive(tx)
    wait_until(lambda: event_count(tx, "session_error_setup") == setup_before + 1)
    wait_until(lambda: event_count(tx, "session_error_close") == close_before + 1)
    assert event_count(tx, "session_errors") >= 2
