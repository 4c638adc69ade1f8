"""deploy/ray_serve/: the app's LLMConfig arguments, and the app run for real.

``test_ray_serve_matches_plain_decoding`` (marker ``ray``, CPU) starts a local
Ray head (``ray start --head --block``) and ``serve run`` on
``deploy/ray_serve/config.yaml`` with its args and port replaced: SmolLM2 as
target and draft, SpecExtend on, one CPU replica. A long greedy chat request
must return what plain decoding (no speculation) returns, and the plugin's
worker snapshot must show retrievals. The app is built with an API
key (``VLLM_API_KEY``): the OpenAI routes answer 401 without it or with a
wrong one. Then Serve and Ray are stopped and no process of either may be left.
The Ray run is a job of the background lane (``background.py``, ``_ray_job``),
beside the suite; the reference is ``LLM.chat`` in this process with the same
engine settings (``cpu_engine``; a plain ``vllm serve`` took ~70 s of the lane).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import background
import pytest
import yaml

from benchmarks import prompts as prompt_data
from benchmarks.harness.server import free_port, tail
from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.serving.metrics import SnapshotCollector
from vllm_specextend.serving.snapshots import METRICS_DIR_ENV

REPO = Path(__file__).resolve().parents[2]
RAY_APP = REPO / "deploy" / "ray_serve" / "app.py"
RAY_CONFIG = REPO / "deploy" / "ray_serve" / "config.yaml"
BIN = Path(sys.executable).parent

SPEC_EXTEND = {"min_context": 256, "top_k": 8, "recent_tokens": 128}
NUM_SPEC_TOKENS = 4
MAX_MODEL_LEN = 4096
# The CPU engine settings of the engine tests; the app and the reference get
# exactly these.
ENGINE_KWARGS = {"dtype": "float32", "block_size": 32,
                 "kv_cache_memory_bytes": 1 << 30, "enforce_eager": True, "seed": 0,
                 # vLLM's CPU warm-up runs target and draft over this many
                 # tokens (4096 by default: most of a SmolLM2 engine's start;
                 # 2,048: 33 s, 512: 21 s); the prompt prefills in two chunks.
                 "max_num_batched_tokens": 512}
PROMPT_TOKENS = 1000  # document tokens; the chat template adds a few
MAX_TOKENS = 48
STARTUP_S = 600  # Ray head, Serve and the engine on 2 shared cores
STOP_S = 120
CHILD_EXIT_S = 60
API_KEY = "ray-test-key-" + "k" * 32  # the middleware wants 32 characters or more


def _ray_app():
    spec = importlib.util.spec_from_file_location("ray_serve_app", RAY_APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the app's arguments (no Ray needed) -------------------------------------------


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
    kw = module.llm_config_kwargs(spec_extend='{"top_k": 8}', replicas="3",
                                  engine_kwargs='{"dtype": "float32"}',
                                  accelerator="cpu")
    assert kw["engine_kwargs"]["additional_config"]["spec_extend"] == {"top_k": 8}
    assert kw["engine_kwargs"]["dtype"] == "float32"
    assert kw["deployment_config"]["autoscaling_config"]["max_replicas"] == 3
    assert kw["accelerator_config"] == {"kind": "cpu"}
    assert engine["tensor_parallel_size"] == 1
    kw = module.llm_config_kwargs(tensor_parallel_size="4")
    assert kw["engine_kwargs"]["tensor_parallel_size"] == 4
    assert kw["engine_kwargs"]["pipeline_parallel_size"] == 1
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1 or more"):
        module.llm_config_kwargs(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="must not set"):
        module.llm_config_kwargs(engine_kwargs={"tensor_parallel_size": 2})
    with pytest.raises(ValueError):
        module.llm_config_kwargs(spec_extend={"no_such_key": 1})
    with pytest.raises(ValueError, match="accelerator"):
        module.llm_config_kwargs(accelerator="tpu")
    with pytest.raises(ValueError, match="must not set"):
        module.llm_config_kwargs(engine_kwargs={"speculative_config": {}})
    with pytest.raises(ValueError, match="engine_kwargs must be a JSON object"):
        module.llm_config_kwargs(engine_kwargs="dtype=float32")


def test_ray_app_needs_an_api_key(monkeypatch):
    module = _ray_app()
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(ValueError, match="set VLLM_API_KEY"):
        module.api_key_from_env()
    assert module.api_key_from_env(require_api_key="false") is None
    monkeypatch.setenv("MY_KEY", "s" * 32)
    assert module.api_key_from_env("MY_KEY") == "s" * 32
    monkeypatch.setenv("MY_KEY", "change-me")  # secret.example.yaml's placeholder
    with pytest.raises(ValueError, match="MY_KEY is too short"):
        module.api_key_from_env("MY_KEY")
    with pytest.raises(ValueError, match="true or false"):
        module.api_key_from_env(require_api_key="maybe")


def test_ray_app_with_a_key_guards_the_openai_routes(monkeypatch, request):
    """Built (not run): the ingress's FastAPI app carries the plugin's API-key
    middleware with the key, over Ray's own OpenAI routes. The key is inside
    the built application (the replicas do not read their environment), as
    the app's docstring says."""
    pytest.importorskip("ray.serve.llm")
    # Building starts a local Ray in this process: not while the lane's Ray
    # cluster runs (seen at 3a84dde: the local node timed out starting on the
    # 2 loaded cores). Its outcome is test_ray_serve_matches_plain_decoding's.
    with contextlib.suppress(Exception):
        background.result(request, "ray")
    from vllm_specextend.serving.auth import ApiKeyMiddleware

    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    app = _ray_app().build_app(accelerator="cpu", replicas=1)
    fastapi_app = _asgi_app(app._bound_deployment.func_or_class)
    ours = [m for m in fastapi_app.user_middleware if m.cls is ApiKeyMiddleware]
    assert [m.kwargs for m in ours] == [{"api_key": API_KEY}]
    routes = {r.path for r in fastapi_app.routes}
    assert {"/v1/models", "/v1/completions", "/v1/chat/completions"} <= routes


