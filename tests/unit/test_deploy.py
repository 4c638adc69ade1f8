"""docker/ and deploy/: the manifests parse and say what the plugin needs.

No Docker engine, cluster or Ray here: these are static checks. The
Dockerfile's FROM tag is checked against SUPPORTED_VLLM in test_compat.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import jsonschema
import pytest

yaml = pytest.importorskip("yaml")

from vllm_specextend.config import SpecExtendConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
DOCKER = REPO / "docker"
RAY_APP = REPO / "deploy" / "ray_serve" / "app.py"

YAML_FILES = sorted(
    [*K8S.glob("*.yaml"), *K8S.glob("*.yml"), *DOCKER.glob("*.yaml"),
     *DOCKER.glob("*.yml")]
)


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _k8s_objects() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.y*ml")) for d in _docs(p)]


def _one(kind: str) -> dict:
    found = [o for o in _k8s_objects() if o.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# --- minimal schemas ----------------------------------------------------------------

OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata"],
    "properties": {
        "apiVersion": {"type": "string", "minLength": 1},
        "kind": {"type": "string", "minLength": 1},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
    },
}

HTTP_HEALTH_PROBE = {
    "type": "object",
    "required": ["httpGet"],
    "properties": {
        "httpGet": {
            "type": "object",
            "required": ["path", "port"],
            "properties": {"path": {"const": "/health"}, "port": {"const": 8000}},
        },
        "initialDelaySeconds": {"type": "integer", "minimum": 30},
    },
}

CONTAINER = {
    "type": "object",
    "required": ["image", "args", "readinessProbe", "livenessProbe", "resources"],
    "properties": {
        "image": {"type": "string", "minLength": 1},
        "args": {
            "type": "array",
            "items": {"type": "string"},
            "allOf": [
                {"contains": {"const": "--spec-extend"}},
                {"contains": {"const": "--speculative-model"}},
                {"contains": {"const": "--num-speculative-tokens"}},
            ],
        },
        "readinessProbe": HTTP_HEALTH_PROBE,
        "livenessProbe": HTTP_HEALTH_PROBE,
        "resources": {
            "type": "object",
            "required": ["limits"],
            "properties": {
                "limits": {"type": "object", "required": ["nvidia.com/gpu"]}
            },
        },
    },
}

DEPLOYMENT = {
    "allOf": [OBJECT],
    "properties": {
        "apiVersion": {"const": "apps/v1"},
        "spec": {
            "type": "object",
            "required": ["replicas", "selector", "template"],
            "properties": {
                "replicas": {"const": 1},
                "template": {
                    "type": "object",
                    "required": ["metadata", "spec"],
                    "properties": {
                        "metadata": {
                            "type": "object",
                            "required": ["labels", "annotations"],
                            "properties": {
                                "annotations": {
                                    "type": "object",
                                    "required": ["prometheus.io/scrape"],
                                    "properties": {
                                        "prometheus.io/scrape": {"const": "true"},
                                        "prometheus.io/port": {"const": "8000"},
                                        "prometheus.io/path": {"const": "/metrics"},
                                    },
                                },
                            },
                        },
                        "spec": {
                            "type": "object",
                            "required": ["containers"],
                            "properties": {
                                "containers": {
                                    "type": "array",
                                    "minItems": 1,
                                    "prefixItems": [CONTAINER],
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "required": ["spec"],
}

SERVICE = {
    "allOf": [OBJECT],
    "required": ["spec"],
    "properties": {
        "apiVersion": {"const": "v1"},
        "spec": {
            "type": "object",
            "required": ["selector", "ports"],
            "properties": {
                "type": {"const": "ClusterIP"},
                "ports": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "properties": {"port": {"const": 8000}},
                    },
                },
            },
        },
    },
}

CONFIGMAP = {
    "allOf": [OBJECT],
    "required": ["data"],
    "properties": {
        "apiVersion": {"const": "v1"},
        "data": {
            "type": "object",
            "required": ["spec-extend.json"],
            "additionalProperties": {"type": "string"},
        },
    },
}


def _validate(obj: dict, schema: dict) -> None:
    jsonschema.Draft202012Validator(schema).validate(obj)


def test_schema_check_rejects_bad_deployment():
    bad = json.loads(json.dumps(_one("Deployment")))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"][
        "path"
    ] = "/"
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad, DEPLOYMENT)
    del bad["metadata"]["name"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad, OBJECT)


# --- YAML ---------------------------------------------------------------------------


def test_yaml_files_present():
    names = {p.relative_to(REPO).as_posix() for p in YAML_FILES}
    assert {
        "deploy/k8s/configmap.yaml",
        "deploy/k8s/deployment.yaml",
        "deploy/k8s/service.yaml",
        "docker/compose.yaml",
        "docker/prometheus.yml",
    } <= names


@pytest.mark.parametrize(
    "path", YAML_FILES, ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_yaml_parses(path):
    assert _docs(path), f"{path} has no YAML documents"


def test_k8s_objects_have_identity():
    objs = _k8s_objects()
    assert {o["kind"] for o in objs} == {"ConfigMap", "Deployment", "Service"}
    for obj in objs:
        _validate(obj, OBJECT)


def test_deployment():
    dep = _one("Deployment")
    _validate(dep, DEPLOYMENT)
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"][
        "labels"
    ].items()
    container = pod["spec"]["containers"][0]
    args = container["args"]
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


def test_service_matches_deployment():
    svc, dep = _one("Service"), _one("Deployment")
    _validate(svc, SERVICE)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    port = svc["spec"]["ports"][0]
    assert port.get("targetPort", port["port"]) in (8000, "http")


def test_configmap_spec_extend_is_valid():
    cm = _one("ConfigMap")
    _validate(cm, CONFIGMAP)
    text = cm["data"]["spec-extend.json"]
    SpecExtendConfig.from_json(text)
    assert json.loads(text)


# --- docker -------------------------------------------------------------------------


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
    assert any("/root/.cache/huggingface" in v for v in vllm["volumes"])
    prom = compose["services"]["prometheus"]
    assert any("prometheus.yml" in v for v in prom["volumes"])
    scrape = _docs(DOCKER / "prometheus.yml")[0]["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["static_configs"][0]["targets"] == ["vllm:8000"]


def test_dockerfile_installs_plugin():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^RUN .*pip install .*--no-deps \.", text, flags=re.M)
    assert re.search(r"^HEALTHCHECK .*", text, flags=re.M)
    assert "/health" in text
    for src in ("pyproject.toml", "README.md", "vllm_specextend/"):
        assert re.search(rf"^COPY .*{re.escape(src)}", text, flags=re.M), src
    # The base image's entrypoint (`vllm serve`) is kept.
    assert not re.search(r"^(ENTRYPOINT|CMD)\b", text, flags=re.M)
    ignore = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".gpu", ".git", "benchmarks/results"} <= set(ignore)


# --- Ray Serve ----------------------------------------------------------------------


def _ray_app():
    spec = importlib.util.spec_from_file_location("ray_serve_app", RAY_APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ray_app_imports_ray_lazily():
    tree = ast.parse(RAY_APP.read_text(), filename=str(RAY_APP))
    for node in tree.body:  # module level only
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "ray" for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "ray"
    module = _ray_app()
    assert callable(module.build_app) and callable(module.app_builder)


def test_ray_app_llm_config_kwargs():
    module = _ray_app()
    kw = module.llm_config_kwargs()
    assert set(kw) == {"model_loading_config", "engine_kwargs", "deployment_config"}
    engine = kw["engine_kwargs"]
    assert engine["speculative_config"] == {
        "method": "draft_model",
        "model": module.DEFAULT_DRAFT,
        "num_speculative_tokens": 4,
    }
    spec_extend = engine["additional_config"]["spec_extend"]
    SpecExtendConfig.from_dict(spec_extend)
    auto = kw["deployment_config"]["autoscaling_config"]
    assert auto["min_replicas"] == auto["max_replicas"] == 2
    assert kw["model_loading_config"]["model_source"] == module.DEFAULT_TARGET
    # String arguments, as `serve run ... key=value` passes them.
    kw = module.llm_config_kwargs(spec_extend='{"top_k": 8}', replicas="3")
    assert kw["engine_kwargs"]["additional_config"]["spec_extend"] == {"top_k": 8}
    assert kw["deployment_config"]["autoscaling_config"]["max_replicas"] == 3
    with pytest.raises(ValueError):
        module.llm_config_kwargs(spec_extend={"no_such_key": 1})
