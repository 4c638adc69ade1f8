"""vllm_specextend/serving/auth.py on a small Starlette app (no server, no model), its
parse-time check on ``--middleware``, and the vLLM fact it exists for: vLLM
0.26's own key check guards only some prefixes. ``tests/server/test_serve.py``
runs it in a real ``vllm serve``."""

from __future__ import annotations

import argparse
import importlib

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from vllm_specextend import compat
from vllm_specextend.serving.auth import (
    KEY_ENV,
    MIN_KEY_CHARS,
    OPEN_PATHS_ENV,
    ApiKeyMiddleware,
    check_key,
)
from vllm_specextend.serving.cli import (
    MIDDLEWARE,
    MIDDLEWARE_NAMES,
    add_spec_extend_args,
)

KEY = "0123456789abcdef" * 4


def _ok(request):
    return PlainTextResponse("ok")


async def _ws(websocket):
    await websocket.accept()
    await websocket.send_text("ok")
    await websocket.close()


def _client(monkeypatch, key: str = KEY, open_paths: str | None = None,
            **kw) -> TestClient:
    monkeypatch.setenv(KEY_ENV, key)
    if open_paths is None:
        monkeypatch.delenv(OPEN_PATHS_ENV, raising=False)
    else:
        monkeypatch.setenv(OPEN_PATHS_ENV, open_paths)
    routes = [Route(p, _ok, methods=["GET", "POST", "OPTIONS"]) for p in (
        "/health", "/healthz", "/metrics", "/metrics/", "/v1/models", "/invocations")]
    app = Starlette(routes=[*routes, WebSocketRoute("/v1/realtime", _ws)])
    app.add_middleware(ApiKeyMiddleware)  # as vLLM's --middleware adds it
    return TestClient(app, **kw)


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_key_required_everywhere_but_open_paths(monkeypatch):
    client = _client(monkeypatch)
    for path in ("/v1/models", "/invocations", "/healthz", "/nope"):
        for headers in ({}, _auth("x" * 40), _auth(KEY + "x"), {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}):
            r = client.post(path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.headers["WWW-Authenticate"] == "Bearer"
        assert client.post(path, headers=_auth(KEY)).status_code in (200, 404)
        assert client.post(path, headers={"authorization": f"bearer {KEY}"}
                           ).status_code in (200, 404)
    for path in ("/health", "/metrics", "/metrics/"):
        assert client.get(path).status_code == 200, path
    # CORS preflight carries no key; vLLM's own check lets it through too.
    assert client.options("/v1/models").status_code == 200


def test_root_path_is_stripped(monkeypatch):
    client = _client(monkeypatch, root_path="/api")
    assert client.get("/api/health").status_code == 200
    assert client.get("/api/v1/models").status_code == 401


def test_open_paths_from_env(monkeypatch):
    client = _client(monkeypatch, open_paths="/health")
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=_auth(KEY)).status_code == 200
    assert client.get("/health").status_code == 200
    client = _client(monkeypatch, open_paths="")
    assert client.get("/health").status_code == 401


def test_websocket_needs_the_key(monkeypatch):
    client = _client(monkeypatch)
    with pytest.raises(WebSocketDisconnect) as e, \
            client.websocket_connect("/v1/realtime"):
        pass
    assert e.value.code == 1008
    with client.websocket_connect("/v1/realtime", headers=_auth(KEY)) as ws:
        assert ws.receive_text() == "ok"


@pytest.mark.parametrize("key", ["", "replace-me", "k" * (MIN_KEY_CHARS - 1)])
def test_fails_closed_without_a_real_key(monkeypatch, key):
    """No key, the examples' placeholder or a short key: the app does not start."""
    with pytest.raises(ValueError, match=KEY_ENV), _client(monkeypatch, key) as client:
        client.get("/health")
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match="unset"):
        ApiKeyMiddleware(app=None)


