"""compose.yaml: one image for every firsthop service, only the public ports published, each
service's command and environment accepted by the real CLI and consistent with the others."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest
import yaml

from firsthop.shared.config import hostport_arg
from tests.integration.deploy.manifests import (
    ROOT,
    SUBCOMMANDS,
    THIRD_PARTY_IMAGES,
    Obj,
    container_port,
    effective_config,
    firsthop_containers,
    rendered,
)

FIRSTHOP_IMAGE = "firsthop:dev"


def compose(**env: str) -> Obj:
    """compose.yaml with each ${VAR:-default} at `env[VAR]`, else its default (all of them
    must have one)."""

    def value(m: re.Match[str]) -> str:
        return env.get(m[1], m[2])

    text = re.sub(r"\$\{([A-Z0-9_]+):-([^}]*)\}", value, (ROOT / "compose.yaml").read_text())
    assert "${" not in text, "every variable in compose.yaml needs a default"
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def ours(services: Obj) -> dict[str, Obj]:
    return {name: s for name, s in services.items() if s["image"] == FIRSTHOP_IMAGE}


def compose_config(service: Obj, mp: pytest.MonkeyPatch) -> Any:
    env = {k: str(v) for k, v in service.get("environment", {}).items()}
    return effective_config([str(a) for a in service["command"]], env, mp)


def published(service: Obj) -> list[tuple[int, str]]:
    """(host port, protocol) for each short-syntax port mapping."""
    out = []
    for spec in service.get("ports", []):
        mapping, _, proto = str(spec).partition("/")
        out.append((int(mapping.split(":")[-2]), proto or "tcp"))
    return out


def healthcheck_target(service: Obj) -> tuple[str, int]:
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    compile(test[3], "healthcheck", "exec")
    m = re.search(r"http://([\d.]+):(\d+)/(?:healthz|readyz)", test[3]) or re.search(
        r"\('([\d.]+)', (\d+)\)", test[3]
    )
    assert m, test[3]
    return m[1], int(m[2])


def probe_host(addr: tuple[str, int]) -> tuple[str, int]:
    return ("127.0.0.1" if addr[0] == "0.0.0.0" else addr[0], addr[1])


def test_compose_builds_the_one_image_once_and_every_firsthop_service_runs_it() -> None:
    services = compose()["services"]
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["relay"], "one service builds; the classic builder built it 7 times"
    build = services["relay"]["build"]
    assert build["context"] == "." and "dockerfile" not in build
    assert build["args"]["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert build["args"]["BUILDER_IMAGE"] == "python:3.11-bookworm"  # same Python, with gcc
    assert services["relay"]["pull_policy"] == "build"
    for name, service in services.items():
        if name in ours(services):
            assert service["command"][0] in SUBCOMMANDS
            assert "healthcheck" in service, name
            if name != "relay":  # run the built image, never look for it on a registry
                assert service["pull_policy"] == "never", name
            # a read-only root, and a writable /tmp (the assistant dies without one)
            assert service["read_only"] is True, name
            assert any(t.split(":")[0] == "/tmp" for t in service["tmpfs"]), name
        else:
            assert service["image"].startswith(THIRD_PARTY_IMAGES), name
    assert services["redis"]["healthcheck"]
    commands = sorted(s["command"][0] for s in ours(services).values())
    assert commands == [
        *("agent", "agent", "agent", "relay", "signaling", "transceiver", "transceiver")
    ]


# a second stack beside the first: every published port, the network and the addresses moved
MOVED = {
    "FIRSTHOP_RELAY_PORT": "4478",
    "FIRSTHOP_RELAY_TCP_PORT": "4443",
    "FIRSTHOP_SIGNALING_PORT": "9080",
    "FIRSTHOP_JAEGER_PORT": "26686",
    "FIRSTHOP_SIP_PORT": "6060",
    "FIRSTHOP_SIP_TRUNKS": "pbx=192.0.2.0/28,carrier=198.51.100.7/32",
    "FIRSTHOP_NET": "10.78.1",
    "FIRSTHOP_PUBLIC_HOST": "192.0.2.7",
    "FIRSTHOP_BIND": "0.0.0.0",
}
DEFAULTS = {
    "FIRSTHOP_RELAY_PORT": "3478",
    "FIRSTHOP_RELAY_TCP_PORT": "3478",
    "FIRSTHOP_SIGNALING_PORT": "8080",
    "FIRSTHOP_JAEGER_PORT": "16686",
    "FIRSTHOP_SIP_PORT": "5060",
    "FIRSTHOP_PUBLIC_HOST": "127.0.0.1",
}
ENVS = pytest.mark.parametrize("env", [{}, MOVED], ids=["defaults", "moved"])


@ENVS
def test_compose_publishes_only_the_public_ports(env: dict[str, str]) -> None:
    services = compose(**env)["services"]
    port = {k: int(v) for k, v in {**DEFAULTS, **env}.items() if k.endswith("_PORT")}
    ports = {name: published(s) for name, s in services.items() if published(s)}
    assert ports == {
        "relay": [(port["FIRSTHOP_RELAY_PORT"], "udp"), (port["FIRSTHOP_RELAY_TCP_PORT"], "tcp")],
        "signaling": [
            (port["FIRSTHOP_SIGNALING_PORT"], "tcp"),
            (port["FIRSTHOP_SIP_PORT"], "udp"),
            (port["FIRSTHOP_SIP_PORT"], "tcp"),
        ],
        "jaeger": [(port["FIRSTHOP_JAEGER_PORT"], "tcp")],
    }
    bind = env.get("FIRSTHOP_BIND", "127.0.0.1")
    edge = {name: s for name, s in services.items() if name != "jaeger"}
    assert all(str(p).startswith(f"{bind}:") for s in edge.values() for p in s.get("ports", []))
    # Jaeger's UI (no login; callers' addresses in its traces) stays on loopback whatever
    # FIRSTHOP_BIND is, unless FIRSTHOP_JAEGER_BIND says otherwise (since stop 42)
    assert all(str(p).startswith("127.0.0.1:") for p in services["jaeger"]["ports"])
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


@ENVS
def test_compose_services_get_only_what_their_cli_accepts(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = compose(**env)
    host = {**DEFAULTS, **env}["FIRSTHOP_PUBLIC_HOST"]
    udp_port = int({**DEFAULTS, **env}["FIRSTHOP_RELAY_PORT"])
    tcp_port = int({**DEFAULTS, **env}["FIRSTHOP_RELAY_TCP_PORT"])
    services = ours(doc["services"])
    configs = {name: compose_config(s, monkeypatch) for name, s in services.items()}
    subnet = ipaddress.ip_network(doc["networks"]["edge"]["ipam"]["config"][0]["subnet"])
    dynamic = ipaddress.ip_network(doc["networks"]["edge"]["ipam"]["config"][0]["ip_range"])
    relay, signaling = configs["relay"], configs["signaling"]
    assert healthcheck_target(services["relay"]) == probe_host(relay.metrics)
    assert not signaling.dev
    assert healthcheck_target(services["signaling"]) == probe_host(signaling.listen)
    (ingress,) = signaling.ingress[signaling.region]
    # the port a caller sends to is the one published, the relay's own and what it writes into
    # frames: inside and out the same
    assert ingress == f"{host}:{udp_port}" and hostport_arg(ingress) == relay.ingress
    assert relay.listen[1] == relay.ingress[1] == published(services["relay"])[0][0] == udp_port
    # ICE-TCP: the relay listens, compose publishes it, signaling advertises it
    (ingress_tcp,) = signaling.ingress_tcp[signaling.region]
    assert relay.ingress_tcp == hostport_arg(ingress_tcp) == (host, tcp_port)
    assert (relay.listen_tcp[1], "tcp") == published(services["relay"])[1]
    # SIP: listened on and published on the same port, our Contact the public host's
    sip_port = int({**DEFAULTS, **env}["FIRSTHOP_SIP_PORT"])
    assert signaling.sip_listen == ("0.0.0.0", sip_port) and signaling.sip_public == (
        host,
        sip_port,
    )
    trunks = {"pbx": ["192.0.2.0/28"], "carrier": ["198.51.100.7/32"]} if env else {}
    assert signaling.sip_trunks == trunks
    assert set(signaling.agents) == {"echo", "parrot", "assistant"}
    assert signaling.default_agent == "assistant"
    assert signaling.agents["assistant"] == "realtime+ws://agent-assistant:8090/v1/realtime"
    assert configs["agent-assistant"][:2] == ("assistant", ("0.0.0.0", 8090))
    assert healthcheck_target(services["agent-assistant"]) == ("127.0.0.1", 8090)
    transceivers = [n for n, s in services.items() if s["command"][0] == "transceiver"]
    assert len(transceivers) == 2
    for name in transceivers:
        tx, service = configs[name], services[name]
        ip = ipaddress.ip_address(service["networks"]["edge"]["ipv4_address"])
        assert ip in subnet and ip not in dynamic
        assert tx.advertised[0] == tx.api[0] == str(ip)
        assert any(ip in ipaddress.ip_network(c) for c in relay.allow_dest)
        assert healthcheck_target(service) == probe_host(tx.api)
        assert tx.region == signaling.region and tx.cluster == relay.cluster
        assert tx.keys == relay.keys
        grace = int(str(service["stop_grace_period"]).removesuffix("s"))
        assert grace > tx.drain_seconds
    for kind in ("echo", "parrot"):
        name = f"agent-{kind}"
        assert configs[name] == (kind, ("0.0.0.0", 8090))
        assert signaling.agents[kind] == f"ws://{name}:8090"
        assert healthcheck_target(services[name]) == ("127.0.0.1", 8090)
    names = set()
    for service in services.values():
        assert service["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
        names.add(service["environment"]["OTEL_SERVICE_NAME"])
    assert names == {
        "firsthop-relay",
        "firsthop-transceiver",
        "firsthop-signaling",
        "firsthop-agent-echo",
        "firsthop-agent-parrot",
        "firsthop-agent-assistant",
    }


def test_compose_waits_for_healthy_dependencies() -> None:
    services = compose()["services"]
    for name, service in services.items():
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in services, (name, dep)
            assert cond["condition"] in ("service_healthy", "service_started")
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], dep
    assert services["signaling"]["depends_on"]["redis"]["condition"] == "service_healthy"


def _probe(container: Obj) -> tuple[str, int | str]:
    """A k8s container's readiness check as (HTTP path or "tcp", port number)."""
    probe = container["readinessProbe"]
    if "tcpSocket" in probe:
        return "tcp", container_port(container, probe["tcpSocket"]["port"])["containerPort"]
    get = probe["httpGet"]
    return get["path"], container_port(container, get["port"])["containerPort"]


