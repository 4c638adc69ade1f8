"""deploy/auth.py on a small Starlette app (no server, no model), and the
vLLM fact it exists for: vLLM 0.26's own key check guards only some prefixes.
``tests/server/test_api_key.py`` runs it in a real ``vllm serve``."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from deploy.auth import KEY_ENV, MIN_KEY_CHARS, OPEN_PATHS_ENV, ApiKeyMiddleware

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


def test_rejects_bad_open_paths():
    for paths in (["/"], ["health"]):
        with pytest.raises(ValueError, match="open paths"):
            ApiKeyMiddleware(app=None, api_key=KEY, open_paths=paths)


def test_vllm_key_guards_only_these_prefixes():
    """Why the middleware exists: vLLM 0.26's AuthenticationMiddleware checks
    only these prefixes, so /invocations, /tokenize and /openapi.json stay open
    (tests/server/test_api_key.py shows the middleware closing them). When
    this fails, re-check deploy/README.md's "what the key protects"."""
    server_utils = pytest.importorskip("vllm.entrypoints.serve.utils.server_utils")
    assert server_utils.GUARDED_PREFIX == ("/v1", "/v2", "/inference")
