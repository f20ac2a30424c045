"""The transceiver's Opus decoder (libopus through ctypes): decoding, concealment, in-band FEC;
and a packet's duration read from its TOC (RFC 6716 §3.1), against libopus's."""

from __future__ import annotations

import ctypes
import fractions
import math
from collections.abc import Callable

import numpy as np
import pytest
from av import AudioFrame, CodecContext
from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.transceiver.media import codecs, opus
from firsthop.services.transceiver.media.frames import FRAME_SAMPLES
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusError

RATE = 48000


def tone(n: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(n * FRAME_SAMPLES) / RATE
    return (8000 * np.sin(2 * math.pi * freq * t)).astype(np.int16)


def encode(pcm: np.ndarray, fec: bool) -> list[bytes]:
    codec = CodecContext.create("libopus", "w")
    codec.bit_rate = 32000
    codec.format = "s16"
    codec.layout = "mono"
    codec.sample_rate = RATE
    codec.time_base = fractions.Fraction(1, RATE)
    options = {"application": "voip", "frame_duration": "20"}
    if fec:
        options |= {"fec": "1", "packet_loss": "20"}
    codec.options = options
    packets: list[bytes] = []
    for i in range(len(pcm) // FRAME_SAMPLES):
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES].tobytes())
        frame.pts = i * FRAME_SAMPLES
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        packets += [bytes(p) for p in codec.encode(frame)]
    return packets


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype=np.int16).astype(np.float64)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x**2)))


def test_decodes_a_tone_to_20_ms_of_mono_at_its_level() -> None:
    packets = encode(tone(20), fec=False)
    decoder = OpusDecoder()
    out = [decoder.decode(p) for p in packets]
    assert all(len(pcm) == FRAME_SAMPLES * 2 for pcm in out)
    level = rms(samples(b"".join(out[5:])))
    assert 0.8 < level / (8000 / math.sqrt(2)) < 1.2


def test_a_lost_frame_is_concealed_not_a_hole() -> None:
    packets = encode(tone(20), fec=False)
    decoder = OpusDecoder()
    for p in packets[:10]:
        decoder.decode(p)
    concealed = samples(decoder.conceal())
    assert len(concealed) == FRAME_SAMPLES
    assert rms(concealed) > 0.3 * 8000 / math.sqrt(2)  # the tone carries on, if fading
    decoder.decode(packets[11])  # and decoding goes on after it


def test_in_band_fec_of_the_next_packet_recovers_the_lost_frame_better_than_concealment() -> None:
    pcm = tone(40, freq=300.0) + tone(40, freq=1700.0) // 2  # something to get wrong
    packets = encode(pcm, fec=True)
    lost = 25

    def run(repair: str) -> np.ndarray:
        decoder = OpusDecoder()
        out: list[bytes] = []
        for i, p in enumerate(packets):
            if i == lost:
                if repair == "fec":
                    pcm, from_fec = decoder.recover(packets[i + 1])
                    assert from_fec  # the packet after carries LBRR
                    out.append(pcm)
                else:
                    out.append(decoder.conceal())
            else:
                out.append(decoder.decode(p))
        return samples(out[lost])

    reference = samples(b"".join(OpusDecoder().decode(p) for p in packets))
    want = reference[lost * FRAME_SAMPLES : (lost + 1) * FRAME_SAMPLES]
    fec_error = rms(run("fec") - want)
    plc_error = rms(run("plc") - want)
    assert fec_error < 0.5 * plc_error, (fec_error, plc_error)


def test_bad_input_is_an_error_not_a_crash() -> None:
    decoder = OpusDecoder()
    with pytest.raises(OpusError):
        decoder.decode(b"")
    with pytest.raises(OpusError):
        decoder.decode(b"\xff" * 3)  # code 3 with a frame count of 0: invalid
    assert len(decoder.decode(encode(tone(1), fec=False)[0])) == FRAME_SAMPLES * 2


def test_without_fec_in_the_next_packet_recovery_is_concealment() -> None:
    packets = encode(tone(10), fec=False)
    decoder = OpusDecoder()
    for p in packets[:5]:
        decoder.decode(p)
    pcm, from_fec = decoder.recover(packets[6])
    assert not from_fec and len(pcm) == FRAME_SAMPLES * 2


def test_the_agents_encoder_delays_its_voice_by_2_5_ms_not_voips_6_5() -> None:
    from firsthop.services.transceiver.media.codecs import OPUS_BITRATE
    from firsthop.services.transceiver.media.opus import APPLICATION_VOIP, OpusEncoder

    encoder = OpusEncoder(OPUS_BITRATE)
    assert encoder.lookahead == RATE * 25 // 10_000  # 2.5 ms
    assert OpusEncoder(OPUS_BITRATE, APPLICATION_VOIP).lookahead == RATE * 65 // 10_000
    # a tone that starts after 100 ms of silence is heard that much later, at its level
    pcm = np.concatenate([np.zeros(5 * FRAME_SAMPLES, np.int16), tone(10)])
    decoder = OpusDecoder()
    out = samples(
        b"".join(
            decoder.decode(encoder.encode(pcm[i : i + FRAME_SAMPLES].tobytes()))
            for i in range(0, len(pcm), FRAME_SAMPLES)
        )
    )
    onset = int(np.argmax(np.abs(out) > 1000)) - 5 * FRAME_SAMPLES
    assert encoder.lookahead <= onset <= encoder.lookahead + RATE // 2000  # + the tone's rise
    heard = out[8 * FRAME_SAMPLES :]
    assert abs(20 * math.log10(rms(heard) / rms(tone(7).astype(np.float64)))) < 1.0


