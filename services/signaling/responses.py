"""Response shapes every signaling route family shares: JSON bodies, and a call's answer."""

from __future__ import annotations

import json
from typing import Any

from quart import Response

from firsthop.shared.redis_store import CallRecord


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def answer_response(answer: str, record: CallRecord, location: str) -> Response:
    """201 with the SDP answer, `Location` (the call's URL), and which transceiver and region
    carry the call (the demo page and `firsthop call` show them)."""
    resp = Response(answer, status=201, content_type="application/sdp")
    resp.headers["Location"] = location
    resp.headers["X-Firsthop-Transceiver"] = record.transceiver_id
    resp.headers["X-Firsthop-Region"] = record.region
    return resp
