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
from firsthop.shared.redis_store import PREFIX

SIPCALL_TTL = 3600  # s: the record outlives any ring (60 s) and most calls; refreshed on use
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
        await self._write(key, record.fields(), SIPCALL_TTL, record.call_id, record)

    async def get(self, call_id: str) -> PhoneRecord | None:
        fields = await self._read(sipcall_key(call_id))
        if fields is not None:
            return PhoneRecord.from_fields(call_id, fields)
        found: PhoneRecord | None = self._memory.get(call_id)
        return found

    async def move(self, call_id: str, frm: str, **fields: str | int) -> bool:
        """`call_id` from state `frm` to what `fields` say (a `state` among them), at once
        and only if it is still in `frm`: False if it is not (or is unknown)."""
        if self.link is not None:
            flat = [str(v) for pair in fields.items() for v in pair]
            key = sipcall_key(call_id)
            try:
                moved = await self.link.run(lambda c: c.eval(MOVE, 1, key, frm, SIPCALL_TTL, *flat))
                return bool(moved)
            except StoreUnavailable:
                pass
        record: PhoneRecord | None = self._memory.get(call_id)
        if record is None or record.state != frm:
            return False
        for name, value in fields.items():
            setattr(record, name, value)
        return True

    async def delete(self, call_id: str) -> None:
        await self._delete(sipcall_key(call_id), call_id)