def test_the_agents_encoder_runs_at_the_chosen_complexity_and_refuses_a_bad_one() -> None:
    from firsthop.services.transceiver.media.codecs import OPUS_BITRATE
    from firsthop.services.transceiver.media.opus import COMPLEXITY, OpusEncoder

    assert OpusEncoder(OPUS_BITRATE).complexity == COMPLEXITY == 6
    assert OpusEncoder(OPUS_BITRATE, complexity=10).complexity == 10
    for bad in (-1, 11):
        with pytest.raises(OpusError, match="OPUS_SET_COMPLEXITY"):
            OpusEncoder(OPUS_BITRATE, complexity=bad)


def test_the_c_calls_give_what_ctypes_gives_and_fail_as_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Encode, decode, FEC recovery and concealment made from `_speedups.c` (what runs where
    it is built: `make test` builds it) are byte for byte those ctypes makes, with the same
    errors."""
    from firsthop.services.transceiver.media import opus
    from firsthop.services.transceiver.media.codecs import OPUS_BITRATE
    from firsthop.shared import speedups

    assert speedups.BUILT and speedups.native is not None
    rng = np.random.default_rng(7)
    voiced = tone(12, 330.0) + rng.integers(-2000, 2000, 12 * FRAME_SAMPLES).astype(np.int16)
    frames = [voiced[i : i + FRAME_SAMPLES].tobytes() for i in range(0, len(voiced), FRAME_SAMPLES)]
    fec_packets = encode(tone(12), fec=True)

    def errors(*calls: Callable[[], object]) -> list[str]:
        said = []
        for call in calls:
            with pytest.raises(OpusError) as caught:
                call()
            said.append(str(caught.value))
        return said

    def run() -> tuple[list[bytes], list[object], list[str]]:
        encoder, decoder = opus.OpusEncoder(OPUS_BITRATE), opus.OpusDecoder()
        packets = [encoder.encode(f) for f in frames]
        decoded: list[object] = [decoder.decode(p) for p in packets[:6]]
        decoded += [decoder.conceal(), decoder.recover(fec_packets[8])]
        decoded.append(decoder.decode(fec_packets[8]))
        said = errors(lambda: decoder.decode(b"\xff" * 3), lambda: encoder.encode(b"\x00" * 7))
        encoder.close()
        decoder.close()
        # closed: an error, never a call into libopus with no state
        said += errors(lambda: encoder.encode(frames[0]), lambda: decoder.decode(packets[0]))
        return packets, decoded, said

    def longest() -> list[object]:
        """120 ms, the longest packet: the C decode's whole buffer, decoded, then concealed
        at that length; and one sample more than it to encode."""
        encoder, decoder = opus.OpusEncoder(OPUS_BITRATE), opus.OpusDecoder()
        long_frame = tone(6).tobytes()  # 6 x 20 ms = 5760 samples
        packet = encoder.encode(long_frame)
        out: list[object] = [packet, decoder.decode(packet), decoder.conceal()]
        out += errors(lambda: encoder.encode(long_frame + b"\x00\x00"))
        return out

    from_c = run(), longest()
    monkeypatch.setattr(opus, "native", None)
    from_ctypes = run(), longest()
    assert from_c == from_ctypes
    (packets, _, said), (_, long_pcm, concealed, too_long) = from_c
    assert len(long_pcm) == len(concealed) == opus.MAX_SAMPLES * 2  # type: ignore[arg-type]
    assert too_long == "opus_encode failed (-1)"
    assert len(packets[0]) > 20
    assert said[0] == "opus_decode failed (-4)"  # OPUS_INVALID_PACKET
    assert said[1] == "opus_encode failed (-1)"  # OPUS_BAD_ARG: 3 samples is no frame
    assert "closed" in said[2] and "closed" in said[3]
    monkeypatch.undo()
    with pytest.raises(ValueError):
        speedups.native.opus_bind(0, 0)  # (no address: refused, the binding kept)
    assert opus.OpusEncoder(OPUS_BITRATE).encode(frames[0]) == packets[0]


def test_a_codec_that_failed_to_be_made_leaves_nothing_to_free() -> None:
    """A constructor that raised before its state was made (a wrong argument, a libopus
    refusal) leaves an object whose `__del__` must not raise in turn (Python would print
    "Exception ignored" for each)."""
    import gc
    import sys

    from firsthop.services.transceiver.media.opus import OpusEncoder

    raised: list[BaseException | None] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: raised.append(u.exc_value)
    try:
        with pytest.raises(TypeError):
            OpusEncoder()  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            OpusDecoder(1)  # type: ignore[call-arg]
        with pytest.raises(OpusError, match="opus_encoder_create"):
            OpusEncoder(32000, application=12345)
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert raised == []


@settings(max_examples=500)
@given(st.binary(min_size=1, max_size=3))
def test_a_packets_duration_is_what_libopus_reads_in_it(packet: bytes) -> None:
    """`codecs.opus_duration` (what the media core charges a caller's audio budget before
    decoding) against libopus's own `opus_packet_get_nb_samples`: the same for every
    packet libopus can time; at most 120 ms for one it cannot (it will not decode)."""
    lib = opus._library()
    lib.opus_packet_get_nb_samples.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]
    samples = lib.opus_packet_get_nb_samples(packet, len(packet), RATE)
    duration = codecs.opus_duration(packet)
    if 0 < samples <= opus.MAX_SAMPLES:
        assert duration == pytest.approx(samples / RATE)
    else:
        assert 0 <= duration <= codecs.OPUS_MAX_DURATION


def test_a_g711_payloads_duration_is_a_sample_a_byte() -> None:
    assert codecs.make_codec("pcmu").duration(bytes(160)) == pytest.approx(0.02)
    assert codecs.make_codec("pcma").duration(bytes(240)) == pytest.approx(0.03)
    assert codecs.opus_duration(b"") == 0.0
