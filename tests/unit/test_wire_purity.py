"""shared/wire is sans-IO: importing it pulls in no event loop, network client or tracer."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("trio", "asyncio", "redis", "opentelemetry", "aiortc", "aioice", "quart")


def imported_by(*modules: str) -> list[str]:
    """Every module a fresh interpreter holds after importing `modules`."""
    code = "import json, sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


def test_wire_imports_no_io_frameworks() -> None:
    modules = imported_by(
        *(f"firsthop.shared.wire.{m}" for m in ("stun", "route_token", "proxy_v2", "demux")),
        "firsthop.shared.wire.g711",
        "firsthop.shared.wire.websocket",
        "firsthop.shared.wire.websocket_connection",
        "firsthop.shared.wire.sip",
        "firsthop.shared.wire.sctp_check",
        "firsthop.shared.rtp_offer",
    )
    leaked = [m for m in modules if m.split(".")[0] in FORBIDDEN]
    assert leaked == []
    assert "firsthop.shared.wire.stun" in modules


def test_agent_protocols_import_no_io_frameworks() -> None:
    """The agent protocols (services/transceiver/agents/) are sans-IO codecs too."""
    modules = imported_by("firsthop.services.transceiver.agents")
    assert [m for m in modules if m.split(".")[0] in FORBIDDEN] == []
    assert "firsthop.services.transceiver.agents.realtime" in modules


def test_the_media_core_imports_no_io() -> None:
    """services/transceiver/media/ is sans-IO: no event loop, no aiortc or aioice, and none
    of its modules (nor the RTP/RTCP codecs) imports socket. (pylibsrtp itself imports
    `socket` for `htonl` alone: a byte-order helper, no I/O.)"""
    import ast
    import pathlib

    modules = imported_by(
        "firsthop.services.transceiver.media.core",
        "firsthop.shared.wire.rtp",
        "firsthop.shared.wire.rtcp",
    )
    assert [m for m in modules if m.split(".")[0] in FORBIDDEN] == []
    assert "firsthop.services.transceiver.media.core" in modules
    import firsthop

    root = pathlib.Path(firsthop.__file__).parent
    files = [
        *sorted((root / "services/transceiver/media").glob("*.py")),
        root / "shared/wire/rtp.py",
        root / "shared/wire/rtcp.py",
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad = [n for n in names if n.split(".")[0] in (*FORBIDDEN, "socket", "select")]
            assert bad == [], f"{path.name} imports {bad}"


def test_the_sip_core_imports_no_io() -> None:
    """services/sip/uas.py makes every SIP decision with no socket, no loop and no clock."""
    modules = imported_by("firsthop.services.sip.uas")
    assert [m for m in modules if m.split(".")[0] in (*FORBIDDEN, "socket", "select")] == []
    assert "firsthop.services.sip.uas" in modules
