"""Per route token: its pending and established flows, and fair shares of the pending pool.

Why: anyone holding a valid route token can open flows with it from any source address, and
source addresses are cheap to spoof. Per-IP caps do not stop one token (an attacker's own
call, or an ended one) opening a flow from each of 200k spoofed sources; caps per token do.
A real call needs a handful of flows (one per client candidate pair that reaches us, and a
new one when a NAT rebinds), so the caps are small.

Fair sharing: the pending pool (flows waiting for their destination's first answer) is
global and bounded. When it is full, a token may take the slot of the oldest pending flow of
a token that holds more pending flows than it does (max-min fairness). A flood from one
token, or spread over many, cannot then keep a new call from opening its first flow: the
newcomer holds none, so some flood flow always yields.

Pure bookkeeping: the flow table decides, this only counts. Generic over the flow type;
each flow is one hashable object, and the ledger never looks inside it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Hashable)


class TokenLedger(Generic[F]):
    __slots__ = ("max_pending", "max_established", "_pending", "_established", "_holding")

    def __init__(self, max_pending: int, max_established: int) -> None:
        self.max_pending = max_pending
        self.max_established = max_established
        # token -> its flows, oldest first (dicts as ordered sets)
        self._pending: dict[bytes, dict[F, None]] = {}
        self._established: dict[bytes, dict[F, None]] = {}
        # _holding[n]: the tokens holding exactly n pending flows (n >= 1), in the order they
        # got there, so the fullest token is found in at most `max_pending` steps.
        self._holding: list[dict[bytes, None]] = [{} for _ in range(max_pending + 1)]

    # -- pending --------------------------------------------------------------------------

    def pending_count(self, token: bytes) -> int:
        flows = self._pending.get(token)
        return len(flows) if flows else 0

    def add_pending(self, token: bytes, flow: F) -> None:
        flows = self._pending.setdefault(token, {})
        self._move(token, len(flows), len(flows) + 1)
        flows[flow] = None

    def remove_pending(self, token: bytes, flow: F) -> None:
        flows = self._pending.get(token)
        if flows is None or flow not in flows:
            return
        del flows[flow]
        self._move(token, len(flows) + 1, len(flows))
        if not flows:
            del self._pending[token]

    def _move(self, token: bytes, old: int, new: int) -> None:
        if 0 < old < len(self._holding):
            self._holding[old].pop(token, None)
        if 0 < new < len(self._holding):
            self._holding[new][token] = None

    def victim(self, token: bytes) -> F | None:
        """When the pool is full: the oldest pending flow of a token holding the most
        pending flows, if that is more than `token` holds; else None (no fairer choice)."""
        mine = self.pending_count(token)
        for count in range(len(self._holding) - 1, mine, -1):
            holders = self._holding[count]
            if holders:
                fullest = next(iter(holders))
                return next(iter(self._pending[fullest]))
        return None

    # -- established --------------------------------------------------------------------------

    def established(self, token: bytes) -> list[F]:
        flows = self._established.get(token)
        return list(flows) if flows else []

    def add_established(self, token: bytes, flow: F) -> None:
        self._established.setdefault(token, {})[flow] = None

    def remove_established(self, token: bytes, flow: F) -> None:
        flows = self._established.get(token)
        if flows is not None:
            flows.pop(flow, None)
            if not flows:
                del self._established[token]

    # -- both -----------------------------------------------------------------------------------

    def flows_of(self, token: bytes) -> list[F]:
        return [*self._pending.get(token, ()), *self._established.get(token, ())]

    @property
    def tokens(self) -> int:
        return len(self._pending.keys() | self._established.keys())
