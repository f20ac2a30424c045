"""A call's media after the DTLS handshake, sans-IO (no socket, trio, asyncio, aiortc, aioice).

* `core`: `CallMedia`, one call's SRTP in and out, jitter buffer, Opus, output clock, RTCP;
* `srtp`: the call's libsrtp sessions, counting what fails to authenticate;
* `jitter`, `opus`, `pacing`: the parts it is built of (the reorder window and loss
  repair, libopus, the agent's output queue).
"""
