"""The transceiver internal API client (§7): httpx on Trio (via anyio), one pooled client.

Transport errors are translated once, here, into a small hierarchy::

    TransceiverError          the request did not produce a usable answer
     ├── TransceiverDown      connection refused/reset, timeout, 5xx, 401 (misconfigured
     │                        token): worth trying another transceiver
     └── TransceiverRejected  a 4xx about the request itself (bad offer): not worth retrying

Every request carries ``Authorization: Bearer <internal token>`` when one is configured, and
session creation carries the call's W3C ``traceparent``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

SDPFRAG = "application/trickle-ice-sdpfrag"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
CREATE_TIMEOUT = 10.0  # aiortc builds the answer (certificates, codecs): well under this
CONNECT_TIMEOUT = 1.0
SMALL_TIMEOUT = 3.0
RECORDING_TIMEOUT = 30.0  # between two chunks of a recording (it is streamed)
RECORDING_TYPES = ("audio/ogg", "audio/wav")  # Ogg/Opus; a G.711 phone call's WAVE
RECORDING_CHUNK = 1 << 16
RECORDING_DOWNLOADS = 32  # recordings streamed at once (their own pool; past it, 503) ...
DOWNLOADS_PER_KEY = 4  # ... and by one API key (its secrets and ephemeral keys with it; 429)


class TransceiverError(Exception):
    def __init__(self, status: int | None, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class TransceiverDown(TransceiverError):
    pass


class TransceiverRejected(TransceiverError):
    pass


def new_traceparent(incoming: str | None = None) -> str:
    """W3C trace context: keep an incoming valid trace id, always a new span id."""
    trace_id = os.urandom(16).hex()
    if incoming:
        m = TRACEPARENT.match(incoming.strip().lower())
        if m and m.group(1) != "0" * 32:
            trace_id = m.group(1)
    return f"00-{trace_id}-{os.urandom(8).hex()}-01"


@dataclass(frozen=True)
class RecordingBody:
    """A finished recording, as its transceiver streams it."""

    chunks: AsyncIterator[bytes]
    length: str | None  # its Content-Length, if it said
    media_type: str  # one of RECORDING_TYPES


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


def reason_of(status: int, body: bytes) -> str:
    """The ``error`` of a transceiver's JSON error body, or a stand-in."""
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, str):
            return error
    except ValueError:
        pass
    return f"transceiver answered {status}"


def _reason(resp: httpx.Response) -> str:
    return reason_of(resp.status_code, resp.content)


class TransceiverClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        internal_token: str | None,
        downloads: httpx.AsyncClient | None = None,
    ) -> None:
        self.http = http
        # Recordings stream for as long as their reader reads: on a pool of their own
        # (`downloads`), so slow downloads never hold the connections placement needs.
        self.downloads = downloads or http
        self._auth = {"Authorization": f"Bearer {internal_token}"} if internal_token else {}

    async def _request(
        self,
        method: str,
        url: str,
        *,
        limit: float,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        try:
            return await self.http.request(
                method,
                url,
                headers={**self._auth, **(headers or {})},
                content=content,
                timeout=httpx.Timeout(limit, connect=CONNECT_TIMEOUT),
            )
        except httpx.HTTPError as exc:
            raise TransceiverDown(None, f"{type(exc).__name__}: {exc}") from exc

    async def create_session(
        self,
        api_url: str,
        *,
        call_id: str,
        offer_sdp: str,
        ingress: list[str],
        agent_url: str | None,
        region: str,
        traceparent: str,
        session: dict[str, Any] | None = None,
        ingress_tcp: list[str] | None = None,
        media: str = "webrtc",
        record: bool = False,
    ) -> tuple[str, str]:
        """(session_id, answer_sdp). `session`: the caller's OpenAI session config (calls
        placed through /v1/realtime), which the transceiver gives a Realtime backend;
        `media` "rtp": a phone call (the offer is a SIP trunk's plain RTP one)."""
        fields: dict[str, Any] = {
            "call_id": call_id,
            "offer_sdp": offer_sdp,
            "ingress": ingress,
            "agent_url": agent_url,
            "region": region,
        }
        if session is not None:
            fields["session"] = session
        if ingress_tcp:
            fields["ingress_tcp"] = ingress_tcp
        if media != "webrtc":
            fields["media"] = media
        if record:
            fields["record"] = True
        body = json.dumps(fields).encode()
        resp = await self._request(
            "POST",
            f"{api_url}/internal/v1/sessions",
            limit=CREATE_TIMEOUT,
            headers={"Content-Type": "application/json", "traceparent": traceparent},
            content=body,
        )
        if resp.status_code >= 500 or resp.status_code in (401, 403, 404, 429):
            raise TransceiverDown(resp.status_code, _reason(resp))
        if resp.status_code >= 400:
            raise TransceiverRejected(resp.status_code, _reason(resp))
        try:
            data = resp.json()
            session_id, answer = data["session_id"], data["answer_sdp"]
        except (ValueError, KeyError, TypeError):
            raise TransceiverDown(resp.status_code, "malformed transceiver reply") from None
        if not isinstance(session_id, str) or not isinstance(answer, str):
            raise TransceiverDown(resp.status_code, "malformed transceiver reply")
        return session_id, answer

    async def patch_session(self, api_url: str, session_id: str, frag: bytes) -> Reply:
        """Forward a trickle-ice-sdpfrag; 404 means the session is gone."""
        resp = await self._request(
            "PATCH",
            f"{api_url}/internal/v1/sessions/{session_id}",
            limit=SMALL_TIMEOUT,
            headers={"Content-Type": SDPFRAG},
            content=frag,
        )
        if resp.status_code >= 500 or resp.status_code == 401:
            raise TransceiverDown(resp.status_code, _reason(resp))
        return Reply(resp.status_code, resp.headers.get("content-type", ""), resp.content)

    async def recording(self, api_url: str, call_id: str) -> tuple[int, RecordingBody | None]:
        """(status, body) of a call's recording on its transceiver: the body streamed (a long
        call's file is big; nothing of it is held whole), None unless 200."""
        request = self.downloads.build_request(
            "GET",
            f"{api_url}/internal/v1/recordings/{quote(call_id, safe='')}",
            headers=self._auth,
            timeout=httpx.Timeout(RECORDING_TIMEOUT, connect=CONNECT_TIMEOUT),
        )
        try:
            resp = await self.downloads.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise TransceiverDown(None, f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            await resp.aclose()
            if resp.status_code >= 500 or resp.status_code in (401, 403):
                raise TransceiverDown(resp.status_code, "the recording could not be read")
            return resp.status_code, None

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_bytes(RECORDING_CHUNK):
                    yield chunk
            finally:
                await resp.aclose()

        media_type = resp.headers.get("content-type", "").split(";")[0].strip()
        if media_type not in RECORDING_TYPES:
            media_type = "application/octet-stream"
        return 200, RecordingBody(body(), resp.headers.get("content-length"), media_type)

    async def delete_session(self, api_url: str, session_id: str) -> int:
        resp = await self._request(
            "DELETE", f"{api_url}/internal/v1/sessions/{session_id}", limit=SMALL_TIMEOUT
        )
        if resp.status_code >= 500 or resp.status_code == 401:
            raise TransceiverDown(resp.status_code, _reason(resp))
        return resp.status_code

    async def sessions_ended(self, api_url: str, session_ids: list[str]) -> dict[str, str]:
        """Which of `session_ids` have ended, and why (one request for many calls)."""
        resp = await self._request(
            "POST",
            f"{api_url}/internal/v1/sessions/ended",
            limit=SMALL_TIMEOUT,
            headers={"Content-Type": "application/json"},
            content=json.dumps({"ids": session_ids}).encode(),
        )
        if resp.status_code != 200:
            raise TransceiverDown(resp.status_code, _reason(resp))
        try:
            ended = resp.json()["ended"]
        except (ValueError, KeyError, TypeError):
            raise TransceiverDown(resp.status_code, "malformed transceiver reply") from None
        if not isinstance(ended, dict):
            raise TransceiverDown(resp.status_code, "malformed transceiver reply")
        return {str(k): str(v) for k, v in ended.items() if k in session_ids}

    async def session_alive(self, api_url: str, session_id: str) -> str | None:
        """The cheap liveness probe: an empty trickle PATCH. None while the session lives
        (204); once it is gone (404), why it ended, as the transceiver remembers it (drain,
        agent, consent, ...) or "session_ended"."""
        reply = await self.patch_session(api_url, session_id, b"")
        if reply.status == 404:
            try:
                reason = json.loads(reply.body).get("reason")
            except (ValueError, AttributeError):
                reason = None
            return str(reason) if reason else "session_ended"
        if reply.status >= 400:
            raise TransceiverDown(reply.status, f"probe answered {reply.status}")
        return None
