"""What the HTTP services answer at all (issue #9, finding 7b), as real processes.

* Quart apps get a default static folder, ``static/`` next to their root path, which for an
  app named like ours falls back to the working directory: a file there was served at
  ``/static/...``. Signaling and the transceiver serve no folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import SignalingProcess, TransceiverProcess, start_all


@pytest.fixture(scope="module")
def in_a_dir_with_static(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cwd = tmp_path_factory.mktemp("cwd")
    (cwd / "static").mkdir()
    (cwd / "static" / "x.txt").write_text("a file from the working directory\n")
    yield cwd


def test_no_static_folder_is_served_from_the_working_directory(
    in_a_dir_with_static: Path,
) -> None:
    sig, tx = SignalingProcess(), TransceiverProcess(tx_id="tx-static")
    for proc in (sig, tx):
        proc.cwd = str(in_a_dir_with_static)
    start_all(sig, tx)
    try:
        for base in (sig.url, tx.api):
            resp = httpx.get(f"{base}/static/x.txt", timeout=5)
            assert resp.status_code == 404, (base, resp.text)
            assert "working directory" not in resp.text
        assert httpx.get(sig.url + "/", timeout=5).status_code == 200  # the demo page stays
    finally:
        sig.kill()
        tx.kill()
