"""Trickle ICE at signaling: check, count and cap candidates; only ICE restarts go further.

Why: the transceiver is an ICE-lite agent (RFC 8445 §2.5): it never sends a connectivity
check, so a caller's trickled candidates are of no use to it — it counted them and dropped
them. Forwarding them cost a request to its internal API per PATCH or WebSocket ``candidate``
message: a caller trickling 1000 candidates a second drove the transceiver to 650-880 requests
a second (77 % of a core). Only an ICE restart (new ``a=ice-ufrag`` / ``a=ice-pwd``, RFC 9725
§4.3) needs the transceiver: it answers with new server credentials.

Strategy: `parse_fragment` checks an application/trickle-ice-sdpfrag (or one WebSocket
candidate) and says 400 why when it is malformed. `TricklePolicy` then, per call: a token
bucket for trickle messages (PATCH and WebSocket ``candidate``), a slower one for ICE
restarts, and a budget of `max_candidates` candidates for the call's life — each refusal a 429
with ``Retry-After``. A fragment whose credentials are the call's current ones (WHIP clients
send them with every trickle) is plain trickle, answered here (204); new ones are a restart.
The buckets live in this replica's memory (bounded, like every `RateLimiter`): with N
replicas a call may trickle N times as much, none of it reaching a transceiver.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.ratelimit import RateLimit, RateLimiter
from firsthop.shared.redis_store import CALL_TTL
from firsthop.shared.sdp import ICE_PWD, ICE_UFRAG, classify_candidate, sdpfrag_credentials

MAX_CANDIDATES = 100  # per call; a browser gathers a handful (host, srflx, relay per family)
MESSAGES = RateLimit(10.0, 40)  # trickle messages per call: ICE gathering is a short burst
RESTARTS = RateLimit(0.5, 3)  # ICE restarts per call (a network change), forwarded


@dataclass(frozen=True)
class Fragment:
    ufrag: str | None
    pwd: str | None
    candidates: tuple[str, ...]

    def restarts(self, current_ufrag: str) -> bool:
        """New credentials: an ICE restart. The current ones: plain trickle. When the call's
        are not known (a record from before signaling kept them), the transceiver decides."""
        return self.ufrag is not None and self.ufrag != current_ufrag

    def credentials(self) -> bytes:
        """What the transceiver needs of a restart (it has no use for the candidates)."""
        return f"a=ice-ufrag:{self.ufrag}\r\na=ice-pwd:{self.pwd}\r\n".encode()


def parse_fragment(frag: str) -> Fragment:
    """A trickle-ice-sdpfrag body, checked (Problem 400 with the reason)."""
    ufrag, pwd, candidates = sdpfrag_credentials(frag)
    if not ufrag and not pwd:
        ufrag = pwd = None  # plain trickle
    elif not ufrag or not pwd:
        raise Problem(400, "an ICE restart needs both a=ice-ufrag and a=ice-pwd")
    elif not ICE_UFRAG.match(ufrag) or not ICE_PWD.match(pwd):
        raise Problem(400, "malformed a=ice-ufrag or a=ice-pwd (RFC 8839 §5.4)")
    if len(candidates) > MAX_CANDIDATES:  # (more than a call may ever trickle: not classified)
        raise Problem(429, f"more than {MAX_CANDIDATES} candidates in one sdpfrag")
    for candidate in candidates:
        check_candidate(candidate)
    return Fragment(ufrag, pwd, tuple(candidates))


def check_candidate(candidate: str) -> None:
    """400 unless `candidate` (after ``a=``) reads as an RFC 8839 §5.1 candidate."""
    if classify_candidate(candidate) == "malformed":
        raise Problem(400, f"malformed candidate {candidate[:60]!r}")


class TricklePolicy:
    def __init__(
        self,
        *,
        messages: RateLimit = MESSAGES,
        restarts: RateLimit = RESTARTS,
        max_candidates: int = MAX_CANDIDATES,
        refused: Counter[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.messages = RateLimiter(messages, clock)
        self.restarts = RateLimiter(restarts, clock)
        self.max_candidates = max_candidates
        # A bucket that refills over a call's longest life: a cap on the call's candidates.
        self.candidates = RateLimiter(RateLimit(max_candidates / CALL_TTL, max_candidates), clock)
        self.refused = refused if refused is not None else Counter()

    def admit(self, call_id: str, frag: Fragment, *, restart: bool) -> None:
        """Spend what `frag` costs the call, or raise Problem 429."""
        limiter, scope, what = (
            (self.restarts, "restart", "ICE restarts")
            if restart
            else (self.messages, "trickle", "trickle messages")
        )
        retry = limiter.check(call_id)
        if retry:
            self._refuse(scope, f"too many {what} for this call", retry)
        count = len(frag.candidates)
        if count > self.max_candidates > 0:
            self._refuse("candidates", f"at most {self.max_candidates} candidates per call")
        if count and (retry := self.candidates.check(call_id, count)):
            self._refuse("candidates", f"at most {self.max_candidates} candidates per call", retry)

    def _refuse(self, scope: str, reason: str, retry_after: float | None = None) -> None:
        self.refused[scope] += 1
        raise Problem(429, reason, retry_after=retry_after)