def _healthcheck(service: Obj) -> tuple[str, int]:
    """A compose service's health check as (HTTP path or "tcp", port number)."""
    code = service["healthcheck"]["test"][3]
    m = re.search(r"http://[\d.]+:(\d+)(/\w+)", code)
    if m:
        return m[2], int(m[1])
    return "tcp", healthcheck_target(service)[1]


@pytest.mark.parametrize("target", ["base", "dev", "prod"])
def test_kubernetes_runs_what_the_compose_test_proves(target: str) -> None:
    """tests/e2e/test_compose_stack.py runs compose.yaml on a real engine; k8s/ (which no
    cluster here can run) uses the same image, user, read-only root with a writable /tmp,
    health checks and drain."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    (uid,) = re.findall(r"^USER (\d+):\d+$", dockerfile, re.M)
    services = ours(compose()["services"])
    by_command: dict[str, list[Obj]] = {}
    for service in services.values():
        by_command.setdefault(str(service["command"][0]), []).append(service)
    objects = list(rendered(target))
    seen = set()
    for workload, container in firsthop_containers(objects):
        pod = workload["spec"]["template"]["spec"]
        assert container["image"].split(":")[0].rsplit("/", 1)[-1] == "firsthop"
        pod_user = pod["securityContext"].get("runAsUser")
        user = container.get("securityContext", {}).get("runAsUser", pod_user)
        assert str(user) == uid, workload["metadata"]["name"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
        assert "emptyDir" in volume
        command = container["args"][0]
        seen.add(command)
        if command == "agent":  # the same kind of agent in both
            (kind,) = [e["value"] for e in container["env"] if e["name"] == "FIRSTHOP_KIND"]
            twins = [s for s in by_command["agent"] if kind in s["command"]]
        else:
            twins = by_command[command]
        assert {_healthcheck(s) for s in twins} == {_probe(container)}, command
        if command == "transceiver":  # a stop drains: preStop in k8s, SIGTERM in compose
            assert container["lifecycle"]["preStop"]
            assert all("--drain-seconds" in s["command"] for s in twins)
    assert seen == {"relay", "transceiver", "signaling", "agent"}
