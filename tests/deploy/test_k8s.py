"""deploy/k8s: every manifest validates against the Kubernetes schema (kubernetes-validate, strict),
and the pieces agree with each other and with the app (labels, ports, probe routes, drain time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from app.__main__ import AFTER_DRAIN_S
from app.main import create_app
from app.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
CORE_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap"}


def _documents() -> dict[str, dict[str, Any]]:
    documents = {}
    for path in sorted(K8S.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            documents[document["kind"]] = document
    return documents


DOCUMENTS = _documents()


@pytest.mark.parametrize("kind", sorted(CORE_KINDS))
def test_core_manifests_validate_strictly(kind: str) -> None:
    kubernetes_validate.validate(DOCUMENTS[kind], kubernetes_validate.latest_version(), strict=True)


def test_every_manifest_is_one_of_the_expected_kinds() -> None:
    assert set(DOCUMENTS) == CORE_KINDS | {"ServiceMonitor"}


def _container() -> dict[str, Any]:
    (container,) = DOCUMENTS["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_selectors_ports_and_scaling_target_agree() -> None:
    deployment, service = DOCUMENTS["Deployment"], DOCUMENTS["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"],
        DOCUMENTS["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    monitor = DOCUMENTS["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} <= service_ports
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= {p["name"] for p in _container()["ports"]}
    target = DOCUMENTS["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_probes_and_metrics_point_at_routes_the_app_serves() -> None:
    routes = set(create_app(Settings()).openapi()["paths"])
    container = _container()
    probed = {container[probe]["httpGet"]["path"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")}
    scraped = {endpoint["path"] for endpoint in DOCUMENTS["ServiceMonitor"]["spec"]["endpoints"]}
    assert probed | scraped <= routes
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"  # 503 while loading and draining
    metric = DOCUMENTS["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric in DOCUMENTS["ConfigMap"]["data"]["config.yaml"]
    from app.serving.metrics import ServiceMetrics

    assert metric in {family.name for family in ServiceMetrics().registry.collect()}


def test_the_grace_period_covers_pre_stop_and_the_drain() -> None:
    spec = DOCUMENTS["Deployment"]["spec"]["template"]["spec"]
    container = _container()
    environment = {item["name"]: item.get("value") for item in container["env"]}
    drain = float(environment["TAD_GRACEFUL_SHUTDOWN_S"])
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + AFTER_DRAIN_S
    assert "replicas" not in DOCUMENTS["Deployment"]["spec"]  # the autoscaler's, not reset by each apply
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounted = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert environment["TAD_CACHE_DIR"] in mounted and "/tmp" in mounted


def test_compose_waits_for_the_drain_and_the_shutdown_after_it() -> None:
    tad = yaml.safe_load((K8S.parents[1] / "docker-compose.yml").read_text())["x-tad"]
    drain = float(tad["environment"]["TAD_GRACEFUL_SHUTDOWN_S"])
    assert float(tad["stop_grace_period"].removesuffix("s")) > drain + AFTER_DRAIN_S


def test_the_image_is_tagged_with_the_package_version_everywhere() -> None:
    # A tag a node already holds is not pulled again: "latest" would let a rollout mix builds.
    import tomllib

    repo = K8S.parents[1]
    version = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
    assert _container()["image"] == f"tad-serve:{version}"
    compose = yaml.safe_load((repo / "docker-compose.yml").read_text())
    assert compose["x-tad"]["image"] == f"tad-serve:{version}"
    assert "localhost/tad-serve:$VERSION" in (repo / "scripts" / "build_image.sh").read_text()


def test_the_pods_environment_holds_no_tad_variable_the_service_refuses() -> None:
    """The service refuses a TAD_* variable that sets nothing; Kubernetes adds TAD_SERVE_* ones for the Service
    named tad-serve (service links). They are off here, and passed over where a cluster adds them anyway."""
    from app.settings import unknown_variables

    assert DOCUMENTS["Deployment"]["spec"]["template"]["spec"]["enableServiceLinks"] is False
    environment = {entry["name"]: "set" for entry in _container()["env"]}
    service = DOCUMENTS["Service"]
    prefix = service["metadata"]["name"].upper().replace("-", "_")
    links = {f"{prefix}_SERVICE_HOST": "10.0.0.1", f"{prefix}_PORT": "tcp://10.0.0.1:80"}
    for port in service["spec"]["ports"]:
        number, protocol = port["port"], port.get("protocol", "TCP")
        links[f"{prefix}_SERVICE_PORT"] = links[f"{prefix}_SERVICE_PORT_{port['name'].upper()}"] = str(number)
        for suffix in ("", "_ADDR", "_PORT", "_PROTO"):
            links[f"{prefix}_PORT_{number}_{protocol}{suffix}"] = "set"
    assert prefix.startswith("TAD_")  # else this test checks nothing
    assert unknown_variables(environment) == []
    assert unknown_variables({**environment, **links}) == []