def _asgi_app(ingress_cls):
    """The FastAPI app ``serve.ingress`` wrapped into the class (Ray 2.58 keeps
    it in a closure of the wrapper's ``__init__``)."""
    for value in vars(ingress_cls).values():
        closure = getattr(value, "__closure__", None) or ()
        for cell in closure:
            content = cell.cell_contents
            if hasattr(content, "user_middleware") and hasattr(content, "routes"):
                return content
    raise AssertionError(f"no FastAPI app found on {ingress_cls}")


def test_ray_config_builds_the_default_app():
    """The committed config passes Serve's schema and builds the production
    LLMConfig (GPU placement, 2 replicas)."""
    schema = pytest.importorskip("ray.serve.schema")
    config = schema.ServeDeploySchema.model_validate(
        yaml.safe_load(RAY_CONFIG.read_text()))
    (app,) = config.applications
    assert app.import_path == "deploy.ray_serve.app:app_builder"
    kw = _ray_app().llm_config_kwargs(**app.args)
    assert "accelerator_config" not in kw
    assert kw["deployment_config"]["autoscaling_config"]["min_replicas"] == 2
    llm = pytest.importorskip("ray.serve.llm")
    config = llm.LLMConfig(**kw)
    assert config.engine_kwargs["additional_config"] == {
        "spec_extend": {"top_k": 32, "retrieve_every": 4}}


# --- the app, run for real -----------------------------------------------------------


def _session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (Ray's actors get their own process
    groups, but stay in the session of the ``ray start`` that spawned them)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != sid:
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
    return pids


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[
            :200].decode(errors="replace")
    return "?"


