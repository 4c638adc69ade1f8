"""deploy/k8s/ and docker/compose.yaml: real schemas, then what the plugin needs.

The Kubernetes manifests are validated, strictly (unknown fields are errors),
against Kubernetes' own OpenAPI schemas for ``K8S_VERSION`` as shipped by
``kubernetes-validate``. The checks after that are ones a schema cannot
express: probes on /health, the GPU limit, the scrape annotations, the Service
selecting the pod, the ``--spec-extend`` JSON accepted by ``SpecExtendConfig``,
the API key taken from the Secret, and least privilege (the image's user, a
read-only root filesystem with writable caches, no capabilities). checkov's
security checks run in ``test_checkov.py``.
The 4-GPU overlay (``deploy/k8s-tp4``) is rendered with ``kubectl
kustomize`` and its objects go through the same schemas.
Nothing is applied to a cluster or started here.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.serving.auth import ApiKeyMiddleware
from vllm_specextend.serving.cli import MIDDLEWARE

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
DOCKER = REPO / "docker"
# The oldest minor release the manifests are checked against; they use only
# stable APIs (apps/v1, v1), so later releases accept them too.
K8S_VERSION = "1.35"

K8S_TP4 = REPO / "deploy" / "k8s-tp4"
YAML_FILES = sorted([*K8S.glob("*.y*ml"), *DOCKER.glob("*.y*ml"), *K8S_TP4.glob("*.y*ml")])
# The objects; kustomization.yaml lists them for `kubectl apply -k`.
K8S_FILES = sorted(p for p in K8S.glob("*.y*ml") if p.name != "kustomization.yaml")


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _k8s_objects() -> list[dict]:
    return [d for p in K8S_FILES for d in _docs(p)]


def _one(kind: str) -> dict:
    found = [o for o in _k8s_objects() if o.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _validate(obj: dict) -> str:
    """Kubernetes' schema for the object's kind; returns the version used."""
    return kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


# --- YAML and the real schemas --------------------------------------------------------


def test_yaml_files_present():
    names = {p.relative_to(REPO).as_posix() for p in YAML_FILES}
    assert {
        "deploy/k8s/configmap.yaml",
        "deploy/k8s/deployment.yaml",
        "deploy/k8s/namespace.yaml",
        "deploy/k8s/networkpolicy.yaml",
        "deploy/k8s/secret.example.yaml",
        "deploy/k8s/service.yaml",
        "docker/compose.yaml",
        "docker/prometheus.yml",
    } <= names


@pytest.mark.parametrize(
    "path", YAML_FILES, ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_yaml_parses(path):
    assert _docs(path), f"{path} has no YAML documents"


@pytest.mark.parametrize(
    "path", K8S_FILES, ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_manifest_matches_kubernetes_schema(path):
    for obj in _docs(path):
        assert _validate(obj) == K8S_VERSION


def test_k8s_kinds():
    assert sorted(o["kind"] for o in _k8s_objects()) == [
        "ConfigMap", "Deployment", "Namespace", "NetworkPolicy", "Secret", "Service"]


def test_objects_live_in_the_namespace():
    name = _one("Namespace")["metadata"]["name"]
    for obj in _k8s_objects():
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == name, obj["kind"]


def test_api_key_comes_from_the_secret():
    env = {e["name"]: e for e in _container(_one("Deployment"))["env"]}
    ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    secret = _one("Secret")
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["stringData"]
    assert not ref.get("optional"), "the pod must not start without a key"
    # vLLM's own check leaves /invocations open: the middleware guards it too.
    args = _container(_one("Deployment"))["args"]
    # The installed package's (vllm_specextend.serving.auth): `vllm serve`
    # checks the key when it parses this flag.
    assert args[args.index("--middleware") + 1] == MIDDLEWARE
    # The example's placeholder would not start a server (fail closed).
    with pytest.raises(ValueError, match="too short"):
        ApiKeyMiddleware(None, api_key=next(iter(secret["stringData"].values())))


def test_least_privilege():
    dep = _one("Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    pod_ctx = pod["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    user = re.search(r"^USER (\d+)$", (DOCKER / "Dockerfile").read_text(), re.M)
    assert user and pod_ctx["runAsUser"] == int(user.group(1)) >= 10000
    container = _container(dep)
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    # A read-only root: vLLM writes only to these (caches, Inductor, snapshots).
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/shm", "/tmp", "/home/vllm/.cache"} <= mounts
    limits, requests = (container["resources"][k] for k in ("limits", "requests"))
    assert {"cpu", "memory", "nvidia.com/gpu"} <= limits.keys() & requests.keys()


def test_checkov_skips_say_why():
    annotations = _one("Deployment")["metadata"]["annotations"]
    skips = {k: v for k, v in annotations.items() if k.startswith("checkov.io/skip")}
    assert skips, "the Deployment declares its checkov skips"
    for value in skips.values():
        assert re.fullmatch(r"CKV2?_\w+=.{20,}", value), value


def _set(obj: dict, path: str, value) -> None:
    """``path`` like ``spec.template.spec.containers.0.name``; ``value`` None
    deletes the key."""
    *parents, last = path.split(".")
    for key in parents:
        obj = obj[int(key)] if isinstance(obj, list) else obj[key]
    if value is None:
        del obj[last]
    else:
        obj[int(last) if isinstance(obj, list) else last] = value


@pytest.mark.parametrize("path, value, message", [
    ("spec.replicas", "one", "is not of type"),
    ("spec.template.spec.containers.0.ports.0.containerPort", "8000",
     "is not of type"),
    ("spec.template.spec.containers.0.readinessProbe.httpGett", {"path": "/"},
     "Additional properties are not allowed"),
    ("spec.template.spec.containers.0.name", None, "'name' is a required property"),
], ids=["wrong-type", "port-as-string", "unknown-field", "missing-required"])
def test_schema_rejects_broken_deployment(path, value, message):
    broken = copy.deepcopy(_one("Deployment"))
    _set(broken, path, value)
    with pytest.raises(kubernetes_validate.ValidationError, match=message):
        _validate(broken)


def test_schema_rejects_unknown_kind():
    obj = {"apiVersion": "v1", "kind": "Deploymnet", "metadata": {"name": "x"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        _validate(obj)


# --- what the schemas cannot express ----------------------------------------------


@pytest.mark.parametrize("probe", ["readinessProbe", "livenessProbe"])
def test_probes_hit_health(probe):
    spec = _container(_one("Deployment"))[probe]
    assert spec["httpGet"] == {"path": "/health", "port": 8000}
    # Model download and loading take minutes: an early probe kills the pod.
    assert spec["initialDelaySeconds"] >= 30


def test_deployment():
    dep = _one("Deployment")
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"][
        "labels"
    ].items()
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    container = _container(dep)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "http", "containerPort": 8000} in container["ports"]
    args = container["args"]
    for flag in ("--speculative-model", "--num-speculative-tokens", "--spec-extend"):
        assert flag in args
    assert args[args.index("--spec-extend") + 1] == "$(SPEC_EXTEND)"
    # $(VAR) in args expands only from the container's own env.
    env = {e["name"]: e for e in container.get("env", [])}
    for var in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert var in env, f"args use $({var}) but env has no {var}"
    ref = env["SPEC_EXTEND"]["valueFrom"]["configMapKeyRef"]
    cm = _one("ConfigMap")
    assert ref["name"] == cm["metadata"]["name"]
    assert ref["key"] == "spec-extend.json"
    for var, e in env.items():
        cm_ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if cm_ref:
            assert cm_ref["key"] in cm["data"], var
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts.get("shm") == "/dev/shm"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    assert "hf-cache" in mounts and "hf-cache" in volumes


def test_service_selects_the_pod():
    svc, dep = _one("Service"), _one("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8000
    container_ports = {p["name"]: p["containerPort"] for p in _container(dep)["ports"]}
    target = port.get("targetPort", port["port"])
    assert container_ports.get(target, target) == 8000


def test_configmap_spec_extend_is_valid():
    text = _one("ConfigMap")["data"]["spec-extend.json"]
    assert json.loads(text)
    SpecExtendConfig.from_json(text)


# --- docker compose -------------------------------------------------------------------


def _resolve_compose_default(value: str) -> str:
    """``${VAR:-default}`` -> default (VAR unset), nested braces allowed."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("${", i):
            depth, j = 1, i + 2
            while depth:
                depth += {"{": 1, "}": -1}.get(value[j], 0)
                j += 1
            body = value[i + 2 : j - 1]
            out.append(body.split(":-", 1)[1] if ":-" in body else "")
            i = j
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def test_compose():
    compose = _docs(DOCKER / "compose.yaml")[0]
    vllm = compose["services"]["vllm"]
    cmd = vllm["command"]
    assert "--spec-extend" in cmd and "--speculative-model" in cmd
    assert "--num-speculative-tokens" in cmd
    resolved = [_resolve_compose_default(c) for c in cmd]
    assert resolved[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert resolved[cmd.index("--speculative-model") + 1] == (
        "meta-llama/Llama-3.2-1B-Instruct"
    )
    SpecExtendConfig.from_json(resolved[cmd.index("--spec-extend") + 1])
    assert vllm["build"]["dockerfile"] == "docker/Dockerfile"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["count"] == 1
    assert any(str(p).endswith(":8000") for p in vllm["ports"])
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    assert any(v.endswith(":/home/vllm/.cache/huggingface") for v in vllm["volumes"])
    # The key is required: compose stops when it is unset or empty.
    assert vllm["environment"]["VLLM_API_KEY"].startswith("${VLLM_API_KEY:?")
    assert cmd[cmd.index("--middleware") + 1] == MIDDLEWARE
    assert vllm["read_only"] is True and vllm["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in vllm["security_opt"]
    assert "ipc" not in vllm, "shared memory via shm_size, not the host's IPC"
    assert any(t.startswith("/tmp:") for t in vllm["tmpfs"])
    example = (DOCKER / "env.example").read_text()
    assert re.search(r"^VLLM_API_KEY=$", example, re.M), "no key in the example"
    assert "docker/.env" in (REPO / ".gitignore").read_text().split()
    assert "docker/.env" in (REPO / ".dockerignore").read_text().split()
    prom = compose["services"]["prometheus"]
    assert any("prometheus.yml" in v for v in prom["volumes"])
    scrape = _docs(DOCKER / "prometheus.yml")[0]["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["static_configs"][0]["targets"] == ["vllm:8000"]


# --- the kustomize base and the 4-GPU overlay --------------------------------------------


def test_kustomize_base_lists_every_manifest_but_the_example_secret():
    (kustomization,) = _docs(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in K8S_FILES if p.name != "secret.example.yaml")


def _render(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its kustomize) is not installed here")
    out = subprocess.run([kubectl, "kustomize", str(directory)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def test_tp4_overlay_runs_one_pod_on_four_gpus():
    objects = _render(K8S_TP4)
    for obj in objects:
        assert _validate(obj) == K8S_VERSION
    base = [o for o in _k8s_objects() if o["kind"] != "Secret"]
    assert sorted(o["kind"] for o in objects) == sorted(o["kind"] for o in base)
    (dep,) = [o for o in objects if o["kind"] == "Deployment"]
    container = _container(dep)
    for bound in ("requests", "limits"):
        assert container["resources"][bound]["nvidia.com/gpu"] == 4
    # The base's arguments, then the tensor-parallel size.
    base_args = _container(_one("Deployment"))["args"]
    assert container["args"] == [*base_args, "--tensor-parallel-size", "4"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert container["securityContext"] == _container(_one("Deployment"))["securityContext"]
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert cm["data"]["target-model"].endswith("Llama-3.1-70B-Instruct")
    SpecExtendConfig.from_json(cm["data"]["spec-extend.json"])
