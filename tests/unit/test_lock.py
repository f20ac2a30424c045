"""The image's versions are locked (`constraints.txt`) and are the ones the tests run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def lock_module() -> Any:
    spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts/lock_dependencies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_what_the_venv_holds_for_the_image() -> None:
    """Every package of the runtime and the image's extras, pinned at the installed version:
    a dependency added or moved without `make lock` fails here."""
    assert (ROOT / "constraints.txt").read_text() == lock_module().render()


def test_every_line_is_an_exact_pin_and_the_builds_use_them() -> None:
    lines = [
        line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(lines) > 50
    for line in lines:
        requirement = Requirement(line)
        assert re.fullmatch(r"==[^,*]+", str(requirement.specifier)), line
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml README.md constraints.txt" in dockerfile
    assert re.search(r"pip install --only-binary=:all: -c constraints\.txt -r", dockerfile)
    assert "!constraints.txt" in (ROOT / ".dockerignore").read_text().splitlines()
    assert "-c constraints.txt -e '.[test,assistant,noise]'" in (ROOT / "Makefile").read_text()


def test_the_walk_follows_extras_and_markers() -> None:
    """`hypercorn[trio]` brings trio's own requirements; a Windows-only one is left out."""
    lock = lock_module()
    pins = lock.closure(["hypercorn[trio]>=0.17"])
    assert {"hypercorn", "trio", "h11", "wsproto"} <= pins.keys()
    assert not lock.wanted(Requirement('colorama; sys_platform == "win32"'), frozenset())
    assert lock.wanted(Requirement('trio; extra == "trio"'), frozenset({"trio"}))
    assert not lock.wanted(Requirement('aioquic; extra == "h3"'), frozenset({"trio"}))