def _stop_session(proc: subprocess.Popen, sig: int, leftovers: list[str]) -> None:
    """Signal ``proc`` (a session leader), wait, then SIGKILL what is left of its
    session, by pid, and record those processes in ``leftovers``."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_S)
    stuck = []
    if proc.poll() is None:
        stuck = [f"{proc.pid} {_cmdline(proc.pid)} (ignored signal {sig}; its "
                 "threads' stacks are in its log)"]
        # SIGABRT makes Python's faulthandler (PYTHONFAULTHANDLER=1 in its env)
        # write every thread's stack to the log the failure shows.
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    # Its children exit after the leader; give them time on 2 loaded cores.
    deadline = time.monotonic() + CHILD_EXIT_S
    while (pids := _session_pids(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftovers += stuck + [f"{pid} {_cmdline(pid)}" for pid in pids]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:  # not yet reaped, so the pid is still its own
        proc.kill()
    proc.wait()


# A child inherits an ignored SIGINT, and Python then installs no
# KeyboardInterrupt handler: under a shell's background job (`.ci/run &`)
# `serve run` slept through the SIGINT meant to shut it down. So each command
# starts through this shim, which gives SIGINT its default disposition and
# execs the command (the run is a background job, ``background.py``: its
# thread may not set signal handlers of its own).
_SIGINT_DEFAULT = [sys.executable, "-c", "import os, signal, sys; "
                   "signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execv(sys.argv[1], sys.argv[1:])"]


def _popen(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen([*_SIGINT_DEFAULT, *cmd], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


@contextlib.contextmanager
def _ray_head(temp_dir: Path, log: Path, env: dict, leftovers: list[str]):
    """``ray start --head --block`` on free ports; yields the GCS address.

    The agent ports are given, not discovered: the raylet otherwise waits 15 s
    (not configurable in Ray 2.58) for the dashboard agent to write its port
    file, and aborts on a loaded 2-core machine. SIGTERM stops the head and
    every process it started.
    """
    port = free_port()
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--port", str(port),
           "--num-cpus", "4", "--object-store-memory", str(256 << 20),
           "--include-dashboard", "false", "--disable-usage-stats",
           "--temp-dir", str(temp_dir)]
    for flag in ("--dashboard-port", "--dashboard-agent-grpc-port",
                 "--dashboard-agent-listen-port", "--metrics-export-port",
                 "--runtime-env-agent-port", "--ray-client-server-port"):
        cmd += [flag, str(free_port())]
    proc = _popen(cmd, log, env)
    try:
        deadline = time.monotonic() + STARTUP_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start did not start:\n{tail(log)}")
            time.sleep(1)
        yield f"127.0.0.1:{port}"
    finally:
        _stop_session(proc, signal.SIGTERM, leftovers)


@contextlib.contextmanager
def _serve_run(config: Path, address: str, log: Path, env: dict,
               leftovers: list[str]):
    """``serve run CONFIG`` against ``address``; SIGINT (Ctrl-C) makes it call
    ``serve.shutdown()``, which stops the app's replicas and engines."""
    proc = _popen([str(BIN / "serve"), "run", "--address", address, str(config)],
                  log, env)
    try:
        yield proc
    finally:
        _stop_session(proc, signal.SIGINT, leftovers)


def _chat(base: str, model: str | None, text: str, timeout_s: float):
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key=API_KEY, timeout=timeout_s,
                    max_retries=0)
    return client.chat.completions.create(
        model=model or client.models.list().data[0].id,
        messages=[{"role": "user", "content": text}],
        max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})


def _models_status(base: str, key: str | None) -> int:
    """The HTTP status of ``GET /v1/models`` with ``key`` as bearer token."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"{base}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _wait_for_models(base: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the Serve proxy routes ``/v1/models`` (the app was built)."""
    deadline = time.monotonic() + STARTUP_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"serve run exited ({proc.returncode}):\n{tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray Serve app not routed in {STARTUP_S} s:\n"
                               f"{tail(log)}")
        with contextlib.suppress(OSError):
            if _models_status(base, API_KEY) == 200:
                return
        time.sleep(2)


