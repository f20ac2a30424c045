"""The per-token ledger of the relay's flows: counts, caps and who yields a pending slot."""

from __future__ import annotations

from firsthop.services.relay.token_ledger import TokenLedger


def test_the_fullest_tokens_oldest_pending_flow_yields_to_a_token_holding_fewer() -> None:
    ledger: TokenLedger[str] = TokenLedger(max_pending=4, max_established=4)
    for flow in ("a1", "a2", "a3"):
        ledger.add_pending(b"A", flow)
    for flow in ("b1", "b2"):
        ledger.add_pending(b"B", flow)
    assert ledger.victim(b"new") == "a1"  # A holds the most
    assert ledger.victim(b"B") == "a1"  # B holds fewer than A
    assert ledger.victim(b"A") is None  # nobody holds more than A
    ledger.remove_pending(b"A", "a1")
    assert ledger.victim(b"B") is None  # 2 and 2: no fairer choice
    assert ledger.victim(b"new") == "b1"  # a tie: the token that got to 2 first (B)


def test_counts_follow_adds_and_removes() -> None:
    ledger: TokenLedger[str] = TokenLedger(max_pending=2, max_established=2)
    ledger.add_pending(b"A", "p")
    ledger.add_established(b"A", "e")
    assert (ledger.pending_count(b"A"), ledger.established(b"A")) == (1, ["e"])
    assert sorted(ledger.flows_of(b"A")) == ["e", "p"] and ledger.tokens == 1
    ledger.remove_pending(b"A", "p")
    ledger.remove_pending(b"A", "p")  # twice: no harm
    ledger.remove_established(b"A", "e")
    assert ledger.pending_count(b"A") == 0 and ledger.tokens == 0 and ledger.victim(b"B") is None
