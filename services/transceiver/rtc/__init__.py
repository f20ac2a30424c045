"""The asyncio boundary: the only package of firsthop that imports asyncio, aiortc or aioice.

* `bridge`: Trio as a guest of the asyncio host loop, and the calls between the two;
* `hooks`: every private aiortc/aioice attribute firsthop touches (the DTLS ones in
  `dtls_hooks`, the SCTP ones in `sctp_hooks`), with the pinned-version check;
* `lite_connection`: the ICE connection aiortc's transports run on (DTLS only; the session
  table's `LiteIce` is the one ICE agent);
* `session`: one call's peer connection (`RtcSession`), for offer/answer, DTLS and the data
  channel, and the I/O of its media core (`media/core.py`), reporting through callbacks;
* `media_io`: the I/O of a call's media core (`MediaIo`), shared by both kinds of call;
* `plain_rtp`: one phone call's media (`PlainRtpSession`): plain RTP as a SIP trunk offers
  it, no aiortc at all;
* `media_clock`: one timer for every call's media core;
* `agent_link`: the WebSocket to an agent, on the host loop (the protocol spoken over it is
  `services/transceiver/agents/`' business).
"""

from firsthop.services.transceiver.rtc.agent_link import AgentLink, AgentLinkError
from firsthop.services.transceiver.rtc.bridge import (
    call_asyncio,
    gather_counts,
    run_trio_guest,
    watch_readable,
    work_left,
)
from firsthop.services.transceiver.rtc.hooks import check_pinned_versions, hook_points
from firsthop.services.transceiver.rtc.media_clock import around_ticks
from firsthop.services.transceiver.rtc.media_io import Milestone, SessionCallbacks
from firsthop.services.transceiver.rtc.plain_rtp import PlainRtpSession
from firsthop.services.transceiver.rtc.session import RtcSession

__all__ = [
    "AgentLink",
    "AgentLinkError",
    "Milestone",
    "PlainRtpSession",
    "RtcSession",
    "SessionCallbacks",
    "around_ticks",
    "call_asyncio",
    "check_pinned_versions",
    "gather_counts",
    "hook_points",
    "run_trio_guest",
    "watch_readable",
    "work_left",
]
