#!/usr/bin/env python3
"""Write `constraints.txt`: the exact version of everything the image installs.

pyproject.toml names ranges (`redis>=5.0`); an image built from ranges alone gets whatever
PyPI holds that day, so two builds of one commit could differ, and the image would not be
what the tests ran. This walks the requirements of the runtime dependencies and the image's
extras (`assistant`, `noise`) through the installed metadata of the venv it runs in (markers
as this Python and platform evaluate them: Linux, CPython 3.11, the image's) and pins each
package at the version installed. The Dockerfile and `make` install with `-c constraints.txt`,
so the image and the tests' venv get the same versions; `make lock` (this script, run by the
venv's Python) writes it again after a dependency changes, and `tests/unit/test_lock.py`
fails until it has.

Usage: .venv/bin/python scripts/lock_dependencies.py [--check]
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("assistant", "noise")  # the image's (Dockerfile FIRSTHOP_EXTRAS)
HEADER = """\
# Every package the image installs, at the version the tests ran (scripts/lock_dependencies.py
# writes this from the venv; `make lock` after a dependency changes). Linux, CPython 3.11.
"""


def wanted(requirement: Requirement, extras: frozenset[str]) -> bool:
    """Whether `requirement` applies here, for a parent asked with `extras`."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": e}) for e in extras or {""})


def closure(roots: list[str]) -> dict[str, str]:
    """Every distribution `roots` need, installed: name -> version."""
    pins: dict[str, str] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), frozenset[str]()) for r in roots]
    while todo:
        requirement, parent_extras = todo.pop()
        if not wanted(requirement, parent_extras):
            continue
        name = canonicalize_name(requirement.name)
        extras = frozenset(requirement.extras)
        if (name, extras) in done:
            continue
        done.add((name, extras))
        dist = metadata.distribution(requirement.name)
        pins[name] = dist.version
        todo += [(Requirement(dep), extras) for dep in dist.requires or []]
    return pins


def render() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    roots = project["dependencies"] + [
        r for extra in EXTRAS for r in project["optional-dependencies"][extra]
    ]
    pins = closure(roots)
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def main() -> int:
    path = ROOT / "constraints.txt"
    text = render()
    if "--check" in sys.argv[1:]:
        if path.read_text() != text:
            print("constraints.txt is not what the venv holds: run `make lock`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path} ({text.count(chr(10)) - HEADER.count(chr(10))} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
