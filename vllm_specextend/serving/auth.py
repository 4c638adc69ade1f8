"""An API key on every HTTP path of the server except ``/health`` and ``/metrics``.

vLLM's own key (``--api-key`` or ``VLLM_API_KEY``) guards only paths under
``/v1``, ``/v2`` and ``/inference``. vLLM 0.26 serves more than those: the
SageMaker route ``POST /invocations`` runs completions and chats for anyone
who can reach the port, key or not, and ``/tokenize``, ``/detokenize``,
``/openapi.json`` and ``/docs`` stay open too. Ray Serve LLM (2.58.1) has no
key at all. This middleware turns that around: everything needs
``Authorization: Bearer $VLLM_API_KEY``, except the paths in ``OPEN_PATHS``
(probes and Prometheus) and CORS preflight requests (``OPTIONS``, which
vLLM's check lets through too). The token check itself is vLLM's
(``AuthenticationMiddleware.verify_token``); only the path rule is ours.

- ``vllm serve ... --middleware vllm_specextend.auth.ApiKeyMiddleware`` (the
  Docker image, compose and the Kubernetes Deployment): vLLM adds the class
  with no arguments, so the key comes from ``VLLM_API_KEY``, the variable
  vLLM's own check reads; both checks then want the same key.
- ``deploy/ray_serve/app.py`` adds it to the Ray Serve ingress app with the
  key its builder read (see there where the key travels).

It fails closed. Starlette builds middleware only on the server's first ASGI
event, and uvicorn's lifespan "auto" swallows an error raised then (the server
would start and answer 500 everywhere), so under ``vllm serve`` the key is
checked when the arguments are parsed (``cli``: a usage error naming the
fix); the constructor checks it again for any other host. Pure ASGI
(Starlette only for the 401 body): it runs in front of every route and adds
no routes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from vllm_specextend import compat

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS_ENV = "SPECEXTEND_OPEN_PATHS"
# Kubernetes probes and the compose healthcheck hit /health, Prometheus
# scrapes /metrics; neither sends a key by default.
OPEN_PATHS = ("/health", "/metrics")
# 32 characters: the placeholder of the committed examples is refused, and
# `openssl rand -hex 32` (64 characters) is what deploy/README.md suggests.
MIN_KEY_CHARS = 32


def check_key(key: str | None, source: str = KEY_ENV) -> str:
    """``key`` if it is long enough to guard a server; else ValueError naming
    ``source`` (where the key comes from) and the fix."""
    if not key or len(key) < MIN_KEY_CHARS:
        raise ValueError(
            f"{source} is {'unset' if not key else 'too short'}: the server would "
            f"be open to anyone who reaches it. Set it to a random key of at "
            f"least {MIN_KEY_CHARS} characters: {source}=$(openssl rand -hex 32)")
    return key


def open_paths_from_env() -> tuple[str, ...]:
    """``SPECEXTEND_OPEN_PATHS`` (comma-separated; empty: none), else
    ``OPEN_PATHS``."""
    value = os.environ.get(OPEN_PATHS_ENV)
    if value is None:
        return OPEN_PATHS
    return tuple(p.strip() for p in value.split(",") if p.strip())


class ApiKeyMiddleware(compat.AuthenticationMiddleware):
    """Answer 401 to any request without ``Authorization: Bearer KEY``,
    except ``OPTIONS`` and the open paths (each path and what lies under it)."""

    def __init__(self, app, api_key: str | None = None,
                 open_paths: Iterable[str] | None = None) -> None:
        key = os.environ.get(KEY_ENV) if api_key is None else api_key
        super().__init__(app, tokens=[check_key(key)])
        paths = open_paths_from_env() if open_paths is None else tuple(open_paths)
        bad = [p for p in paths if not p.startswith("/") or p.rstrip("/") == ""]
        if bad:
            raise ValueError(f"open paths must be absolute and not '/': {bad}")
        self.open_paths = tuple(p.rstrip("/") for p in paths)

    def _open(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self.open_paths)

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] not in ("http", "websocket")
                or scope.get("method") == "OPTIONS"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if self._open(path) or self.verify_token(Headers(scope=scope)):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            # Closing before accepting makes the server answer the handshake 403.
            return await send({"type": "websocket.close", "code": 1008})
        response = JSONResponse({"error": "Unauthorized"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return await response(scope, receive, send)
