"""k8s/'s NetworkPolicies: default-deny, and each port of each workload open to exactly the peers
that need it (the relay to the transceivers' media port, signaling to their API, ...)."""

from __future__ import annotations

import pytest

from tests.integration.deploy.manifests import (
    TARGETS,
    Obj,
    find,
    objs,
    pod_labels,
    selected,
    selects,
    workloads,
)

PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


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
    kind = next(w["kind"] for w in workloads(objects) if w["metadata"]["name"] == name)
    assert isinstance(kind, str), kind
    return kind


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
    ice_tcp = allowed_peers(objects, "relay", "TCP", 3478)
    assert ice_tcp is not None and {"ipBlock": {"cidr": "0.0.0.0/0"}} in ice_tcp
    # Every pod-selector peer anywhere selects something (a typo would silently admit nobody).
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if set(peer) == {"podSelector"}:
                    assert selected(objects, peer["podSelector"]), policy["metadata"]["name"]


KUBE_DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}


def egress_rules(objects: list[Obj], workload: str) -> list[Obj] | None:
    """The egress rules that hold for a workload's pods; None: no policy limits its egress."""
    labels = pod_labels(find(objects, workload_kind(objects, workload), workload))
    rules: list[Obj] | None = None
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if "Egress" in spec["policyTypes"] and selects(spec["podSelector"], labels):
            rules = (rules or []) + spec.get("egress", [])
    return rules


@pytest.mark.parametrize("target", TARGETS)
def test_agents_reach_only_jaeger_and_dns(target: str) -> None:
    objects = objs(target)
    agents = [w["metadata"]["name"] for w in workloads(objects)]
    agents = [name for name in agents if name.startswith("agent-")]
    assert len(agents) == 3, agents
    for agent in agents:
        rules = egress_rules(objects, agent)
        assert rules is not None, f"{target}: {agent}'s egress is open"
        reached: dict[str, set[tuple[str, int]]] = {}
        for rule in rules:
            assert rule.get("to") and rule.get("ports"), f"{agent}: a rule open to all: {rule}"
            ports = {(p["protocol"], p["port"]) for p in rule["ports"]}
            for peer in rule["to"]:
                if peer == KUBE_DNS_PEER:
                    reached.setdefault("dns", set()).update(ports)
                else:
                    for name in pod_peer_targets(objects, [peer]):
                        reached.setdefault(name, set()).update(ports)
        assert reached == {
            "jaeger": {("TCP", 4318), ("TCP", 4317)},
            "dns": {("UDP", 53), ("TCP", 53)},
        }, f"{target}: {agent}"
