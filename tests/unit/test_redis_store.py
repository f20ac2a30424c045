"""The Redis contract: keys, and records that round-trip through their hash form."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared.redis_store import (
    TRANSCEIVERS,
    CallRecord,
    FlowRecord,
    TransceiverInfo,
    call_key,
    flow_key,
    parse_flow_key,
    secret_key,
    trace_key,
    transceiver_key,
)


def test_keys_are_the_documented_ones() -> None:
    assert transceiver_key("tx-1") == "firsthop:transceiver:tx-1"
    assert TRANSCEIVERS == "firsthop:transceivers"
    assert call_key("c") == "firsthop:call:c"
    assert flow_key(("203.0.113.5", 4000)) == "firsthop:flow:203.0.113.5:4000"
    assert flow_key(("2001:db8::1", 4000)) == "firsthop:flow:2001:db8::1:4000"
    assert trace_key("AQEA") == "firsthop:trace:AQEA"
    assert secret_key("s") == "firsthop:secret:s"


def test_a_registry_hash_reads_back_and_bad_ones_are_refused() -> None:
    fields = {
        "api_url": "http://127.0.0.1:8081/",
        "media_addr": "127.0.0.1:5004",
        "region": "a",
        "cluster": "2",
        "sessions": "3",
        "capacity": "200",
        "draining": "1",
    }
    info = TransceiverInfo.from_hash("tx-1", fields)
    assert info == TransceiverInfo(
        id="tx-1",
        api_url="http://127.0.0.1:8081",
        region="a",
        cluster=2,
        media_addr="127.0.0.1:5004",
        sessions=3,
        capacity=200,
        draining=True,
    )
    assert TransceiverInfo.from_hash("tx-1", info.to_hash()) == info
    assert TransceiverInfo.from_hash("x", {**fields, "sessions": "many"}) is None
    assert TransceiverInfo.from_hash("x", {**fields, "api_url": "ftp://x"}) is None
    assert TransceiverInfo.from_hash("x", {"region": "a"}) is None
    # whether it records: said by transceivers that know it; unknown from older ones
    for records in (True, False, None):
        said = TransceiverInfo(id="r", api_url="http://r", region="a", records=records)
        assert TransceiverInfo.from_hash("r", said.to_hash()) == said
        both = TransceiverInfo("r", "http://r", "a", records=records, records_rtp=records)
        assert TransceiverInfo.from_hash("r", both.to_hash()) == both
    assert info.records is None  # (the hash above has no `records`)


def test_a_call_record_round_trips_and_may_lack_the_client_ufrag() -> None:
    record = CallRecord("c1", "tx-1", "http://tx:8081", "s1", "key:abc", "a", 1.5, "ufr")
    assert CallRecord.from_hash("c1", record.to_hash()) == record
    old = {k: v for k, v in record.to_hash().items() if k != "client_ufrag"}
    assert CallRecord.from_hash("c1", old) == CallRecord(
        "c1", "tx-1", "http://tx:8081", "s1", "key:abc", "a", 1.5
    )
    assert CallRecord.from_hash("c1", {**record.to_hash(), "created": "soon"}) is None


@given(
    st.binary(min_size=1, max_size=60),
    st.one_of(
        st.none(), st.tuples(st.sampled_from(["10.0.0.1", "2001:db8::9"]), st.integers(0, 65535))
    ),
)
def test_a_flow_record_round_trips(token: bytes, hop: tuple[str, int] | None) -> None:
    record = FlowRecord(token, hop)
    assert FlowRecord.from_hash(record.to_hash()) == record


def test_a_bad_flow_hash_is_refused() -> None:
    assert FlowRecord.from_hash({b"hop": b""}) is None
    assert FlowRecord.from_hash({b"token": b"t", b"hop": b"no-port"}) is None


@given(
    st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str),
    st.integers(min_value=0, max_value=65535),
)
def test_a_flow_key_names_its_client_back(host: str, port: int) -> None:
    key = flow_key((host, port))
    assert parse_flow_key(key) == (host, port)
    assert parse_flow_key(key.encode()) == (host, port)


@given(st.one_of(st.text(max_size=40), st.binary(max_size=40)))
def test_anything_else_is_no_flow_key(key: str | bytes) -> None:
    client = parse_flow_key(key)  # never raises
    assert client is None or flow_key(client) == (key.decode() if isinstance(key, bytes) else key)


def test_flow_key_look_alikes_are_refused() -> None:
    for key in (
        "firsthop:flow:",
        "firsthop:flow:1.2.3.4",
        "firsthop:flow:1.2.3.4:x",
        "firsthop:flow::80",
        "firsthop:flow:1.2.3.4:65536",
        "firsthop:call:1.2.3.4:80",
    ):
        assert parse_flow_key(key) is None, key