def _document(model: str) -> str:
    """The chat request's text: a long PG-19 document and a question."""
    if not (prompt_data.data_dir() / "pg19").is_dir():
        pytest.skip(f"long-context data not found under {prompt_data.data_dir()}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = prompt_data.long_prompts(tokenizer, [PROMPT_TOKENS])[0]
    return tokenizer.decode(ids) + "\n\nWho wrote the text above?"


def _plain_chat(model: str, text: str):
    """Plain decoding's answer to the chat request: ``LLM.chat`` in this
    process, the app's engine settings, the chat template as the server
    applies it. Returns vLLM's ``RequestOutput``."""
    from cpu_engine import greedy, make_llm, shutdown

    llm = make_llm(model, max_model_len=MAX_MODEL_LEN, **ENGINE_KWARGS)
    try:
        return llm.chat([{"role": "user", "content": text}], greedy(MAX_TOKENS))[0]
    finally:
        shutdown(llm)


def _ray_job(fixture):
    """The Ray Serve app run for real (``background.py``): a Ray head,
    ``serve run`` on the committed config with its args and port replaced,
    the unauthorized probes and one long greedy chat request, the worker's
    snapshot, then Serve and Ray stopped. Returns what the test asserts on;
    a start that fails raises, with the log's tail. Ray is not imported here,
    at the session's start (the test asks for ``ray.serve.llm``)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    model = fixture("smollm2_model")
    text = _document(model)
    tmp_path = fixture("tmp_path_factory").mktemp("ray_serve")
    metrics = tmp_path / "metrics"
    metrics.mkdir(mode=0o700)  # a private one, or the plugin refuses it
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
           "VLLM_LOG_STATS_INTERVAL": "1", METRICS_DIR_ENV: str(metrics),
           # The key the app builder reads (deploy/ray_serve/app.py).
           "VLLM_API_KEY": API_KEY,
           # Serve is shut down before Ray: nothing to drain on SIGTERM (30 s).
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
           # Logs complete up to a kill; a stuck process's stacks on SIGABRT.
           "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
           # `deploy.ray_serve.app` is imported on the cluster, not the driver.
           "PYTHONPATH": os.pathsep.join(
               p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    config = yaml.safe_load(RAY_CONFIG.read_text())
    config["applications"][0]["args"] = {
        "target": model, "draft": model, "model_id": "smollm2",
        "spec_extend": SPEC_EXTEND, "replicas": 1,
        "num_speculative_tokens": NUM_SPEC_TOKENS, "max_model_len": MAX_MODEL_LEN,
        "engine_kwargs": ENGINE_KWARGS, "accelerator": "cpu"}

    def job():
        # Picked when it runs: a port picked at the session's start could be
        # taken by then.
        config["http_options"] = {"host": "127.0.0.1", "port": free_port()}
        config_path = tmp_path / "serve_config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        base = f"http://127.0.0.1:{config['http_options']['port']}"
        serve_log, head_log = tmp_path / "serve_run.log", tmp_path / "ray_head.log"
        # Short: Ray's unix socket paths under it must fit in 107 bytes.
        temp_dir = Path(tempfile.mkdtemp(prefix="ray-"))
        run = {"leftovers": [], "serve_log": serve_log, "text": text}
        try:
            with _ray_head(temp_dir, head_log, env, run["leftovers"]) as address, \
                    _serve_run(config_path, address, serve_log, env,
                               run["leftovers"]) as proc:
                _wait_for_models(base, proc, serve_log)
                run["unauthorized"] = [_models_status(base, None),
                                       _models_status(base, "wrong")]
                try:
                    run["response"] = _chat(base, "smollm2", text, STARTUP_S)
                except Exception as e:
                    raise RuntimeError(f"chat request failed: {e!r}\n"
                                       f"{tail(serve_log)}") from e
                # The worker publishes its snapshot when the last request ends.
                deadline = time.monotonic() + 30
                while (stats := SnapshotCollector(metrics).read())["retrievals"] == 0:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(1)
                run["stats"] = stats
        finally:
            if run["leftovers"]:  # Ray's own logs say what its processes did
                with contextlib.suppress(OSError):
                    shutil.copytree(temp_dir / "session_latest" / "logs",
                                    tmp_path / "ray_logs",
                                    ignore_dangling_symlinks=True)
            shutil.rmtree(temp_dir, ignore_errors=True)
        return run
    return job


BACKGROUND = {"ray": _ray_job}


@pytest.mark.ray
def test_ray_serve_matches_plain_decoding(request):
    """The Ray Serve app drafts through SpecExtend views and answers exactly as
    plain decoding does; Serve and Ray stop without leaving processes. (The
    app runs in the background lane, ``_ray_job``.)"""
    pytest.importorskip("ray.serve.llm")
    try:
        run = background.result(request, "ray")
    except RuntimeError as e:
        pytest.fail(str(e))
    assert not run["leftovers"], (f"processes left after shutdown: {run['leftovers']}\n"
                                  f"{tail(run['serve_log'], 80)}")
    assert run["unauthorized"] == [401, 401], "the OpenAI routes need the API key"
    ray_resp, stats = run["response"], run["stats"]
    assert ray_resp.usage.prompt_tokens > PROMPT_TOKENS
    assert ray_resp.usage.completion_tokens == MAX_TOKENS
    assert stats["retrievals"] > 0 and stats["view_rows"] > 0, stats
    assert 0 < stats["draft_context_tokens"] < stats["full_context_tokens"], stats

    # The request the app answered, decoded plainly.
    plain = _plain_chat(request.getfixturevalue("smollm2_model"), run["text"])
    assert ray_resp.usage.prompt_tokens == len(plain.prompt_token_ids)
    assert ray_resp.choices[0].message.content == plain.outputs[0].text
