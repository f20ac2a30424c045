"""What every signaling route handler works with (`create_app`, `realtime_api`, `ws`): one
module of its own, so the route modules import it and not each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from firsthop.services.signaling.auth import Authenticator
from firsthop.services.signaling.bodies import Bodies
from firsthop.services.signaling.calls import Calls, Stats
from firsthop.services.signaling.client_address import ClientAddresses
from firsthop.services.signaling.config import SignalingConfig
from firsthop.services.signaling.ratelimit import RateLimiter, Slots
from firsthop.services.signaling.sip_calls import SipCalls
from firsthop.services.signaling.stores import EkSessions
from firsthop.services.signaling.transceivers import DOWNLOADS_PER_KEY, RECORDING_DOWNLOADS


@dataclass
class Context:
    config: SignalingConfig
    auth: Authenticator
    calls: Calls
    ip_limiter: RateLimiter
    key_limiter: RateLimiter
    stats: Stats
    bodies: Bodies
    ek_sessions: EkSessions = field(default_factory=lambda: EkSessions(None))
    clients: ClientAddresses = field(default_factory=ClientAddresses)
    phones: SipCalls = field(default_factory=lambda: SipCalls(None))  # ringing phone calls
    # recordings being streamed, by API key (a tenant): the download pool's connections
    downloads: Slots = field(default_factory=lambda: Slots(RECORDING_DOWNLOADS, DOWNLOADS_PER_KEY))
