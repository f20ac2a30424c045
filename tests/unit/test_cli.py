"""The `firsthop` command loads only the subcommand it runs."""

from __future__ import annotations

import json
import subprocess
import sys

from firsthop.services.cli import SUBCOMMANDS

HEAVY = ("aiortc", "aioice", "av", "quart", "quart_trio", "pylibsrtp")


def modules_after(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return list(json.loads(out.splitlines()[-1]))


def test_the_relay_loads_nothing_of_aiortc_av_or_quart() -> None:
    loaded = modules_after(
        "from firsthop.services.cli import build_parser\n"
        "args = build_parser('relay').parse_args(['relay', '--route-keys', '1=' + 'A' * 43])\n"
        "import firsthop.services.relay.worker, firsthop.services.relay.supervisor"
    )
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert "firsthop.services.relay.dataplane" in loaded


def test_help_lists_every_command_without_loading_them() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "firsthop.services.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for name in SUBCOMMANDS:
        assert name in done.stdout
    assert not any(f" {heavy}" in line for line in done.stderr.splitlines() for heavy in HEAVY)


def test_every_command_still_parses_its_own_flags() -> None:
    from firsthop.services.cli import build_parser

    parser = build_parser()  # every command, fully
    args = parser.parse_args(["agent", "--kind", "parrot", "--listen", "127.0.0.1:9"])
    assert (args.command, args.kind) == ("agent", "parrot")


def test_help_names_every_agent_the_stack_runs() -> None:
    for args in (["--help"], ["call", "--help"]):
        done = subprocess.run(
            [sys.executable, "-m", "firsthop.services.cli", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        text = " ".join(done.stdout.split())
        assert "assistant" in text and "echo or parrot" not in text, text
        assert "echo | parrot" not in text, text


def test_call_prints_what_each_side_said_and_errors_and_skips_the_rest() -> None:
    from firsthop.services.call.main import transcript_lines

    events = [
        json.dumps({"type": "session.created", "session": {}}),
        json.dumps({"type": "response.output_audio_transcript.delta", "delta": "It is"}),
        json.dumps(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "transcript": " what time is it ",
            }
        ),
        json.dumps({"type": "response.output_audio_transcript.done", "transcript": "It is noon."}),
        json.dumps({"type": "response.audio_transcript.done", "transcript": "Beta too."}),
        json.dumps({"type": "error", "error": {"message": "bad event"}}),
        json.dumps({"type": "response.output_audio_transcript.done", "transcript": 7}),
        "not json",
        b"\xff\xfe",
        json.dumps([1, 2]),
    ]
    assert transcript_lines(events) == [
        "you said: what time is it",
        "agent said: It is noon.",
        "agent said: Beta too.",
        "error: bad event",
    ]


def test_call_counts_the_first_audible_frame_not_the_first_silent_one() -> None:
    import math
    import struct

    from firsthop.services.call.caller import audible

    silence = bytes(1920)
    noise_floor = struct.pack("<960h", *([1, -1] * 480))  # what a comfort-noise frame holds
    tone = struct.pack(
        "<960h", *(int(3000 * math.sin(2 * math.pi * 440 * i / 48000)) for i in range(960))
    )
    assert not audible(silence) and not audible(noise_floor) and not audible(b"")
    assert audible(tone)
