"""`Problem`: an HTTP-shaped failure (status, reason, extra headers) raised by any layer.

The HTTP routes turn it into ``{"error": reason}`` with its status and headers; the
WebSocket turns it into ``{"type": "error", "code": status, "message": reason}``. Client
mistakes are 4xx; "try again later" is 503 (or 429) with ``Retry-After``. Nothing that a
client sends may surface as a 500.
"""

from __future__ import annotations

import math


class Problem(Exception):
    def __init__(self, status: int, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        if self.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="firsthop"'
        return headers

    def __repr__(self) -> str:
        return f"Problem({self.status}, {self.reason!r})"
