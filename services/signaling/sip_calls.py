"""Phone calls waiting for their app's word, shared by the signaling replicas: `SipCalls`.

With `--sip-webhook` (OpenAI's SIP flow), a call that comes in rings on the replica its trunk
reached, which holds its SIP dialog, and the app decides on it with `accept`, `reject` or
`refer` on `/v1/realtime/calls/{call_id}/...`, through whichever replica its request reaches.
So what the app said goes through here: `firsthop:sipcall:{call_id}` (a hash in Redis, or
memory without), written by the deciding replica, read by the ringing one (`sip.py` looks
every `DECISION_POLL` while the call rings, and once a `call_poll_interval` after).

States: `ringing` -> `accepted` (the deciding replica is placing the call) -> `answered` (it
is placed: `answer` holds the SDP for the 200 OK), or -> `rejected` (`status`), or -> `ended`
(the trunk cancelled, the ring timed out: a late accept finds no call). Each move is one
atomic compare-and-set, so an accept racing a CANCEL has one winner. `refer` is a transfer
target the ringing replica sends its REFER for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from firsthop.services.signaling.stores import HashStore, StoreUnavailable
from firsthop.shared.redis_store import CALL_TTL, PREFIX

# s: a record that rings (or was rejected, or ended) outlives any ring (60 s) and an accept
# placing it (60 s more at most), and no more: one its ringing replica could not delete (Redis
# down as the call ended) must not be accepted much later, for a session nobody would end
RING_TTL = 300
# an answered call's lives as long as the longest session could (a transfer asked of a call
# up for hours must find it), renewed by each move from then on
ANSWERED_TTL = CALL_TTL
DECISION_POLL = 0.1  # s: how often a ringing call looks for its app's decision
STATES = ("ringing", "accepted", "answered", "rejected", "ended")

# One atomic move: the record is in `from` state (ARGV[1]) -> it takes the fields given.
MOVE = """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


def sipcall_key(call_id: str) -> str:
    return f"{PREFIX}sipcall:{call_id}"


@dataclass
class PhoneRecord:
    call_id: str
    offer: str  # the trunk's SDP
    trunk: str
    source: str  # the trunk's address (its signaling)
    uri: str  # the INVITE's Request-URI
    state: str = "ringing"
    answer: str = ""
    status: int = 0
    refer: str = ""

    def fields(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items() if k != "call_id"}

    @classmethod
    def from_fields(cls, call_id: str, fields: dict[str, str]) -> PhoneRecord | None:
        try:
            return cls(
                call_id=call_id,
                offer=fields["offer"],
                trunk=fields["trunk"],
                source=fields["source"],
                uri=fields["uri"],
                state=fields["state"],
                answer=fields.get("answer", ""),
                status=int(fields.get("status", "0") or 0),
                refer=fields.get("refer", ""),
            )
        except (KeyError, ValueError):
            return None


class SipCalls(HashStore):
    async def put(self, record: PhoneRecord) -> None:
        key = sipcall_key(record.call_id)
        await self._write(key, record.fields(), _ttl(record.state), record.call_id, record)

    async def get(self, call_id: str, *, strict: bool = False) -> PhoneRecord | None:
        """The call's record, or None: unknown, expired, or (unless `strict`: then
        StoreUnavailable) Redis could not be asked."""
        fields = await self._read(sipcall_key(call_id), strict=strict)
        if fields is not None:
            return PhoneRecord.from_fields(call_id, fields)
        found: PhoneRecord | None = self._memory.get(call_id)
        return found

    async def move(self, call_id: str, frm: str, **fields: str | int) -> bool:
        """`call_id` from state `frm` to what `fields` say (a `state` among them), at once
        and only if it is still in `frm`: False if it is not (or is unknown). Its TTL is
        the new state's, from now."""
        ttl = _ttl(str(fields.get("state", frm)))
        if self.link is not None:
            flat = [str(v) for pair in fields.items() for v in pair]
            key = sipcall_key(call_id)
            try:
                moved = await self.link.run(lambda c: c.eval(MOVE, 1, key, frm, ttl, *flat))
                return bool(moved)
            except StoreUnavailable:
                pass
        record: PhoneRecord | None = self._memory.get(call_id)
        if record is None or record.state != frm:
            return False
        for name, value in fields.items():
            setattr(record, name, value)
        self._memory.set(call_id, record, ttl)
        return True

    async def delete(self, call_id: str) -> None:
        await self._delete(sipcall_key(call_id), call_id)


def _ttl(state: str) -> int:
    return ANSWERED_TTL if state == "answered" else RING_TTL