def test_check_key_names_the_source_and_the_fix():
    assert check_key("k" * MIN_KEY_CHARS, "MY_KEY") == "k" * MIN_KEY_CHARS
    for key, why in ((None, "unset"), ("", "unset"), ("k" * 31, "too short")):
        with pytest.raises(ValueError) as e:
            check_key(key, "MY_KEY")
        assert str(e.value).startswith(f"MY_KEY is {why}:"), e.value
        assert "MY_KEY=$(openssl rand -hex 32)" in str(e.value)


def test_is_vllms_token_check_with_our_paths():
    """The token check is vLLM's own (sha256 digests, compare_digest), not a
    copy; its constructor still takes the tokens by that name."""
    assert issubclass(ApiKeyMiddleware, compat.AuthenticationMiddleware)
    assert "verify_token" not in vars(ApiKeyMiddleware)
    middleware = ApiKeyMiddleware(app=None, api_key=KEY)
    assert len(middleware.api_tokens) == 1


def test_rejects_bad_open_paths():
    for paths in (["/"], ["health"]):
        with pytest.raises(ValueError, match="open paths"):
            ApiKeyMiddleware(app=None, api_key=KEY, open_paths=paths)


def test_vllm_key_guards_only_these_prefixes():
    """Why the middleware exists: vLLM 0.26's AuthenticationMiddleware checks
    only these prefixes, so /invocations, /tokenize and /openapi.json stay open
    (tests/server/test_serve.py shows the middleware closing them). When
    this fails, re-check deploy/README.md's "what the key protects"."""
    server_utils = pytest.importorskip("vllm.entrypoints.serve.utils.server_utils")
    assert server_utils.GUARDED_PREFIX == ("/v1", "/v2", "/inference")


# --- the parse-time check of `vllm serve --middleware` ---------------------------


@pytest.mark.parametrize("qualname", MIDDLEWARE_NAMES)
def test_cli_names_this_middleware(qualname):
    module, name = qualname.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is ApiKeyMiddleware


def _parser() -> argparse.ArgumentParser:
    """The two flags of vLLM's serve parser the check touches, in vLLM's order:
    ``--middleware`` (a frontend flag, ``append``) before the engine's."""
    parser = argparse.ArgumentParser(prog="vllm serve", exit_on_error=False)
    parser.add_argument("--middleware", action="append", type=str, default=[])
    parser.add_argument("--additional-config", default=None)
    add_spec_extend_args(parser)
    return parser


@pytest.mark.parametrize("qualname", MIDDLEWARE_NAMES)
@pytest.mark.parametrize("key", [None, "k" * (MIN_KEY_CHARS - 1)])
def test_middleware_flag_needs_the_key_at_parse_time(monkeypatch, key, qualname):
    if key is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, key)
    with pytest.raises(argparse.ArgumentError) as e:
        _parser().parse_args(["--middleware", qualname])
    assert "openssl rand -hex 32" in str(e.value) and KEY_ENV in str(e.value)
    # Other middlewares are none of its business.
    args = _parser().parse_args(["--middleware", "my.Middleware"])
    assert args.middleware == ["my.Middleware"]


def test_middleware_flag_with_the_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    parser = _parser()
    add_spec_extend_args(parser)  # wraps once
    args = parser.parse_args(["--middleware", "my.Middleware",
                              f"--middleware={MIDDLEWARE}"])
    assert args.middleware == ["my.Middleware", MIDDLEWARE]
    checking = [c for c in type(parser._option_string_actions["--middleware"]).__mro__
                if c.__name__ == "KeyCheckingAction"]
    assert len(checking) == 1


def test_vllm_serve_parser_checks_the_key(monkeypatch):
    """vLLM's own serve parser: --middleware exists before EngineArgs adds its
    flags (make_arg_parser), so the plugin's hook finds and wraps it."""
    from vllm_specextend import plugin

    plugin.register()
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(exit_on_error=False))
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(argparse.ArgumentError, match="too short"):
        parser.parse_args(["m", "--middleware", MIDDLEWARE])
    monkeypatch.setenv(KEY_ENV, KEY)
    assert parser.parse_args(["m", "--middleware", MIDDLEWARE]).middleware == [
        MIDDLEWARE]
