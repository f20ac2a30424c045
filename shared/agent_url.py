"""Agent URL schemes: one owner. Signaling checks an agent URL against them, and the
transceiver reads which protocol a URL names and where its WebSocket goes.

``ws://``/``wss://`` is firsthop's own agent protocol, ``realtime+ws(s)://`` a Realtime
backend, ``twilio+ws(s)://`` a Twilio Media Streams bot (docs/architecture.md §8). Pure.
"""

from __future__ import annotations

# URL prefix -> (protocol kind, the WebSocket's own scheme)
SCHEMES: dict[str, tuple[str, str]] = {
    "ws://": ("native", "ws://"),
    "wss://": ("native", "wss://"),
    "realtime+ws://": ("realtime", "ws://"),
    "realtime+wss://": ("realtime", "wss://"),
    "twilio+ws://": ("twilio", "ws://"),
    "twilio+wss://": ("twilio", "wss://"),
}
PREFIXES = tuple(SCHEMES)
TLS_SCHEMES = tuple(p for p, (_, ws) in SCHEMES.items() if ws == "wss://")  # over TLS


def split_agent_url(url: str) -> tuple[str, str] | None:
    """(kind, WebSocket URL) of an agent URL; None if its scheme is not one of ours."""
    for prefix, (kind, ws_scheme) in SCHEMES.items():
        if url.startswith(prefix):
            return kind, ws_scheme + url[len(prefix) :]
    return None
