"""k8s/ object by object: kustomize renders it offline, the overlays patch the base, and every
object is valid Kubernetes, admitted by a namespace enforcing the restricted pod security
standard."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tests.integration.deploy.manifests import (
    K8S,
    SUBCOMMANDS,
    TARGETS,
    containers,
    find,
    firsthop_containers,
    objs,
    workloads,
)

K8S_VERSION = "1.30.0"


def test_kustomizations_name_only_files_in_the_repo() -> None:
    """kustomize fetches a remote resource (a URL) at build time: the render stays offline."""
    kustomizations = sorted(K8S.rglob("kustomization.yaml"))
    assert [p.parent for p in kustomizations] == sorted(TARGETS.values())
    for path in kustomizations:
        kust = yaml.safe_load(path.read_text())
        for entry in kust.get("resources", []) + kust.get("components", []):
            assert (path.parent / entry).exists(), f"{path}: {entry} is not a local path"


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
def test_every_object_validates_against_the_kubernetes_schemas(target: str) -> None:
    objects = objs(target)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


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
def test_every_scratch_volume_is_bounded(target: str) -> None:
    """An emptyDir without a sizeLimit may fill its node's disk: with one, the kubelet evicts
    the pod that wrote too much, and its neighbours go on."""
    for workload in workloads(objs(target)):
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            limit = volume["emptyDir"].get("sizeLimit") if "emptyDir" in volume else None
            where = f"{target}: {workload['metadata']['name']}/{volume['name']}"
            assert limit is not None and limit.endswith("Mi") and int(limit[:-2]) <= 256, where


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_the_firsthop_image_or_known_third_party(target: str) -> None:
    objects = objs(target)
    ours = {c["image"] for _, c in firsthop_containers(objects)}
    assert len(ours) == 1, ours
    for _, c in firsthop_containers(objects):
        assert "command" not in c, "the image's ENTRYPOINT is firsthop; give args only"
        assert c["args"][0] in SUBCOMMANDS


def test_prod_transceivers_get_one_whole_core_and_a_capacity_under_their_knee() -> None:
    """A transceiver runs on one thread (docs/capacity.md): more than a core per pod is never
    used, and a fraction of one throttles the event loop. requests = limits for CPU and
    memory puts the pod in the Guaranteed QoS class (an exclusive core under the static CPU
    manager); the capacity is set, and below the 85-call knee measured on one core."""
    (tx,) = containers(find(objs("prod"), "StatefulSet", "transceiver"))
    resources = tx["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["requests"]["cpu"] == "1"
    env = {e["name"]: e.get("value") for e in tx["env"]}
    assert 0 < int(env["FIRSTHOP_CAPACITY"]) < 85
