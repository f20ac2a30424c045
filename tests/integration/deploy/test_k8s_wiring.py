"""k8s/ as a whole: each container's flags and env go through the real CLI, and the addresses
that come out match the ports, probes, Services, PDBs and HPAs around them."""

from __future__ import annotations

import ipaddress

import pytest

from firsthop.shared.config import hostport_arg
from tests.integration.deploy.manifests import (
    SUBCOMMANDS,
    TARGETS,
    container_env,
    container_port,
    containers,
    effective_config,
    find,
    first_pod_ip,
    firsthop_containers,
    k8s_config,
    objs,
    probe_port,
    selected,
    workloads,
)


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
def test_relay_is_a_udp_and_ice_tcp_load_balancer_that_keeps_client_addresses(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = objs(target)
    workload, container, config = k8s_config(objects, "relay", monkeypatch)
    service = find(objects, "Service", "relay")["spec"]
    assert service["type"] == "LoadBalancer"
    assert service["externalTrafficPolicy"] == "Local"
    port, tcp = service["ports"]
    assert (port["protocol"], port["port"]) == ("UDP", 3478)
    target_port = container_port(container, port["targetPort"])
    assert (target_port["containerPort"], target_port["protocol"]) == (config.listen[1], "UDP")
    # ICE-TCP (RFC 6544) on 443 of the same VIP, to the relay's unprivileged TCP listener,
    # which signaling advertises
    assert (tcp["protocol"], tcp["port"]) == ("TCP", 443)
    target_port = container_port(container, tcp["targetPort"])
    assert config.listen_tcp is not None
    assert (target_port["containerPort"], target_port["protocol"]) == (config.listen_tcp[1], "TCP")
    _, _, signaling = k8s_config(objects, "signaling", monkeypatch)
    ingress_tcp = find(objects, "ConfigMap", "firsthop-config")["data"]["ingress-tcp-address"]
    assert signaling.ingress_tcp == {signaling.region: [ingress_tcp]}
    assert hostport_arg(ingress_tcp)[1] == 443
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
    assert set(config.agents) == {"echo", "parrot", "assistant"}
    assert config.default_agent == "assistant"
    for kind, url in [*config.agents.items(), ("echo", transceiver.agent_url)]:
        realtime = url.startswith("realtime+ws://")
        host, port = hostport_arg(url.split("://", 1)[1].split("/", 1)[0])
        _, agent_container, (agent_kind, listen) = k8s_config(objects, host, monkeypatch)
        assert agent_kind == kind
        assert find(objects, "Service", host)["spec"]["ports"][0]["port"] == port == listen[1]
        probe = agent_container["readinessProbe"]
        # the assistant is ready once its models are loaded: its /healthz says so
        assert ("httpGet" if realtime else "tcpSocket") in probe, (kind, probe)
        assert probe_port(agent_container, probe) == listen[1]


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
