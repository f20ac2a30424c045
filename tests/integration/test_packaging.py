"""What installing firsthop puts in a user's site-packages: one top-level package."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def project_copy(tmp_path: Path) -> Path:
    """What the package's build reads, copied (symlinks kept) to `tmp_path / "project"`."""
    project = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("src", "services", "shared"):
        shutil.copytree(ROOT / name, project / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    return project


def test_the_wheel_holds_one_top_level_package_with_its_data(tmp_path: Path) -> None:
    src = project_copy(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("firsthop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.startswith("firsthop-")} == {"firsthop"}
    assert "firsthop/services/relay/flow_table.py" in names
    assert "firsthop/shared/wire/stun.py" in names
    assert "firsthop/services/signaling/static/index.html" in names
    assert "firsthop/services/bench/c_forwarder.c" in names
    assert "firsthop/services/agent/assistant/session.py" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "firsthop = firsthop.services.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_an_editable_install_is_silent_and_puts_only_the_package_on_the_path(
    tmp_path: Path,
) -> None:
    # a new user's `make test`/`pip install -e .`: no setuptools warning about a folder
    # named like the package (the package sits under src/, a plain path entry)
    project = project_copy(tmp_path)
    target = tmp_path / "target"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
        + ["--target", str(target), "-e", str(project)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    noise = [ln for ln in done.stderr.splitlines() if not ln.startswith("WARNING: Location")]
    assert not any("Warning" in ln or "!!" in ln for ln in noise), done.stderr
    (pth,) = target.glob("__editable__.firsthop-*.pth")
    assert pth.read_text().split() == [str(project / "src")]


def test_nothing_imports_services_or_shared_as_top_level_modules() -> None:
    code = (
        "import json, sys\n"
        "from firsthop.services.cli import build_parser\n"
        "build_parser()\n"  # every subcommand, fully
        "import firsthop.services.relay.worker, firsthop.services.bench.stock\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    modules = json.loads(out.splitlines()[-1])
    assert [m for m in modules if m.split(".")[0] in ("services", "shared")] == []
    assert "firsthop.services.transceiver.table" in modules


def test_a_wheel_built_from_the_sdist_has_both_compiled_parts_and_rnnoises_licence(
    tmp_path: Path,
) -> None:
    # (the sdist must carry every C source and header setup.py compiles, not only those named
    # in `sources`: a missing header would drop the optional extension without a word; they
    # go in as the extension's `depends`)
    import tarfile

    project = project_copy(tmp_path)
    shutil.copy(ROOT / "setup.py", project / "setup.py")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = (tmp_path / "sdist").glob("firsthop-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "dist"), str(unpacked)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("firsthop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for part in (
        "services/relay/_fastpath",
        "services/transceiver/media/_rnnoise",
        "shared/_speedups",
    ):
        assert any(n.startswith(f"firsthop/{part}.") and n.endswith(".so") for n in names), part
    assert any(n.endswith("licenses/services/transceiver/media/rnnoise/COPYING") for n in names)
