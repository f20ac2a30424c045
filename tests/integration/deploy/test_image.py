"""The Dockerfile and what the image installs: multi-stage, non-root, `firsthop` as the
entrypoint, and no run-time wheel needing a system library the slim base image lacks."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess

from packaging.requirements import Requirement

from tests.integration.deploy.manifests import ROOT


def test_dockerfile_is_multi_stage_non_root_with_the_firsthop_entrypoint() -> None:
    first = (ROOT / "Dockerfile").read_text().splitlines()[0]
    # a `# syntax=` directive makes BuildKit pull a frontend from Docker Hub before building
    assert not re.match(r"#\s*syntax\s*=", first, re.I), first
    lines = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines() if not ln.startswith("#")]
    stages = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(stages) >= 2
    runtime = "\n".join(lines[lines.index(stages[-1]) :])
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in "\n".join(lines)
    assert "apt-get" not in runtime
    (user,) = re.findall(r"^USER (\S+)", runtime, re.M)
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    assert 'ENTRYPOINT ["firsthop"]' in runtime
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    first_rule = next(ln for ln in ignore if ln and not ln.startswith("#"))
    assert first_rule == "*", "an allow-list: everything out, then what the build needs"
    for path in re.findall(r"\b(services/[\w/]+)", "\n".join(lines)):
        assert (ROOT / path).exists(), f"the Dockerfile uses {path}, which is gone"
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", "\n".join(lines), re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path
            assert path.split("/")[0] in allowed, f"{path} is excluded by .dockerignore"


ALLOWED_SYSTEM_LIBS = {
    "linux-vdso.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libc.so.6",
    "libm.so.6",
    "libmvec.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libz.so.1",
}  # all in python:3.11-slim


def runtime_distributions() -> set[str]:
    """firsthop and what it needs at run time (no test extras; the assistant extra, which the
    image bakes in by default), as the image installs it."""
    todo: list[tuple[str, set[str]]] = [("firsthop", {"assistant"})]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        key = (name.lower().replace("_", "-"), frozenset(extras))
        if key in seen:
            continue
        seen.add(key)
        for req in map(Requirement, importlib.metadata.requires(name) or []):
            wanted = [{"extra": e} for e in extras or {""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in wanted):
                todo.append((req.name, set(req.extras)))
    return {name for name, _ in seen}


def test_runtime_wheels_need_no_system_library_beyond_the_slim_image() -> None:
    checked = 0
    for dist in sorted(runtime_distributions()):
        for file in importlib.metadata.distribution(dist).files or []:
            if ".so" not in file.name or ".libs/" in str(file):
                continue
            out = subprocess.run(["ldd", str(file.locate())], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            for line in out.stdout.splitlines():
                if "statically linked" in line:
                    continue
                lib, _, where = line.strip().partition(" => ")
                lib = os.path.basename(lib.split(" ")[0])
                bundled = "site-packages" in where  # a wheel's own .libs/ or a sibling
                assert bundled or lib in ALLOWED_SYSTEM_LIBS, f"{file} needs {lib}"
            checked += 1
    assert checked > 10  # av, cryptography, pylibsrtp, ... were looked at
