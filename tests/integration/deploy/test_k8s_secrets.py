"""k8s/'s Secrets: the base's placeholders fail closed, dev has working dev keys, prod has none."""

from __future__ import annotations

import pytest

from firsthop.shared.wire.route_token import parse_route_keys
from tests.integration.deploy.manifests import (
    container_env,
    effective_config,
    find,
    firsthop_containers,
    objs,
)


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


@pytest.mark.parametrize("name", ["relay", "transceiver", "signaling"])
def test_the_dev_overlays_public_keys_run_only_where_it_allows_them(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dev overlay's keys are in this repository: a service refuses them unless told
    (FIRSTHOP_ALLOW_DEV_SECRETS=1, which the overlay sets); the same Secrets pasted into
    another deployment do not start (a helper's read, stop 42)."""
    objects = objs("dev")
    ((workload, container),) = [
        (w, c) for w, c in firsthop_containers(objects) if w["metadata"]["name"] == name
    ]
    env = container_env(objects, workload, container)  # (its Secrets: stand-ins) ...
    for item in container["env"]:  # ... but here the overlay's own
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            env[item["name"]] = find(objects, "Secret", ref["name"])["stringData"][ref["key"]]
    assert env["FIRSTHOP_ALLOW_DEV_SECRETS"] == "1"
    effective_config(container["args"], env, monkeypatch)
    del env["FIRSTHOP_ALLOW_DEV_SECRETS"]
    with pytest.raises(SystemExit, match="published dev one"):
        effective_config(container["args"], env, monkeypatch)
